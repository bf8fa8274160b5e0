"""`vfl certs`, `vfl party ...` and `vfl predict`: every misuse gets a clear error (in-process CLI)."""
from __future__ import annotations

import json
import logging
import re
import socket

import pytest
from click.testing import CliRunner

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from support import small_frames  # noqa: E402

from cli import main  # noqa: E402
from vfl.core.model import content_hash  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_logging():
    lg = logging.getLogger("vfl")
    saved = (list(lg.handlers), lg.level, lg.propagate)
    yield
    lg.handlers[:], lg.level, lg.propagate = saved


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def files(tmp_path):
    a, b, _ = small_frames(n=60)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    return tmp_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_certs_command(tmp_path):
    r = run("certs", "--out", tmp_path / "c", "--party", "bank", "--party", "telco")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["bank.key", "bank.pem", "ca.key", "ca.pem",
                                                                  "telco.key", "telco.pem"]
    r = run("certs", "--out", tmp_path / "c", "--party", "shop")          # the CA is reused
    assert r.exit_code == 0 and "wrote " + str(tmp_path / "c" / "ca.pem") not in r.output
    r = run("certs", "--out", tmp_path / "c", "--party", "bank")
    assert r.exit_code == 1 and "bank.pem and " in r.output and "bank.key already exist (use --overwrite" in r.output
    r = run("certs", "--out", tmp_path / "c", "--party", "my_bank")
    assert r.exit_code == 1 and "cannot be used in a certificate" in r.output


def test_active_needs_a_security_choice_and_valid_peers(files):
    base = ["party", "active", "--data", files / "a.csv", "--model-dir", files / "m"]
    r = run(*base, "--peer", "b=127.0.0.1:1")
    assert r.exit_code == 1 and "--tls-dir DIR" in r.output and "--insecure" in r.output
    r = run(*base, "--peer", "b:127.0.0.1:1", "--insecure")
    assert r.exit_code == 1 and "must be NAME=HOST:PORT" in r.output
    r = run(*base, "--peer", "b=127.0.0.1:1", "--tls-dir", files / "nope")
    assert r.exit_code == 1 and "TLS directory" in r.output and "does not exist" in r.output
    r = run(*base, "--peer", "active=127.0.0.1:1", "--insecure")
    assert r.exit_code == 1 and "both named 'active'" in r.output
    r = run(*base, "--peer", "b=127.0.0.1:1", "--insecure", "--data", files / "missing.csv")
    assert r.exit_code == 1 and "missing.csv" in r.output and "does not exist" in r.output


def test_active_reports_an_unreachable_peer_quickly(files):
    port = free_port()
    r = run("party", "active", "--data", files / "a.csv", "--model-dir", files / "m", "--peer",
            f"b=127.0.0.1:{port}", "--insecure", "--connect-timeout", 1, "--mode", "plain", "--quiet")
    assert r.exit_code == 1
    assert f"party 'b' at 127.0.0.1:{port} is not reachable after 1 s" in r.output
    assert "warning: --insecure" in r.output
    assert not (files / "m" / "checkpoint.json").exists()


def test_model_dir_states(files):
    base = ["party", "active", "--data", files / "a.csv", "--peer", "b=127.0.0.1:1", "--insecure",
            "--model-dir", files / "m", "--connect-timeout", 1]
    r = run(*base, "--resume")
    assert r.exit_code == 1 and "no checkpoint to resume" in r.output
    (files / "m").mkdir()
    (files / "m" / "checkpoint.json").write_text("{}")
    r = run(*base)
    assert r.exit_code == 1 and "unfinished training" in r.output and "--resume" in r.output
    r = run(*base, "--resume")      # issue 36: a checkpoint without its content hash is not used
    assert r.exit_code == 1 and "records no content_hash" in r.output
    (files / "m" / "checkpoint.json").write_text(json.dumps({"content_hash": content_hash({})}))
    r = run(*base, "--resume")
    assert r.exit_code == 1 and "not a training checkpoint" in r.output
    (files / "m" / "checkpoint.json").unlink()
    (files / "m" / "active.json").write_text(json.dumps({"role": "active"}))
    r = run(*base)
    assert r.exit_code == 1 and "already holds a finished model" in r.output and "--force" in r.output
    r = run(*base, "--resume")
    assert r.exit_code == 1 and "already completed" in r.output


def test_dp_mode_cannot_be_resumed(files):
    r = run("party", "active", "--data", files / "a.csv", "--peer", "b=127.0.0.1:1", "--insecure",
            "--model-dir", files / "m", "--mode", "dp", "--epsilon", 4, "--resume")
    assert r.exit_code == 1 and "--resume is not available in dp mode" in r.output
    r = run("party", "active", "--data", files / "a.csv", "--peer", "b=127.0.0.1:1", "--insecure",
            "--model-dir", files / "m", "--mode", "dp")
    assert r.exit_code == 1 and "epsilon" in r.output


