"""The credit-scoring example of docs/learner.md against XGBoost and LightGBM with the same settings (issue 15).

default_credit (shared datasets): the passive party's x2 (education, 7 values) and x3 (marital
status, 4 values) categorical, its repayment-status columns x5-x9 monotone increasing in risk,
the minority class (default, y = 1) weighted by n_negative / n_positive. Same split, trees,
depth, learning rate, lambda, bins for all three; the federated model in mode plain by default
(mode he grows the identical trees, so the same metrics, just slower). Prints JSON: test AUC,
weighted AUC, accuracy, log loss, train seconds per learner, and the largest decrease of the
partial dependence along x5-x9 (0: monotone).

    python benchmarks/credit_compare.py [--mode plain|he] [--rounds 30] [--depth 4] [--key-bits 1024]
"""
from __future__ import annotations

import argparse
import json
import time

import _common  # noqa: F401  (puts the repository on sys.path)
import numpy as np
import pandas as pd
from _common import cores, quiet_keys

from datasets import load_shared
from datasets.frames import PartyFrame
from datasets.split import train_test_split_parties
from vfl.api import TrainParams, simulate
from vfl.core import metrics

CATEGORICAL = ("x2", "x3")
MONOTONE = ("x5", "x6", "x7", "x8", "x9")


def _joined(parties):
    g, h = parties
    X = g.frame.set_index(g.id_col)[g.feature_names].add_prefix("g_")
    X = X.join(h.frame.set_index(h.id_col)[h.feature_names].add_prefix("h_"), how="inner")
    y = g.frame.set_index(g.id_col).loc[X.index, g.label_col].to_numpy().astype(float)
    return X, y


def _scores(y, p, w):
    return {"test_auc": round(metrics.auc(y, p), 4),
            "test_weighted_auc": round(metrics.weighted_auc(y, p, w), 4),
            "test_accuracy": round(1.0 - metrics.error(y, p), 4),
            "test_logloss": round(metrics.logloss(y, p), 4)}


