"""The files of a network deployment (issue 10 #5, #6, #11, #14, #15, #17): passive servers in
threads over real gRPC sockets (plaintext on loopback), the active party's --model-dir."""
from __future__ import annotations

import errno
import json
import logging
import stat
import threading

import numpy as np
import pandas as pd
import pytest
from support import small_frames

pytest.importorskip("grpc")

from click.testing import CliRunner  # noqa: E402

from cli import main  # noqa: E402
from datasets.csv_tables import read_party_csv  # noqa: E402
from datasets.errors import InputError, WriteError  # noqa: E402
from parties import network  # noqa: E402
from parties.active import ActiveParty  # noqa: E402
from parties.passive import model_hash  # noqa: E402
from parties.server import PassiveServer  # noqa: E402
from protocols.grpc_security import Security  # noqa: E402
from protocols.transport import InMemoryTransport  # noqa: E402
from vfl.api import Federation, PassiveParty  # noqa: E402
from vfl.core.model import content_hash  # noqa: E402
from vfl.core.params import TrainParams  # noqa: E402

pytestmark = pytest.mark.slow     # gRPC servers in threads; a few seconds

PARAMS = TrainParams(mode="plain", n_estimators=3, max_depth=2)


def _csv(path, frame):
    frame.to_csv(path, index=False)
    return path


class Passives:
    """Passive servers ``b`` and ``c`` serving CSV files, each with its own --model-dir."""

    def __init__(self, tmp, b, c):
        self.tmp, self.stops, self.threads, self.peers = tmp, [], [], {}
        self.data = {"b": _csv(tmp / "b.csv", b), "c": _csv(tmp / "c.csv", c)}
        for name in ("b", "c"):
            self.start(name)

    def start(self, name):
        ready, stop, box = threading.Event(), threading.Event(), {}

        def on_ready(port):
            box["port"] = port
            ready.set()

        t = threading.Thread(target=network.serve_passive, daemon=True,
                             args=(name, "127.0.0.1:0", self.data[name], "id", self.tmp / f"models-{name}",
                                   Security()), kwargs={"on_ready": on_ready, "stop_event": stop})
        t.start()
        assert ready.wait(30)
        self.stops.append(stop)
        self.threads.append(t)
        self.peers[name] = f"127.0.0.1:{box['port']}"

    def close(self):
        for s in self.stops:
            s.set()
        for t in self.threads:
            t.join(10)


@pytest.fixture
def world(tmp_path):
    a, b, c = small_frames(n=120)
    ps = Passives(tmp_path, b, c)
    yield tmp_path, _csv(tmp_path / "a.csv", a), ps
    ps.close()


def _train(tmp, a_csv, ps, **kw):
    return network.train_active(a_csv, "id", "y", "a", dict(ps.peers), PARAMS, tmp / "models-a", Security(),
                                timeout=30, **kw)


def _predict(tmp, a_csv, ps, **kw):
    return network.predict_active(tmp / "models-a", a_csv, "id", dict(ps.peers), Security(), timeout=30, **kw)


def _mode(p):
    return stat.S_IMODE(p.stat().st_mode)


def test_a_failed_final_write_is_completed_by_resume(world, monkeypatch):
    tmp, a_csv, ps = world
    _train(tmp / "ref", a_csv, ps)             # the same training, uninterrupted
    real = network.write_json_atomic

    def full_disk(path, data, *args, **kw):
        raise WriteError(f"cannot write {path}: no space left on the device", path, errno.ENOSPC)

    monkeypatch.setattr(network, "write_json_atomic", full_disk)
    with pytest.raises(WriteError, match=r"the training finished but the model could not be saved: cannot write "
                                         r".*a\.json: no space left on the device; the checkpoint .*checkpoint\.json "
                                         r"was kept \(all 3 round\(s\)\).*--resume"):
        _train(tmp, a_csv, ps)
    monkeypatch.setattr(network, "write_json_atomic", real)
    ck = tmp / "models-a" / network.CHECKPOINT_FILE
    assert ck.exists() and not (tmp / "models-a" / "a.json").exists()
    # the passive parties were told "finished": the resumed run completes the last step only
    summary = _train(tmp, a_csv, ps, resume=True)
    assert summary["resumed_after_rounds"] == 3 and summary["n_rounds"] == 3 and not ck.exists()
    model = network.load_active_model(tmp / "models-a")
    ref_model = network.load_active_model(tmp / "ref" / "models-a")
    assert [t.structure() for r in model.rounds for t in r] == [t.structure() for r in ref_model.rounds for t in r]
    assert set(model.party_hashes) == {"b", "c"}
    ids, proba, _ = _predict(tmp, a_csv, ps)
    _, ref_proba, _ = network.predict_active(tmp / "ref" / "models-a", a_csv, "id", dict(ps.peers), Security(),
                                             timeout=30)
    assert len(ids) == 120 and np.array_equal(proba, ref_proba)


