"""Network mode with real processes and real sockets on 127.0.0.1.

Every party is its own ``python -m cli party ...`` process; children are
always killed in fixtures. The in-memory federation on the same CSV files and
parameters is the reference (``he`` and ``plain`` grow identical trees, so the
reference runs in ``plain`` mode).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from datasets import breast_cancer_parties, train_test_split_parties  # noqa: E402
from parties.active import ActiveParty  # noqa: E402
from parties.passive import PassiveParty  # noqa: E402
from protocols import messages as m  # noqa: E402
from protocols.grpc_client import GrpcTransport  # noqa: E402
from protocols.grpc_security import Security  # noqa: E402
from protocols.serialization import loads  # noqa: E402
from vfl.api import Federation  # noqa: E402
from vfl.core.errors import PeerError  # noqa: E402
from vfl.core.model import BoostedModel  # noqa: E402
from vfl.core.params import TrainParams  # noqa: E402

pytestmark = pytest.mark.slow   # real party processes / worker pools, multi-second

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60


def cli(*args):
    return [sys.executable, "-m", "cli", *map(str, args)]


class Children:
    """Child processes of one test; all are killed at the end."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, args, log_name):
        err = open(self.tmp / f"{log_name}.err", "w")
        p = subprocess.Popen(cli(*args), cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
        err.close()
        self.procs.append(p)
        return p

    def log(self, log_name) -> str:
        return (self.tmp / f"{log_name}.err").read_text()

    def passive(self, name, data, model_dir, *extra, log_name=None):
        log_name = log_name or name
        p = self.start(["party", "passive", "--name", name, "--listen", "127.0.0.1:0", "--data", data,
                        "--model-dir", model_dir, *extra], log_name)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise AssertionError(f"passive {name} exited: {self.log(log_name)}")
            ready, _, _ = select.select([p.stdout], [], [], 0.2)
            if ready:
                line = p.stdout.readline()
                if "listening on" in line:
                    return p, line.strip().rsplit(" ", 1)[1]
        raise AssertionError(f"passive {name} did not start: {self.log(log_name)}")

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if p.stdout:
                p.stdout.close()


@pytest.fixture
def children(tmp_path):
    c = Children(tmp_path)
    try:
        yield c
    finally:
        c.kill_all()


def run_cli(*args, timeout=180):
    return subprocess.run(cli(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    """breast_cancer in three parties: train CSVs for everyone, test CSV for the active party; the passive
    parties' files hold train and test rows (they score both)."""
    d = tmp_path_factory.mktemp("net_data")
    train, test = train_test_split_parties(breast_cancer_parties(3), test_size=0.2, seed=0)
    files = {}
    for tr, te in zip(train, test):
        tr.frame.to_csv(d / f"train_{tr.name}.csv", index=False)
        te.frame.to_csv(d / f"test_{te.name}.csv", index=False)
        pd.concat([tr.frame, te.frame]).to_csv(d / f"all_{tr.name}.csv", index=False)
        files[tr.name] = {k: d / f"{k}_{tr.name}.csv" for k in ("train", "test", "all")}
    return files


def reference(files, **params):
    """The in-memory federation on the same files (plain mode: the same trees as he)."""
    frames = {n: pd.read_csv(f["train"]) for n, f in files.items()}
    fed = Federation(ActiveParty("active", frames["active"]),
                     [PassiveParty("passive1", frames["passive1"]), PassiveParty("passive2", frames["passive2"])])
    fed.fit(TrainParams(mode="plain", **params))
    tests = {n: pd.read_csv(f["test"]) for n, f in files.items()}
    return fed, fed.predict_proba(tests)


def assert_same_model(model: BoostedModel, passive_files: dict, fed: Federation):
    """Same trees (owners, record ids, thresholds) and passive lookup tables as the reference."""
    ref = fed.model
    assert model.passives == ref.passives
    assert model.n_rounds == ref.n_rounds
    for rnd, rref in zip(model.rounds, ref.rounds):
        for t, tref in zip(rnd, rref):
            assert len(t.nodes) == len(tref.nodes)
            for a, b in zip(t.nodes, tref.nodes):
                assert (a.is_leaf, a.left, a.right, a.owner, a.record_id, a.feature_idx, a.threshold,
                        a.default_left) == (b.is_leaf, b.left, b.right, b.owner, b.record_id, b.feature_idx,
                                            b.threshold, b.default_left)
                assert a.value == pytest.approx(b.value, rel=1e-9, abs=1e-12)
    for name, path in passive_files.items():
        d = json.loads(Path(path).read_text())
        assert d["completed"] is True
        got = [(r["record_id"], r["round"], r["tree"], r["node_id"], r["feature"], float(r["threshold"]),
                r["default_left"]) for r in d["records"]]
        want = [(r["record_id"], r["round"], r["tree"], r["node_id"], r["feature"], float(r["threshold"]),
                 r["default_left"]) for r in fed.passives[name].records]
        assert got == want


def test_tls_processes_train_and_predict_like_in_memory(children, data_files, tmp_path):
    """Two passive processes and an active process over mutual TLS: the model and the test
    predictions are those of the in-memory federation; oversized and malformed frames are refused
    while the passive server keeps serving."""
    certs = tmp_path / "certs"
    r = run_cli("certs", "--out", certs, "--party", "active", "--party", "passive1", "--party", "passive2")
    assert r.returncode == 0, r.stderr
    tls = ["--tls-dir", certs]
    _, a1 = children.passive("passive1", data_files["passive1"]["all"], tmp_path / "m1", *tls, "--max-message-mb", 1,
                             "--allow-client", "active")      # deny by default: TLS needs the allowed clients
    _, a2 = children.passive("passive2", data_files["passive2"]["all"], tmp_path / "m2", *tls,
                             "--allow-client", "active")
    peers = ["--peer", f"passive1={a1}", "--peer", f"passive2={a2}"]
    r = run_cli("party", "active", "--data", data_files["active"]["train"], *peers, "--model-dir", tmp_path / "ma",
                *tls, "--mode", "he", "--key-bits", 1024, "--rounds", 3, "--depth", 3, "--timeout", 60,
                "--output-json", tmp_path / "train.json")
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "train.json").read_text())
    assert summary["n_train"] == 455 and summary["n_trees"] == 3 and summary["mode"] == "he"
    assert summary["bytes_sent"]["active->passive1"] > 455 * 256     # at least one ciphertext vector
    assert not (tmp_path / "ma" / "checkpoint.json").exists()
    model = BoostedModel.load(tmp_path / "ma" / "active.json")

    fed, ref_proba = reference(data_files, n_estimators=3, max_depth=3)
    assert_same_model(model, {"passive1": tmp_path / "m1" / f"{model.model_id}.json",
                              "passive2": tmp_path / "m2" / f"{model.model_id}.json"}, fed)
    assert "completed by active (certificate active" in children.log("passive1")

    # refused while serving: an oversized frame (cap 1 MiB), garbage, an unknown message type
    client = GrpcTransport("active", {"passive1": a1}, Security.from_options("active", certs), timeout=20)
    try:
        with pytest.raises(PeerError, match="too large"):
            client.call("passive1", m.PredictStart("m", "s", np.zeros((100_000, 16), np.uint8)))
        reply = loads(client._exchange("passive1", b"VFL1garbage"))
        assert isinstance(reply, m.ErrorReply) and "header" in reply.message
        bad_type = b'{"type":"Exec","fields":{},"blobs":{}}'
        reply = loads(client._exchange("passive1", b"VFL1" + len(bad_type).to_bytes(4, "little") + bad_type))
        assert isinstance(reply, m.ErrorReply) and "unknown" in reply.message and "'Exec'" in reply.message
    finally:
        client.close()

    # one-round prediction (the default) and node-by-node routing with PSI alignment agree
    for i, extra in enumerate([(), ("--prediction", "node", "--align", "psi")]):
        out = tmp_path / f"pred{i}.csv"
        r = run_cli("predict", "--model-dir", tmp_path / "ma", "--data", data_files["active"]["test"], *peers, *tls,
                    "--out", out, *extra)
        assert r.returncode == 0, r.stderr
        pred = pd.read_csv(out)
        assert pred["id"].tolist() == pd.read_csv(data_files["active"]["test"])["id"].tolist()
        np.testing.assert_allclose(pred["proba"].to_numpy(), ref_proba, rtol=0, atol=1e-12)
    assert "refused a call" in children.log("passive1")
    assert "(PSI)" in children.log("passive2") and "(hashed ids)" in children.log("passive2")


def test_tls_processes_train_with_okamoto_uchiyama_like_in_memory(children, data_files, tmp_path):
    """``--scheme ou`` over mutual TLS: the passive processes accept the OU key (ciphertexts mod n,
    half the bytes of Paillier's per value) and the model is the in-memory plain model."""
    certs = tmp_path / "certs"
    r = run_cli("certs", "--out", certs, "--party", "active", "--party", "passive1", "--party", "passive2")
    assert r.returncode == 0, r.stderr
    tls = ["--tls-dir", certs]
    allow = ["--allow-client", "active"]
    _, a1 = children.passive("passive1", data_files["passive1"]["all"], tmp_path / "m1", *tls, *allow)
    _, a2 = children.passive("passive2", data_files["passive2"]["all"], tmp_path / "m2", *tls, *allow)
    peers = ["--peer", f"passive1={a1}", "--peer", f"passive2={a2}"]
    r = run_cli("party", "active", "--data", data_files["active"]["train"], *peers, "--model-dir", tmp_path / "ma",
                *tls, "--mode", "he", "--scheme", "ou", "--key-bits", 1024, "--rounds", 2, "--depth", 3,
                "--timeout", 60, "--output-json", tmp_path / "train.json")
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "train.json").read_text())
    assert summary["params"]["scheme"] == "ou" and summary["n_trees"] == 2
    assert summary["bytes_sent"]["active->passive1"] > 455 * 128     # at least one vector of 1024-bit ciphertexts
    model = BoostedModel.load(tmp_path / "ma" / "active.json")
    fed, _ = reference(data_files, n_estimators=2, max_depth=3)
    assert_same_model(model, {"passive1": tmp_path / "m1" / f"{model.model_id}.json",
                              "passive2": tmp_path / "m2" / f"{model.model_id}.json"}, fed)


