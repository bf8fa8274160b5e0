"""Warm start over the network (issue 37 item 9): `vfl party active --warm-start MODEL_DIR` against
real `vfl party passive` processes continues a saved model; 3 rounds then 2 more give the trees and
predictions of 5 rounds at once, in he and plain (he continuing a plain model: the same trees).
The passive party keeps the base model (still predicting) and writes the new one to its own file."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from support import KEY_BITS, cli_command, small_frames, start_passive

pytestmark = pytest.mark.slow   # real party processes, multi-second
pytest.importorskip("grpc")

ROOT = Path(__file__).resolve().parents[2]


def _trees(model_dir: Path):
    d = json.loads((model_dir / "bank.json").read_text())
    return d["model_id"], [[{k: v for k, v in t.items()} for t in rnd] for rnd in d["rounds"]]


def _active(tmp, addrs, model_dir, rounds, mode, *extra):
    r = subprocess.run(cli_command("party", "active", "--name", "bank", "--data", tmp / "a.csv",
                                   *[x for n, ad in addrs.items() for x in ("--peer", f"{n}={ad}")],
                                   "--model-dir", model_dir, "--insecure", "--mode", mode, "--key-bits", KEY_BITS,
                                   "--quiet", "--rounds", rounds, "--depth", 3, "--subsample", 0.8, *extra),
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _predict(tmp, addrs, model_dir, out):
    r = subprocess.run(cli_command("predict", "--model-dir", model_dir, "--data", tmp / "ax.csv",
                                   *[x for n, ad in addrs.items() for x in ("--peer", f"{n}={ad}")],
                                   "--out", out, "--insecure"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return pd.read_csv(out)


@pytest.mark.parametrize("warm_mode", ["plain", "he"])
def test_warm_start_over_the_network_equals_training_all_rounds_at_once(warm_mode, tmp_path, children):
    a, b, c = small_frames(160)
    a.to_csv(tmp_path / "a.csv", index=False)
    a.drop(columns="y").to_csv(tmp_path / "ax.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    c.to_csv(tmp_path / "c.csv", index=False)
    addrs = {n: start_passive(children, tmp_path, n, "--data", tmp_path / f"{n[0]}.csv", "--model-dir",
                              tmp_path / f"m_{n}", "--insecure") for n in ("b_telco", "c_shop")}
    _active(tmp_path, addrs, tmp_path / "full", 5, "plain")
    _active(tmp_path, addrs, tmp_path / "m3", 3, "plain")
    base_id, base_trees = _trees(tmp_path / "m3")
    before = {n: (tmp_path / f"m_{n}" / f"{base_id}.json").read_bytes() for n in addrs}
    p3 = _predict(tmp_path, addrs, tmp_path / "m3", tmp_path / "p3.csv")
    out = _active(tmp_path, addrs, tmp_path / "m35", 5, warm_mode, "--warm-start", tmp_path / "m3",
                  "--output-json", tmp_path / "warm.json")
    assert f"warm start: continued model {base_id} after 3 round(s)" in out
    assert json.loads((tmp_path / "warm.json").read_text())["warm_start"] == {"model_id": base_id, "n_rounds": 3}
    warm_id, warm_trees = _trees(tmp_path / "m35")
    full_id, full_trees = _trees(tmp_path / "full")
    assert warm_id not in (base_id, full_id)
    assert warm_trees == full_trees and warm_trees[:3] == base_trees
    pd.testing.assert_frame_equal(_predict(tmp_path, addrs, tmp_path / "m35", tmp_path / "p35.csv"),
                                  _predict(tmp_path, addrs, tmp_path / "full", tmp_path / "p5.csv"))
    # the base model is untouched at every passive party and still predicts as before
    for n in addrs:
        assert (tmp_path / f"m_{n}" / f"{base_id}.json").read_bytes() == before[n]
        assert json.loads((tmp_path / f"m_{n}" / f"{warm_id}.json").read_text())["completed"]
    pd.testing.assert_frame_equal(_predict(tmp_path, addrs, tmp_path / "m3", tmp_path / "p3b.csv"), p3)
    # a warm start that would not continue the same training is refused before any round
    r = subprocess.run(cli_command("party", "active", "--name", "bank", "--data", tmp_path / "a.csv",
                                   *[x for n, ad in addrs.items() for x in ("--peer", f"{n}={ad}")],
                                   "--model-dir", tmp_path / "bad", "--insecure", "--mode", "plain", "--quiet",
                                   "--rounds", 5, "--depth", 4, "--subsample", 0.8,
                                   "--warm-start", tmp_path / "m3"),
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "max_depth 3 -> 4" in r.stderr and "Traceback" not in r.stderr
