"""Draw docs/explanations/summary.png (the summary plot of the Explanations page) and print the
reason-code example's table.

    python docs/explanations/make_figure.py

Runs after ``pip install '.[plot]'``: breast_cancer (bundled with scikit-learn) in three parties,
a plain-mode model, the held-out rows explained.
"""
from pathlib import Path

from datasets import breast_cancer_parties, train_test_split_parties
from vfl.api import Federation, federation_from_frames
from vfl.core.explain import summary_plot

HERE = Path(__file__).resolve().parent


def main():
    train, test = train_test_split_parties(breast_cancer_parties(3), test_size=0.3, seed=0)
    fed: Federation = federation_from_frames(train)
    fed.fit(mode="plain", n_estimators=30, max_depth=4)
    frames = {pf.name: pf.frame for pf in test}
    frames["active"] = frames["active"].drop(columns="y")
    ids, ex = fed.explanation(frames)
    summary_plot(ex, HERE / "summary.png", max_players=12,
                 title=f"breast_cancer, {ex.n_rows} held-out rows: players by mean |attribution|")
    table = fed.explain(frames, top=3)
    print(table.head(3).round(3).to_string(index=False))
    print(ex.mean_abs())


if __name__ == "__main__":
    main()
