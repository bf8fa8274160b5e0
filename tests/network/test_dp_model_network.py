"""`vfl party active --dp-model` over real sockets: passive processes get their sketch budget at setup."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from support import cli_command, start_passive

pytest.importorskip("grpc")

from datasets import breast_cancer_parties, train_test_split_parties  # noqa: E402
from vfl.core.model import BoostedModel  # noqa: E402

pytestmark = pytest.mark.slow   # real party processes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def passives(tmp_path):
    procs = []

    def start(name, data, model_dir, *extra):
        return start_passive(procs, tmp_path, name, "--data", data, "--model-dir", model_dir, *extra)

    try:
        yield start
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
            p.stdout.close()


def test_party_active_dp_model_over_the_network(passives, tmp_path):
    train, test = train_test_split_parties(breast_cancer_parties(2), test_size=0.2, seed=0)
    files = {}
    for tr, te in zip(train, test):
        files[tr.name] = tmp_path / f"{tr.name}.csv"
        (te.frame.drop(columns=[te.label_col]) if te.label_col else te.frame).to_csv(
            tmp_path / f"test_{tr.name}.csv", index=False)
        (tr.frame if tr.label_col else pd.concat([tr.frame, te.frame])).to_csv(files[tr.name], index=False)
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-tests-0123456789\n")
    sec = ["--insecure", "--token-file", token]
    addr = passives("passive1", files["passive1"], tmp_path / "m1", *sec)
    r = subprocess.run(cli_command("party", "active", "--data", files["active"], "--peer", f"passive1={addr}", *sec,
                                   "--model-dir", tmp_path / "ma", "--mode", "plain", "--rounds", 3, "--depth", 2,
                                   "--dp-model", 8, "--dp-trees", "cyclic", "--timeout", 60,
                                   "--output-json", tmp_path / "train.json"),
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "privacy (released model): epsilon 8 per training row" in r.stdout
    summary = json.loads((tmp_path / "train.json").read_text())
    d = summary["dp_model"]
    assert d["epsilon"] == pytest.approx(8.0) and d["sketch"]["epsilon_per_party"] == pytest.approx(0.8 * 0.9 / 2)
    assert not (tmp_path / "ma" / "checkpoint.json").exists()        # a DP training is not resumable
    model = BoostedModel.load(tmp_path / "ma" / "active.json")
    assert model.dp_model == d and all(len(t.leaves()) == 4 for rnd in model.rounds for t in rnd)
    # the passive party's lookup table holds its DP edges; prediction works as for any model
    out = tmp_path / "pred.csv"
    r = subprocess.run(cli_command("predict", "--model-dir", tmp_path / "ma", "--data", tmp_path / "test_active.csv",
                                   "--peer", f"passive1={addr}", *sec, "--out", out),
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pred = pd.read_csv(out)
    assert len(pred) == len(test[0].frame) and pred["proba"].between(0, 1).all()


def test_public_bins_of_each_party_over_the_network(passives, tmp_path):
    """`vfl party passive --dp-bins` (every feature of passive1: it spends nothing) and `vfl party active
    --dp-bins` (one own column): the summary records each party's spend; the reported epsilon drops
    by passive1's unspent share."""
    train, _ = train_test_split_parties(breast_cancer_parties(2), test_size=0.2, seed=0)
    files = {tr.name: tmp_path / f"{tr.name}.csv" for tr in train}
    for tr in train:
        tr.frame.to_csv(files[tr.name], index=False)
    passive = train[1].frame.drop(columns=[train[1].id_col])
    (tmp_path / "passive_bins.json").write_text(json.dumps(
        {c: {"lo": float(passive[c].min()) - 1.0, "hi": float(passive[c].max()) + 1.0} for c in passive.columns}))
    active_col = [c for c in train[0].frame.columns if c not in (train[0].id_col, train[0].label_col)][0]
    (tmp_path / "active_bins.json").write_text(json.dumps({active_col: {"edges": [0.0, 1.0]}}))
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-tests-0123456789\n")
    sec = ["--insecure", "--token-file", token]
    addr = passives("passive1", files["passive1"], tmp_path / "m1", *sec, "--dp-bins", tmp_path / "passive_bins.json")
    r = subprocess.run(cli_command("party", "active", "--data", files["active"], "--peer", f"passive1={addr}", *sec,
                                   "--model-dir", tmp_path / "ma", "--mode", "plain", "--rounds", 2, "--depth", 2,
                                   "--dp-model", 8, "--dp-bins", tmp_path / "active_bins.json", "--timeout", 60,
                                   "--output-json", tmp_path / "train.json"),
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "train.json").read_text())["dp_model"]
    share = d["sketch"]["epsilon_per_party"]
    assert d["sketch"]["per_party"]["passive1"] == {"epsilon": 0.0, "dp_features": 0,
                                                    "public_features": len(passive.columns)}
    assert d["sketch"]["per_party"]["active"]["public_features"] == 1
    assert d["sketch"]["per_party"]["active"]["epsilon"] == pytest.approx(share)
    assert d["epsilon"] == pytest.approx(8.0 - share)
    assert f"(public bins: active 1, passive1 {len(passive.columns)})" in r.stdout