def _worst_decrease(predict, X: pd.DataFrame, columns) -> float:
    """Largest drop of a prediction along a dense grid of each monotone column (200 rows)."""
    rows = X.iloc[:200]
    worst = 0.0
    for col in columns:
        grid = np.linspace(X[col].min(), X[col].max(), 60)
        big = rows.loc[rows.index.repeat(len(grid))].copy()
        big[col] = np.tile(grid, len(rows))
        p = predict(big).reshape(len(rows), len(grid))
        worst = max(worst, float(-np.diff(p, axis=1).min()))
    return round(worst, 6)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="plain", choices=("he", "plain"))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--learning-rate", type=float, default=0.3)
    ap.add_argument("--key-bits", type=int, default=1024)
    args = ap.parse_args()
    quiet_keys()
    parties = load_shared("default_credit")
    active, passive = parties
    train, test = train_test_split_parties(parties, test_size=0.2, seed=0)
    y_train = train[0].frame[active.label_col].to_numpy().astype(float)
    ratio = float((y_train == 0).sum() / (y_train == 1).sum())
    weight_of = lambda y: np.where(y == 1, ratio, 1.0)   # noqa: E731
    out = {"benchmark": "credit_compare", "dataset": "default_credit", "mode": args.mode, "n_rounds": args.rounds,
           "depth": args.depth, "learning_rate": args.learning_rate, "minority_weight": round(ratio, 3),
           "cores": cores()}
    common = dict(n_estimators=args.rounds, max_depth=args.depth, learning_rate=args.learning_rate, max_bin=32,
                  reg_lambda=1.0, min_child_weight=1.0)

    # --- federated
    params = TrainParams(mode=args.mode, key_bits=args.key_bits, **common,
                         monotone_constraints={f"{passive.name}:{c}": 1 for c in MONOTONE})
    fed, res, test_ids, proba = simulate(parties_with_weights(parties, weight_of), params, test_size=0.2, seed=0,
                                         categorical=[f"{passive.name}:{c}" for c in CATEGORICAL], weight_col="w")
    seconds = res["train_seconds"]
    y_test = test[0].frame.set_index(active.id_col).loc[test_ids, active.label_col].to_numpy().astype(float)
    w_test = weight_of(y_test)
    Xte, yte = _joined(test)

    def fed_predict(Xg):
        ids = np.arange(len(Xg))
        ga = pd.DataFrame({"id": ids, **{c: Xg[f"g_{c}"].to_numpy() for c in active.feature_names}})
        hb = pd.DataFrame({"id": ids, **{c: Xg[f"h_{c}"].to_numpy() for c in passive.feature_names}})
        return fed.predict_proba({active.name: ga, passive.name: hb})

    out["federated"] = {**_scores(y_test, proba, w_test), "train_seconds": round(seconds, 2),
                        "pd_worst_decrease": _worst_decrease(fed_predict, Xte, [f"h_{c}" for c in MONOTONE])}

    # --- references on the joined data, same split
    Xtr, ytr = _joined(train)
    cats = [f"h_{c}" for c in CATEGORICAL]
    mono = [1 if c in {f"h_{m}" for m in MONOTONE} else 0 for c in Xtr.columns]
    levels = {c: np.array(sorted(Xtr[c].unique())) for c in cats}

    def codes(Xg, as_category):
        Xg = Xg.copy()
        for c in cats:
            k = np.searchsorted(levels[c], Xg[c].to_numpy())
            Xg[c] = pd.Categorical(k, categories=range(len(levels[c]))) if as_category else k
        return Xg

    Xtr_c, Xte_c = codes(Xtr, True), codes(Xte, True)
    try:
        import xgboost as xgb
        t0 = time.perf_counter()
        ref = xgb.XGBClassifier(**common, tree_method="hist", n_jobs=1, base_score=float(np.average(ytr,
                                weights=weight_of(ytr))), enable_categorical=True, max_cat_to_onehot=1,
                                monotone_constraints=tuple(mono)).fit(Xtr_c, ytr, sample_weight=weight_of(ytr))
        sec = time.perf_counter() - t0

        def xgb_predict(Xg):
            return ref.predict_proba(codes(Xg, True))[:, 1]

        out["xgboost"] = {**_scores(yte, ref.predict_proba(Xte_c)[:, 1], weight_of(yte)),
                          "train_seconds": round(sec, 2),
                          "pd_worst_decrease": _worst_decrease(xgb_predict, Xte, [f"h_{c}" for c in MONOTONE])}
    except ImportError:
        out["xgboost"] = None
    try:
        import lightgbm as lgb
        codes_tr, codes_te = codes(Xtr, False), codes(Xte, False)
        t0 = time.perf_counter()
        booster = lgb.train({"objective": "binary", "num_leaves": 2 ** args.depth, "max_depth": args.depth,
                             "learning_rate": args.learning_rate, "lambda_l2": 1.0, "min_sum_hessian_in_leaf": 1.0,
                             "min_data_in_leaf": 1, "max_bin": 32, "monotone_constraints": mono,
                             "verbose": -1, "num_threads": 1},
                            lgb.Dataset(codes_tr, ytr, weight=weight_of(ytr), categorical_feature=cats),
                            num_boost_round=args.rounds)
        sec = time.perf_counter() - t0

        def lgb_predict(Xg):
            return booster.predict(codes(Xg, False))

        out["lightgbm"] = {**_scores(yte, booster.predict(codes_te), weight_of(yte)),
                           "train_seconds": round(sec, 2),
                           "pd_worst_decrease": _worst_decrease(lgb_predict, Xte, [f"h_{c}" for c in MONOTONE])}
    except ImportError:
        out["lightgbm"] = None
    print(json.dumps(out, indent=1))


def parties_with_weights(parties, weight_of):
    g = parties[0]
    frame = g.frame.assign(w=weight_of(g.frame[g.label_col].to_numpy()))
    return [PartyFrame(g.name, frame, g.id_col, g.label_col, g.source), *parties[1:]]


if __name__ == "__main__":
    main()
