"""Explanations from the face (issue 32): the estimators' explain, `vfl explain` in one process,
`vfl compare`'s global view."""
import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from support import small_frames

from cli import main
from vfl.compare import CompareConfig, run_comparison
from vfl.estimators import VerticalBoostingClassifier, VerticalBoostingRegressor

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _parts(n=150):
    a, b, c = small_frames(n=n, seed=4)
    y = a.pop("y").to_numpy()
    return {"bank": a, "bureau": b, "telco": c}, y


def test_classifier_explain_adds_up_to_decision_function_with_reason_codes():
    parts, y = _parts()
    clf = VerticalBoostingClassifier(n_estimators=4, max_depth=3, mode="plain").fit(parts, y)
    table = clf.explain(parts, top=2)
    assert list(table.columns[:7]) == ["id", "base", "a0", "a1", "bureau", "telco", "margin"]
    np.testing.assert_allclose(table["margin"], clf.decision_function(parts), rtol=0, atol=0)
    values = table[["a0", "a1", "bureau", "telco"]].to_numpy()
    np.testing.assert_allclose(table["base"] + values.sum(axis=1), table["margin"], rtol=0, atol=1e-9)
    assert table["reason_1"].isin(["a0", "a1", "bureau", "telco"]).any()


def test_table_estimator_and_regressor_explain_by_row_position():
    parts, y = _parts()
    X = pd.concat([parts["bank"].drop(columns="id"), parts["bureau"].drop(columns="id")], axis=1)
    reg = VerticalBoostingRegressor(n_estimators=3, max_depth=2, mode="plain").fit(X.to_numpy(), y * 2.0 + 1)
    table = reg.explain(X.to_numpy(), top=1, adverse="low")
    assert "id" not in table.columns and table.index.tolist() == list(range(len(X)))
    np.testing.assert_allclose(table["margin"], reg.predict(X.to_numpy()), rtol=0, atol=1e-12)
    assert (table["reason_1_value"].dropna() < 0).all()
    multi = VerticalBoostingClassifier(n_estimators=2, max_depth=2, mode="plain").fit(parts, np.digitize(
        parts["bank"]["a0"], [-0.5, 0.5]))
    t = multi.explain(parts)
    assert len(t) == 3 * len(y) and t["class"].tolist()[:3] == [0, 1, 2]


@pytest.mark.slow
def test_cli_explain_in_one_process_writes_table_json_and_plot(tmp_path):
    parts, y = _parts(200)
    bank = parts["bank"].assign(y=y)
    bank.to_csv(tmp_path / "bank.csv", index=False)
    parts["bureau"].to_csv(tmp_path / "bureau.csv", index=False)
    r = CliRunner().invoke(main, ["simulate", "--active", str(tmp_path / "bank.csv"), "--passive",
                                  str(tmp_path / "bureau.csv"), "--mode", "plain", "--rounds", "3", "--depth", "3",
                                  "--save-model", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    args = ["explain", "--model-dir", str(tmp_path / "m"), "--party", f"active={tmp_path / 'bank.csv'}",
            "--party", f"passive1={tmp_path / 'bureau.csv'}", "--out", str(tmp_path / "ex.csv"), "--top", "2",
            "--plot", str(tmp_path / "p.png"), "--output-json", str(tmp_path / "s.json"), "--batch-rows", "64"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    table = pd.read_csv(tmp_path / "ex.csv")
    assert len(table) == 200 and table["id"].tolist() == bank["id"].tolist()
    assert list(table.columns[:6]) == ["id", "base", "a0", "a1", "passive1", "margin"]
    np.testing.assert_allclose(table["base"] + table[["a0", "a1", "passive1"]].sum(axis=1), table["margin"],
                               atol=1e-9)
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["n_rows"] == 200 and set(summary["mean_abs"]["margin"]) == {"a0", "a1", "passive1"}
    assert (tmp_path / "p.png").read_bytes().startswith(PNG_MAGIC)
    # misuse: a clear error, no traceback
    r = CliRunner().invoke(main, args[:3] + ["--party", "active", "--out", str(tmp_path / "x.csv")])
    assert r.exit_code != 0 and "NAME=PATH" in r.output
    r = CliRunner().invoke(main, ["explain", "--model-dir", str(tmp_path / "m"), "--out", str(tmp_path / "x.csv")])
    assert r.exit_code != 0 and "--party NAME=PATH" in r.output
    r = CliRunner().invoke(main, args + ["--plot-class", "1"])
    assert r.exit_code == 1 and "--plot-class is for a multiclass model" in r.output


@pytest.mark.slow
def test_compare_writes_the_global_view_and_the_summary_plot(tmp_path):
    cfg = CompareConfig(datasets=("breast_cancer",), modes=("plain",), seeds=1, n_estimators=2, max_depth=2)
    doc = run_comparison(cfg, tmp_path)
    view = doc["runs"][0]["explanations"]
    assert view["n_rows"] > 100 and set(view["mean_abs"]["margin"]) >= {"passive1"}
    assert max(view["mean_abs"]["margin"].values()) > 0
    assert (tmp_path / "breast_cancer_explanations.png").read_bytes().startswith(PNG_MAGIC)
    assert str(tmp_path / "breast_cancer_explanations.png") in doc["files"]