def _checkpoint_rounds(path: Path) -> int:
    try:
        return json.loads(path.read_text())["n_rounds"]
    except (OSError, ValueError, KeyError):
        return 0


def test_passive_dies_mid_training_then_resume_gives_the_same_model(children, data_files, tmp_path):
    """A passive process killed mid-training: the active party stops with an error naming it, leaves
    only an unfinished checkpoint; after a restart ``--resume`` (re-aligning by PSI with the saved
    salt) yields the uninterrupted model."""
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-tests-0123456789\n")
    sec = ["--insecure", "--token-file", token]
    m1, m2, ma = tmp_path / "m1", tmp_path / "m2", tmp_path / "ma"
    _, a1 = children.passive("passive1", data_files["passive1"]["all"], m1, *sec)
    p2, a2 = children.passive("passive2", data_files["passive2"]["all"], m2, *sec)
    train = ["party", "active", "--data", data_files["active"]["train"], "--model-dir", ma, *sec, "--mode", "he",
             "--key-bits", 1024, "--rounds", 8, "--depth", 3, "--timeout", 15, "--connect-timeout", 30,
             "--align", "psi"]
    active = children.start([*train, "--peer", f"passive1={a1}", "--peer", f"passive2={a2}"], "active")
    ck = ma / "checkpoint.json"
    deadline = time.monotonic() + 120
    while _checkpoint_rounds(ck) < 2:
        assert active.poll() is None, children.log("active")
        assert time.monotonic() < deadline, "no checkpoint after 2 rounds"
        time.sleep(0.02)
    os.kill(active.pid, signal.SIGSTOP)       # freeze the active party mid-training ...
    try:
        p2.kill()                             # ... kill a passive process ...
        p2.wait(timeout=10)
    finally:
        os.kill(active.pid, signal.SIGCONT)   # ... and let the active party notice
    t0 = time.monotonic()
    rc = active.wait(timeout=60)
    assert time.monotonic() - t0 < 15 + 5        # within its timeout
    err = children.log("active")
    assert rc == 1, err
    assert "party 'passive2'" in err and "--resume" in err and "training stopped after" in err
    assert not (ma / "active.json").exists()      # no finished model ...
    state = json.loads(ck.read_text())
    assert state["completed"] is False and 2 <= state["n_rounds"] < 8
    [f2] = list(m2.glob("*.json"))
    assert json.loads(f2.read_text())["completed"] is False     # ... anywhere

    r = run_cli("predict", "--model-dir", ma, "--data", data_files["active"]["test"], "--peer", f"passive1={a1}",
                "--peer", f"passive2={a2}", "--insecure", "--out", tmp_path / "p.csv")
    assert r.returncode != 0 and "unfinished" in r.stderr

    _, a2 = children.passive("passive2", data_files["passive2"]["all"], m2, *sec, log_name="passive2-restarted")
    assert "unfinished" in children.log("passive2-restarted")
    r = run_cli(*train, "--peer", f"passive1={a1}", "--peer", f"passive2={a2}", "--resume")
    assert r.returncode == 0, r.stderr
    assert f"resumed after {state['n_rounds']} round(s)" in r.stdout
    assert not ck.exists()
    model = BoostedModel.load(ma / "active.json")
    fed, _ = reference(data_files, n_estimators=8, max_depth=3)
    assert_same_model(model, {"passive1": m1 / f"{model.model_id}.json", "passive2": m2 / f"{model.model_id}.json"},
                      fed)
    assert "resumed by active" in children.log("passive2-restarted")
    assert "PSI alignment" in children.log("passive2-restarted")
