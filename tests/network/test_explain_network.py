"""`vfl explain` against real passive servers over mutual TLS (issue 32): the attributions add up to
the margin `vfl predict` gives, and an explanation sends the servers exactly a one-round prediction's
messages (types, fields, sizes)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from support import start_passive  # noqa: E402

from parties.active import ActiveParty  # noqa: E402
from protocols.grpc_client import GrpcTransport  # noqa: E402
from protocols.grpc_security import Security  # noqa: E402
from protocols.serialization import loads  # noqa: E402
from vfl.core.model import BoostedModel  # noqa: E402

pytestmark = pytest.mark.slow   # real party processes

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "cli", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


class Recording(GrpcTransport):
    """A gRPC transport that keeps every (peer, request frame, reply frame)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.frames: list[tuple[str, bytes, bytes]] = []

    def _exchange(self, peer, frame):
        reply = super()._exchange(peer, frame)
        self.frames.append((peer, frame, reply))
        return reply

    def exchange(self):
        out = []
        for peer, request, reply in self.frames:
            for frame in (request, reply):
                msg = loads(frame)
                out.append((peer, type(msg).__name__, tuple(sorted(vars(msg))), len(frame)))
        return sorted(out, key=lambda e: e[0])      # per peer, in order (peers are called concurrently)


def _files(tmp: Path):
    rng = np.random.default_rng(5)
    n = 240
    X = rng.normal(size=(n, 5))
    X[rng.random(X.shape) < 0.1] = np.nan
    z = np.nan_to_num(X)
    ids = np.arange(n)
    colour = rng.choice(["red", "green", "blue"], size=n)
    y = (z[:, 0] + z[:, 2] - z[:, 4] + (colour == "red") + 0.3 * rng.normal(size=n) > 0).astype(int)
    a = pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3], "colour": colour})
    c = pd.DataFrame({"id": ids, "c0": X[:, 4]})
    a.to_csv(tmp / "a.csv", index=False)
    a.drop(columns="y").to_csv(tmp / "a_new.csv", index=False)
    b.to_csv(tmp / "b.csv", index=False)
    c.to_csv(tmp / "c.csv", index=False)