def test_a_full_disk_during_training_names_the_file_and_keeps_the_checkpoint(world, monkeypatch):
    tmp, a_csv, ps = world
    real, calls = network.Checkpoint.save, {"n": 0}

    def second_fails(self, path):
        calls["n"] += 1
        if calls["n"] == 2:
            raise WriteError(f"cannot write {path}: no space left on the device", path, errno.ENOSPC)
        return real(self, path)

    monkeypatch.setattr(network.Checkpoint, "save", second_fails)
    with pytest.raises(WriteError, match=r"training stopped after 1 of 3 round\(s\): cannot write .*checkpoint\.json: "
                                         r"no space left on the device; the checkpoint .* keeps the first 1 round"):
        _train(tmp, a_csv, ps)
    monkeypatch.undo()
    assert not [p for p in (tmp / "models-a").iterdir() if p.name.endswith(".tmp")]
    assert _train(tmp, a_csv, ps, resume=True)["n_rounds"] == 3


def test_an_unwritable_model_dir_is_refused_before_training(world):
    tmp, a_csv, ps = world
    (tmp / "blocker").write_text("x")
    with pytest.raises(InputError, match=r"--model-dir .*blocker.* is not a directory"):
        network.train_active(a_csv, "id", "y", "a", dict(ps.peers), PARAMS, tmp / "blocker", Security())
    with pytest.raises(WriteError, match=r"cannot create --model-dir .*blocker/sub"):
        network.train_active(a_csv, "id", "y", "a", dict(ps.peers), PARAMS, tmp / "blocker" / "sub", Security())
    with pytest.raises(WriteError, match=r"--model-dir .*blocker/sub"):
        PassiveServer("b", small_frames()[1], "id", tmp / "blocker" / "sub")


def _model_id(tmp):
    return json.loads((tmp / "models-a" / "a.json").read_text())["model_id"]


def test_every_file_a_network_training_writes_is_private(world):
    tmp, a_csv, ps = world
    _train(tmp, a_csv, ps)
    _predict(tmp, a_csv, ps, out=tmp / "pred.csv")
    written = [*(tmp / "models-a").iterdir(), *(tmp / "models-b").glob("*.json"), *(tmp / "models-c").glob("*.json"),
               tmp / "pred.csv"]
    assert len(written) == 4
    for party in ("b", "c"):        # the lifetime ledgers, on by default (issue 31), beside the lookup table
        ledgers = sorted(f.name for f in (tmp / f"models-{party}" / "ledgers").iterdir())
        assert ledgers == sorted(["dp-ledger.json", "dp-ledger.json.lock", "reveal-budget.json",
                                  "reveal-budget.json.lock", "reveal-budget.json.predictions.jsonl",
                                  f"{_model_id(tmp)}.training-rows.json"])     # the journal: the prediction's charges
        written += [*(tmp / f"models-{party}" / "ledgers").iterdir()]
        assert {f.name for f in (tmp / f"models-{party}").iterdir()} == {f"{_model_id(tmp)}.json", "ledgers"}
    for p in written:
        assert _mode(p) == 0o600, p


def test_a_modified_lookup_table_is_refused_at_prediction_naming_the_party(world):
    tmp, a_csv, ps = world
    summary = _train(tmp, a_csv, ps)
    f = tmp / "models-b" / f"{summary['model_id']}.json"
    doc = json.loads(f.read_text())
    doc["records"][0]["threshold"] = float(doc["records"][0]["threshold"]) - 0.5
    f.write_text(json.dumps(doc))
    ps.start("b")             # a restarted server sees the edit: the file's own hash refuses it
    with pytest.raises(InputError, match=r"party 'b' holds no model"):
        _predict(tmp, a_csv, ps)
    doc["model_hash"] = model_hash(doc)     # the edit with a recomputed hash: the active party's record differs
    f.write_text(json.dumps(doc))
    ps.start("b")
    with pytest.raises(InputError, match=r"party 'b': its model .* is not the one the active party trained with"):
        _predict(tmp, a_csv, ps)
    with pytest.raises(InputError, match=r"party 'b': its model .* is not the one"):
        _predict(tmp, a_csv, ps, prediction="node")
    pytest.importorskip("cryptography")
    with pytest.raises(InputError, match=r"party 'b': its model .* is not the one"):
        _predict(tmp, a_csv, ps, align="psi")


