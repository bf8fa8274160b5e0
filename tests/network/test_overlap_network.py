"""Overlapped rounds over the real gRPC transport (issue 12, item 2): an active and two passive
party processes, once with ``VFL_OVERLAP=1`` (the default) and once with ``VFL_OVERLAP=0`` in
every process, grow the same model (trees, leaf values, the passive parties' lookup tables) and
predict the same scores."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support import KEY_BITS, cli_command, small_frames, start_passive

pytestmark = pytest.mark.slow   # real party processes
pytest.importorskip("grpc")

ROOT = Path(__file__).resolve().parents[2]


def _env(overlap: bool) -> dict:
    env = dict(os.environ)
    env["VFL_OVERLAP"] = "1" if overlap else "0"
    return env


def _train_and_predict(children, tmp: Path, overlap: bool):
    tmp.mkdir()
    a, b, c = small_frames(700)
    for name, frame in (("bank", a), ("telco", b), ("shop", c)):
        frame.to_csv(tmp / f"{name}.csv", index=False)
    a.drop(columns=["y"]).to_csv(tmp / "new.csv", index=False)
    env = _env(overlap)
    peers = []
    for name in ("telco", "shop"):
        addr = start_passive(children, tmp, name, "--data", tmp / f"{name}.csv", "--model-dir", tmp / f"m_{name}",
                             "--insecure", env=env)
        peers += ["--peer", f"{name}={addr}"]
    r = subprocess.run(cli_command("party", "active", "--name", "bank", "--data", tmp / "bank.csv", *peers,
                                   "--model-dir", tmp / "m_bank", "--insecure", "--mode", "he", "--key-bits",
                                   KEY_BITS, "--rounds", 3, "--depth", 3, "--subsample", 0.8, "--quiet",
                                   "--output-json", tmp / "train.json"),
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(cli_command("predict", "--model-dir", tmp / "m_bank", "--data", tmp / "new.csv", *peers,
                                   "--out", tmp / "pred.csv", "--insecure"),
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    active = json.loads((tmp / "m_bank" / "bank.json").read_text())
    model_id = active["model_id"]
    passives = {n: json.loads((tmp / f"m_{n}" / f"{model_id}.json").read_text())["records"]
                for n in ("telco", "shop")}
    summary = json.loads((tmp / "train.json").read_text())
    return active, passives, (tmp / "pred.csv").read_text(), summary


def _trees(active: dict):
    """What decides a prediction: every round's trees (nodes, owners, record ids, leaf values)."""
    return active["rounds"]


def _records(passives: dict):
    return {n: [(r["record_id"], r["round"], r["tree"], r["node_id"], r["feature"], r["threshold"],
                 r["default_left"]) for r in recs] for n, recs in passives.items()}


def test_overlap_on_and_off_grow_the_same_model_over_grpc(children, tmp_path):
    on = _train_and_predict(children, tmp_path / "on", True)
    off = _train_and_predict(children, tmp_path / "off", False)
    assert _trees(on[0]) == _trees(off[0]) and _trees(on[0])
    assert _records(on[1]) == _records(off[1]) and all(on[1].values())
    assert on[2] == off[2]                                  # the predicted scores, as written
    assert on[3]["n_trees"] == off[3]["n_trees"] == 3
    # each run recorded the switch it trained with, in the summary and in the active party's model
    assert (on[3]["settings"]["overlap"], off[3]["settings"]["overlap"]) == (True, False)
    assert (on[0]["settings"]["overlap"], off[0]["settings"]["overlap"]) == (True, False)