def test_explain_over_mutual_tls_adds_up_and_asks_exactly_what_prediction_asks(children, tmp_path):
    _files(tmp_path)
    certs = tmp_path / "certs"
    r = run_cli("certs", "--out", certs, "--party", "a", "--party", "b", "--party", "c")
    assert r.returncode == 0, r.stderr
    tls = ["--tls-dir", certs]
    addr = {name: start_passive(children, tmp_path, name, "--data", tmp_path / f"{name}.csv", "--model-dir",
                                tmp_path / f"m{name}", *tls, "--allow-client", "a",
                                *(["--categorical", "colour"] if name == "b" else []))
            for name in ("b", "c")}
    peers = [x for name in ("b", "c") for x in ("--peer", f"{name}={addr[name]}")]
    r = run_cli("party", "active", "--name", "a", "--data", tmp_path / "a.csv", *peers, "--model-dir",
                tmp_path / "ma", *tls, "--mode", "plain", "--rounds", 4, "--depth", 3, "--timeout", 60)
    assert r.returncode == 0, r.stderr

    r = run_cli("predict", "--model-dir", tmp_path / "ma", "--data", tmp_path / "a_new.csv", *peers, *tls,
                "--out", tmp_path / "pred.csv")
    assert r.returncode == 0, r.stderr
    r = run_cli("explain", "--model-dir", tmp_path / "ma", "--data", tmp_path / "a_new.csv", *peers, *tls,
                "--out", tmp_path / "ex.csv", "--top", 2, "--plot", tmp_path / "summary.png",
                "--output-json", tmp_path / "ex.json", "--batch-rows", 100)
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(tmp_path / "ex.csv")
    pred = pd.read_csv(tmp_path / "pred.csv")
    assert table["id"].tolist() == pred["id"].tolist()
    assert list(table.columns[:7]) == ["id", "base", "a0", "a1", "b", "c", "margin"]
    players = table[["a0", "a1", "b", "c"]].to_numpy()
    np.testing.assert_allclose(table["base"] + players.sum(axis=1), table["margin"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(1 / (1 + np.exp(-table["margin"])), pred["proba"], rtol=0, atol=1e-12)
    assert np.abs(table["b"]).max() > 0 and table["reason_1"].notna().any()
    summary = json.loads((tmp_path / "ex.json").read_text())
    assert summary["n_rows"] == 240 and summary["n_batches"] == 3
    assert set(summary["mean_abs"]["margin"]) == {"a0", "a1", "b", "c"}
    assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"

    # what the servers receive: an explanation is a one-round prediction, message for message
    model = BoostedModel.load(tmp_path / "ma" / "a.json") if (tmp_path / "ma" / "a.json").exists() else \
        BoostedModel.load(next((tmp_path / "ma").glob("*.json")))
    rows = pd.read_csv(tmp_path / "a_new.csv")
    sec = Security.from_options("a", certs)
    got = {}
    for what in ("predict", "explain"):
        transport = Recording("a", addr, sec, timeout=30)
        try:
            transport.connect(timeout=30)
            active = ActiveParty.from_model(model)
            if what == "predict":
                active.predict_raw(transport, rows, prediction="one-round")
            else:
                _, ex = active.explain(transport, rows)
                assert ex.additivity_error() < 1e-9
        finally:
            transport.close()
        got[what] = transport.exchange()
    assert got["explain"] == got["predict"]
    assert {k for _, k, _, _ in got["explain"]} >= {"PredictStart", "LeafMaskRequest", "LeafMaskResponse"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_passive_features_over_mutual_tls_only_for_a_party_whose_federation_entry_says_so(children, tmp_path):
    """b's federation entry says explain_features = true, c's does not: `vfl explain
    --passive-features b` leaves b's own features' values in b's --model-dir/explanations (adding
    up to b's column of the active party's CSV); `--passive-features c` is refused naming the rule."""
    _files(tmp_path)
    addr = {n: f"127.0.0.1:{_free_port()}" for n in ("b", "c")}
    fed = tmp_path / "federation.toml"
    fed.write_text(f'[federation]\nactive = "a"\n\n[parties.a]\n\n'
                   f'[parties.b]\naddress = "{addr["b"]}"\nhosts = ["127.0.0.1"]\nexplain_features = true\n'
                   f'predict_training_rows = true\n\n'     # a_new.csv holds the training rows (issue 31)
                   f'[parties.c]\naddress = "{addr["c"]}"\nhosts = ["localhost"]\npredict_training_rows = true\n')
    certs = tmp_path / "certs"
    r = run_cli("certs", "--out", certs, "--federation", fed)
    assert r.returncode == 0, r.stderr
    tls = ["--tls-dir", certs, "--federation", fed]
    for name in ("b", "c"):
        start_passive(children, tmp_path, name, "--data", tmp_path / f"{name}.csv", "--model-dir",
                      tmp_path / f"m{name}", *tls, "--listen", addr[name],
                      *(["--categorical", "colour"] if name == "b" else []))
    r = run_cli("party", "active", "--data", tmp_path / "a.csv", "--model-dir", tmp_path / "ma", *tls,
                "--mode", "plain", "--rounds", 3, "--depth", 3, "--timeout", 60)
    assert r.returncode == 0, r.stderr
    r = run_cli("explain", "--model-dir", tmp_path / "ma", "--data", tmp_path / "a_new.csv", *tls,
                "--out", tmp_path / "ex.csv", "--batch-rows", 100, "--passive-features", "b",
                "--output-json", tmp_path / "ex.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "ex.json").read_text())["passive_features"] == {"b": 240}
    table = pd.read_csv(tmp_path / "ex.csv")
    assert not any(col in table.columns for col in ("b0", "b1", "colour"))      # one value per passive party
    files = sorted((tmp_path / "mb" / "explanations").glob("*.csv"))
    assert len(files) == 3                       # one per batch (session)
    own = pd.concat([pd.read_csv(f) for f in files]).set_index("id").loc[table["id"]]
    assert list(own.columns) == ["b0", "b1", "colour"]
    np.testing.assert_allclose(own.sum(axis=1).to_numpy(), table["b"].to_numpy(), rtol=0, atol=1e-9)
    assert not (tmp_path / "mc" / "explanations").exists()
    r = run_cli("explain", "--model-dir", tmp_path / "ma", "--data", tmp_path / "a_new.csv", *tls,
                "--out", tmp_path / "ex2.csv", "--passive-features", "c")
    assert r.returncode != 0 and "rule 'explain_features'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "ex2.csv").exists()
