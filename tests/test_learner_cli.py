"""`vfl simulate` with --objective, --validation-size, --early-stopping-rounds, --subsample, --goss."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return CliRunner().invoke(main, ["simulate", "--quiet", *args], catch_exceptions=False)


def csv_pair(tmp_path, y, X, label_col="y"):
    ids = np.arange(len(y))
    g = pd.DataFrame({"id": ids, label_col: y, **{f"g{i}": X[:, i] for i in range(2)}})
    h = pd.DataFrame({"id": ids, **{f"h{i}": X[:, i] for i in range(2, X.shape[1])}})
    gp, hp = tmp_path / "guest.csv", tmp_path / "host.csv"
    g.to_csv(gp, index=False)
    h.to_csv(hp, index=False)
    return str(gp), str(hp)


def test_binary_json_reports_auc_accuracy_and_logloss(tmp_path):
    out = tmp_path / "r.json"
    res = run("--mode", "plain", "--trees", "3", "--output-json", str(out))
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["objective"] == "binary" and r["test_auc"] > 0.9 and r["test_accuracy"] > 0.85
    assert r["test_logloss"] > 0 and r["test_rmse"] is None and r["n_validation"] == 0
    assert "test accuracy:" in res.output


def test_multiclass_on_vehicle_by_default_objective(shared_dir, tmp_path):
    out, pred = tmp_path / "r.json", tmp_path / "p.csv"
    res = run("--dataset", "vehicle", "--mode", "plain", "--trees", "5", "--output-json", str(out),
              "--predictions", str(pred))
    assert res.exit_code == 0, res.output
    assert "objective multiclass" in res.output and "test accuracy:" in res.output
    r = json.loads(out.read_text())
    assert r["test_accuracy"] > 0.5 and r["test_logloss"] > 0 and r["test_auc"] is None
    assert r["classes"] == [0, 1, 2, 3] and r["n_trees"] == 5 * 4
    p = pd.read_csv(pred)
    assert list(p.columns) == ["id", "prediction", "proba_0", "proba_1", "proba_2", "proba_3"]
    assert np.allclose(p.filter(like="proba_").sum(axis=1), 1)


def test_regression_from_csv_with_predictions(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4))
    y = 3 * X[:, 0] + 2 * X[:, 3] + 0.1 * rng.normal(size=200)
    g, h = csv_pair(tmp_path, y, X)
    out, pred = tmp_path / "r.json", tmp_path / "p.csv"
    res = run("--guest", g, "--host", h, "--objective", "regression", "--mode", "plain", "--trees", "20",
              "--output-json", str(out), "--predictions", str(pred))
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["test_rmse"] < 0.5 * y.std() and r["test_mae"] < r["test_rmse"] and r["test_accuracy"] is None
    assert "test RMSE:" in res.output
    assert list(pd.read_csv(pred).columns) == ["id", "prediction"]


def test_string_labels_mapping_is_reported(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(150, 4))
    y = np.array(["bus", "car", "van"])[(X[:, 0] > 0).astype(int) + (X[:, 2] > 0.5).astype(int)]
    g, h = csv_pair(tmp_path, y, X)
    pred = tmp_path / "p.csv"
    res = run("--guest", g, "--host", h, "--objective", "multiclass", "--mode", "plain", "--trees", "4",
              "--predictions", str(pred))
    assert res.exit_code == 0, res.output
    assert "classes: 0 = 'bus', 1 = 'car', 2 = 'van'" in res.output
    p = pd.read_csv(pred)
    assert set(p["prediction"]) <= {"bus", "car", "van"} and "proba_van" in p.columns
    res = run("--guest", g, "--host", h, "--mode", "plain", "--trees", "1")      # binary: a clear error
    assert res.exit_code != 0 and "label column 'y'" in res.output and "not numeric" in res.output
    assert "Traceback" not in res.output


def test_validation_and_early_stopping(tmp_path):
    out = tmp_path / "r.json"
    res = run("--mode", "plain", "--trees", "60", "--learning-rate", "1.0", "--depth", "6",
              "--min-child-weight", "0", "--validation-size", "0.25", "--early-stopping-rounds", "2",
              "--output-json", str(out))
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    hist = r["history"]["validation"]["logloss"]
    assert r["n_validation"] > 0 and r["best_iteration"] == int(np.argmin(hist))
    assert r["n_rounds"] == r["best_iteration"] + 3 < 60
    assert f"best iteration {r['best_iteration'] + 1}" in res.output


@pytest.mark.parametrize("flags", [["--goss"], ["--subsample", "0.5"]])
def test_sampling_flags(tmp_path, flags):
    out = tmp_path / "r.json"
    res = run("--mode", "plain", "--trees", "5", "--output-json", str(out), *flags)
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["params"]["goss"] == ("--goss" in flags) and r["test_auc"] > 0.9


@pytest.mark.parametrize("flags, message", [
    (["--subsample", "0"], "parameter subsample must be > 0"),
    (["--early-stopping-rounds", "3"], "--early-stopping-rounds needs --validation-size"),
    (["--goss", "--subsample", "0.5"], "cannot be combined"),
    (["--eval-metric", "rmse"], "eval_metric 'rmse' does not fit objective 'binary'"),
    (["--objective", "multiclass", "--validation-size", "0.2", "--eval-metric", "auc"], "does not fit"),
])
def test_bad_flags_are_clear_errors(flags, message):
    res = run("--mode", "plain", "--trees", "2", *flags)
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output


def test_he_multiclass_subprocess(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 4))
    y = (X[:, 0] > 0).astype(int) + (X[:, 2] > 0.5).astype(int)
    g, h = csv_pair(tmp_path, y, X)
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "cli", "simulate", "--quiet", "--guest", g, "--host", h,
                           "--objective", "multiclass", "--key-bits", "1024", "--trees", "2", "--depth", "2",
                           "--output-json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["mode"] == "he" and r["objective"] == "multiclass" and r["test_accuracy"] is not None