@pytest.mark.parametrize("content, message", [
    ("", r"no readable active-party model in .*: model file .*a\.json is empty"),
    ('{"format": "vfl-boost-mo', r"no readable active-party model .*a\.json is damaged: not valid JSON"),
])
def test_an_empty_or_truncated_active_model_is_named(tmp_path, content, message):
    d = tmp_path / "models-a"
    d.mkdir()
    (d / "a.json").write_text(content)
    with pytest.raises(InputError, match=message):
        network.load_active_model(d)


def test_a_corrupt_checkpoint_is_refused_on_resume(world):
    tmp, a_csv, ps = world

    def die(r, info):
        if r == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _train(tmp, a_csv, ps, on_round=die)
    ck = tmp / "models-a" / network.CHECKPOINT_FILE
    doc = json.loads(ck.read_text())
    split = next(n for r in doc["rounds"] for t in r for n in t["nodes"] if not n["is_leaf"])
    split["left"] = 99
    doc["content_hash"] = content_hash(doc)        # a consistent hash: the structural check must catch it
    ck.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"checkpoint\.json is damaged: field rounds\[0\]\[0\]\.nodes\[0\]\.left: "
                                         r"99 is out of range"):
        _train(tmp, a_csv, ps, resume=True)


def test_ids_written_133_0_and_133_align_in_network_mode_and_in_simulate(tmp_path):
    a, b, _ = small_frames(n=80)
    b = b.assign(id=[f"{i}.0" for i in b["id"]])
    a_csv, b_csv = _csv(tmp_path / "a.csv", a), _csv(tmp_path / "b.csv", b)
    pa, pb = read_party_csv(a_csv, "a", "id", "y"), read_party_csv(b_csv, "b", "id")
    # network mode: the passive server on the CSV, hash alignment
    server = PassiveServer("b", pb.frame, "id", tmp_path / "mb")
    active = ActiveParty("a", pa.frame)
    model = active.fit(InMemoryTransport("a", {"b": server.handle_frame}), ["b"], PARAMS)
    assert active.alignment_report["a"]["n_kept"] == 80 and model.n_rounds == 3
    # the same rule for DataFrames given to the API (no loader): "7.0" strings and ints are one id
    fed = Federation(ActiveParty("a", a), [PassiveParty("b", b)])
    fed.fit(PARAMS)
    assert fed.active.alignment_report["a"]["n_kept"] == 80
    # and `vfl simulate` on the two files
    res = CliRunner().invoke(main, ["simulate", "--active", str(a_csv), "--passive", str(b_csv), "--mode", "plain",
                                    "--rounds", "2", "--quiet", "--label-col", "y"])
    assert res.exit_code == 0, res.output
    assert "train: 64 rows, test: 16 rows" in res.output
    assert pd.read_csv(b_csv, dtype=str)["id"].iloc[0] == "0.0"      # the file really says "0.0"


def test_the_shutdown_line_counts_a_refused_prediction_as_refused(tmp_path, caplog):
    """Issue 37: a PredictStart for a model this party does not hold is refused (an ErrorReply,
    logged); the shutdown line said '1 calls served, 0 refused' right after that log line."""
    from protocols import messages as m
    from protocols.grpc_client import GrpcTransport

    _, b, c = small_frames(n=40)
    logger = logging.getLogger("vfl")   # an in-process CLI run (this file has some) stops "vfl" propagating
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("INFO", logger="vfl"):
            ps = Passives(tmp_path, b, c)
            t = GrpcTransport("a", {"b": ps.peers["b"]}, Security(), timeout=10)
            with pytest.raises(Exception, match="no model"):
                t.call("b", m.PredictStart("m-unknown", "s1", np.zeros((1, 16), dtype=np.uint8)))
            t.close()
            ps.close()
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if "shutting down" in r.getMessage()]
    assert "b: shutting down (0 calls served, 1 refused)" in lines, lines
    assert "c: shutting down (0 calls served, 0 refused)" in lines, lines
