"""`vfl simulate` in-process with click's CliRunner."""
import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from cli import main
from datasets import breast_cancer_parties, train_test_split_parties
from vfl.api import Federation


def _run(args):
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    return result


def test_simulate_plain_writes_json_predictions_and_models(tmp_path):
    out, preds, models = tmp_path / "r.json", tmp_path / "p.csv", tmp_path / "models"
    res = _run(["simulate", "--mode", "plain", "--rounds", "4", "--quiet", "--output-json", str(out),
                "--predictions", str(preds), "--save-model", str(models)])
    assert res.exit_code == 0, res.output
    assert "test AUC" in res.output and "bytes active->passive1" in res.output
    summary = json.loads(out.read_text())
    for key in ("mode", "n_train", "n_test", "train_seconds", "test_auc", "bytes_sent"):
        assert key in summary
    assert summary["mode"] == "plain" and summary["n_train"] + summary["n_test"] == 569
    assert summary["test_auc"] > 0.95
    assert set(summary["bytes_sent"]) == {"active->passive1", "passive1->active"}
    p = pd.read_csv(preds)
    assert list(p.columns) == ["id", "proba"] and len(p) == summary["n_test"]
    assert p["proba"].between(0, 1).all()
    # saved models load back through the Python API and give identical predictions
    fed = Federation.load(models)
    _, test = train_test_split_parties(breast_cancer_parties(2), test_size=0.2, seed=0)
    again = fed.predict_proba({pf.name: pf.frame for pf in test})
    assert np.array_equal(np.round(again, 12), np.round(p["proba"].to_numpy(), 12)) or \
        np.allclose(again, p["proba"].to_numpy(), rtol=0, atol=1e-15)


@pytest.mark.slow
def test_simulate_he_with_active_and_two_passive_files(tmp_path):
    parts = breast_cancer_parties(3)
    paths = []
    for pf in parts:
        path = tmp_path / f"{pf.name}.csv"
        pf.frame.to_csv(path, index=False)
        paths.append(str(path))
    out = tmp_path / "r.json"
    res = _run(["simulate", "--active", paths[0], "--passive", paths[1], "--passive", paths[2], "--mode", "he",
                "--key-bits", "1024", "--rounds", "2", "--depth", "3", "--quiet", "--verbose",
                "--output-json", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads(out.read_text())
    assert summary["mode"] == "he" and summary["test_auc"] > 0.9
    assert set(summary["bytes_sent"]) == {"active->passive1", "passive1->active",
                                          "active->passive2", "passive2->active"}
    assert "warning: 1024-bit" in res.output            # weak key is announced
    assert "crypto: encrypt" in res.output and "round 1:" in res.output


def test_simulate_he_with_okamoto_uchiyama(tmp_path):
    out = tmp_path / "r.json"
    res = _run(["simulate", "--mode", "he", "--scheme", "ou", "--key-bits", "1024", "--rounds", "2", "--depth", "2",
                "--quiet", "--output-json", str(out)])
    assert res.exit_code == 0, res.output
    assert "1024-bit Okamoto-Uchiyama" in res.output and "warning: 1024-bit OU keys" in res.output
    summary = json.loads(out.read_text())
    assert summary["mode"] == "he" and summary["params"]["scheme"] == "ou" and summary["test_auc"] > 0.9
    bad = _run(["simulate", "--mode", "he", "--scheme", "rsa"])
    assert bad.exit_code != 0 and "'rsa' is not one of 'paillier', 'ou'" in bad.output


def test_simulate_parties_option_splits_bundled_data_three_ways(tmp_path):
    res = _run(["simulate", "--mode", "plain", "--parties", "3", "--rounds", "2", "--quiet"])
    assert res.exit_code == 0, res.output
    assert "passive2 (10 features)" in res.output