def test_predict_errors(files):
    r = run("predict", "--model-dir", files / "none", "--data", files / "a.csv", "--insecure",
            "--out", files / "p.csv")
    assert r.exit_code == 1 and "does not exist" in r.output
    (files / "m").mkdir()
    (files / "m" / "checkpoint.json").write_text("{}")
    r = run("predict", "--model-dir", files / "m", "--data", files / "a.csv", "--insecure", "--out", files / "p.csv")
    assert r.exit_code == 1 and "unfinished training" in r.output
    model = {"format": "vfl-boost-model", "version": 1, "role": "active", "objective": "binary", "n_targets": 1,
             "base_score": [0.0], "learning_rate": 0.3, "active_party": "active", "active_features": ["a0"],
             "passive_parties": ["b", "c"], "model_id": "x1", "salt": "00" * 16, "rounds": []}
    (files / "m" / "active.json").write_text(json.dumps(model))
    r = run("predict", "--model-dir", files / "m", "--data", files / "a.csv", "--insecure", "--out", files / "p.csv",
            "--peer", "b=127.0.0.1:1")      # issue 36: a model file without its content hash is not used
    assert r.exit_code == 1 and "records no content_hash" in r.output
    (files / "m" / "active.json").write_text(json.dumps({**model, "content_hash": content_hash(model)}))
    r = run("predict", "--model-dir", files / "m", "--data", files / "a.csv", "--insecure", "--out", files / "p.csv",
            "--peer", "b=127.0.0.1:1")
    assert r.exit_code == 1 and "needs passive party 'c': give --peer c=HOST:PORT" in r.output
    r = run("predict", "--model-dir", files / "m", "--data", files / "a.csv", "--insecure", "--out", files / "p.csv",
            "--peer", "b=127.0.0.1:1", "--peer", "c=127.0.0.1:1", "--peer", "d=127.0.0.1:1")
    assert r.exit_code == 1 and "not trained with party ['d']" in r.output


def test_passive_errors(files):
    base = ["party", "passive", "--name", "b", "--data", files / "b.csv", "--model-dir", files / "mb", "--insecure"]
    r = run(*base, "--listen", "nowhere")
    assert r.exit_code == 1 and "is not HOST:PORT" in r.output
    r = run("party", "passive", "--name", "b", "--data", files / "a.csv", "--model-dir", files / "a.csv",
            "--insecure", "--listen", "127.0.0.1:0")
    assert r.exit_code != 0 and "a.csv" in r.output and "is a file" in r.output
    r = run(*base, "--listen", "127.0.0.1:0", "--allow-client", "active")
    assert r.exit_code == 1 and "--allow-client" in r.output and "needs --tls-dir" in r.output
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        r = run(*base, "--listen", f"127.0.0.1:{busy.getsockname()[1]}")
        assert r.exit_code == 1 and "cannot listen on" in r.output
    finally:
        busy.close()


@pytest.mark.slow
def test_active_prints_the_training_metrics_of_every_round(files):
    """Issue 37: without validation data `vfl party active` printed no metric at all; now each
    round's training-rows metrics, as `vfl simulate --verbose` prints them."""
    import threading

    from parties import network
    from protocols.grpc_security import Security

    ready, stop, box = threading.Event(), threading.Event(), {}

    def on_ready(port):
        box["port"] = port
        ready.set()

    t = threading.Thread(target=network.serve_passive, daemon=True,
                         args=("b", "127.0.0.1:0", files / "b.csv", "id", files / "mb", Security()),
                         kwargs={"on_ready": on_ready, "stop_event": stop})
    t.start()
    try:
        assert ready.wait(30)
        r = run("party", "active", "--data", files / "a.csv", "--model-dir", files / "m", "--peer",
                f"b=127.0.0.1:{box['port']}", "--insecure", "--mode", "plain", "--rounds", 3)
        # scorecard points on predict (issue 37, item 9), the same scores as the probabilities say
        p = run("predict", "--model-dir", files / "m", "--data", files / "a.csv", "--peer",
                f"b=127.0.0.1:{box['port']}", "--insecure", "--out", files / "p.csv", "--points", "20,600,50",
                "--output-json", files / "p.json")
        bad = run("predict", "--model-dir", files / "m", "--data", files / "a.csv", "--peer",
                  f"b=127.0.0.1:{box['port']}", "--insecure", "--out", files / "q.csv", "--points", "20,600")
    finally:
        stop.set()
        t.join(10)
    assert r.exit_code == 0, r.output
    found = re.findall(r"round (\d+): train logloss ([0-9.]+), auc ([0-9.]+)", r.output)
    assert [int(n) for n, _, _ in found] == [1, 2, 3], r.output
    losses = [float(v) for _, v, _ in found]
    assert losses[0] > losses[1] > losses[2]
    assert p.exit_code == 0, p.output
    import numpy as np
    import pandas as pd

    from vfl.core.scorecard import PointsScale
    scores = pd.read_csv(files / "p.csv")
    assert list(scores.columns) == ["id", "proba", "points"]
    assert np.allclose(scores.points, PointsScale(20, 600, 50).from_proba(scores.proba.to_numpy()))
    assert json.loads((files / "p.json").read_text())["points"]["pdo"] == 20
    assert bad.exit_code == 1 and "--points takes PDO,BASE_SCORE,BASE_ODDS" in bad.output
    assert not (files / "q.csv").exists()
