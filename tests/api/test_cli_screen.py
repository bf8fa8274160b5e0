"""`vfl screen` (simulation from files) and `vfl simulate --min-iv` with click's CliRunner (issue 33)."""
from __future__ import annotations

import json
import stat

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from cli import main


def _tables(tmp_path, n=300, labels=None):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 3))
    y = (rng.random(n) < 1 / (1 + np.exp(-2 * x[:, 0]))).astype(int) if labels is None else labels
    pd.DataFrame({"id": np.arange(n), "y": y, "a0": x[:, 2]}).to_csv(tmp_path / "bank.csv", index=False)
    pd.DataFrame({"id": np.arange(n), "t0": x[:, 0], "t1": x[:, 1]}).to_csv(tmp_path / "telco.csv", index=False)


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.slow      # matplotlib's import and a figure: seconds
def test_screen_writes_csv_json_and_the_chart(tmp_path):
    _tables(tmp_path)
    out = tmp_path / "out"
    r = _run("screen", "--active", tmp_path / "bank.csv", "--passive", tmp_path / "telco.csv", "--mode", "plain",
             "--monotone", "--min-share", 0.05, "--min-iv", 0.1, "--out-dir", out)
    assert r.exit_code == 0, r.output
    assert "screened 3 features over 300 aligned rows" in r.output and "passive1:t0: IV" in r.output
    assert "kept" in r.output and "dropped" in r.output
    feats = pd.read_csv(out / "screening.csv")
    assert list(feats["feature"]) == ["a0", "t0", "t1"] and feats.loc[1, "iv"] > 0.3
    bins = pd.read_csv(out / "screening_bins.csv")
    assert {"rows", "events", "woe", "iv"} <= set(bins.columns)
    assert bins.groupby("feature")["rows"].sum().eq(300).all()
    doc = json.loads((out / "screening.json").read_text())
    assert doc["format"] == "vfl-boost-screening" and doc["n_rows"] == 300
    assert (out / "screening_iv.png").read_bytes()[:4] == b"\x89PNG"
    assert stat.S_IMODE((out / "screening.json").stat().st_mode) == 0o600


def test_screen_refuses_a_multiclass_label_and_bad_usage_clearly(tmp_path):
    _tables(tmp_path, labels=np.arange(300) % 3)
    r = CliRunner().invoke(main, ["screen", "--active", str(tmp_path / "bank.csv"), "--passive",
                                  str(tmp_path / "telco.csv"), "--mode", "plain"])
    assert r.exit_code == 1 and "defined for binary targets only" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["screen", "--mode", "plain"])
    assert r.exit_code == 2 and "either the simulation's tables" in r.output
    r = CliRunner().invoke(main, ["screen", "--dataset", "breast_cancer", "--mode", "dp"])
    assert r.exit_code == 1 and "--dp-epsilon" in r.output


def test_simulate_min_iv_drops_the_weak_features(tmp_path):
    _tables(tmp_path)
    out = tmp_path / "r.json"
    r = _run("simulate", "--active", tmp_path / "bank.csv", "--passive", tmp_path / "telco.csv", "--mode", "plain",
             "--rounds", 2, "--quiet", "--min-iv", 0.8, "--output-json", out, "--save-model", tmp_path / "m")
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["params"]["min_iv"] == 0.8
    assert doc["min_iv"]["kept"] == {"active": [], "passive1": [0]} and doc["min_iv"]["iv"]["passive1"]["#0"] > 0.8
    files = {p.name: json.loads(p.read_text()) for p in (tmp_path / "m").glob("*.json")}
    passive = next(d for d in files.values() if d.get("role") == "passive")
    assert passive["features"] == ["t0"]
