"""Online scoring and the live table in process (the twins of tests/network/test_online_serving.py):
table reloads are atomic between sessions (issue 37 item 2), the passive party's own quotas and
audit log, scoring channels bound to their client, the federation file's limits, the health
service before and after the table is loaded, JSON log lines."""
from __future__ import annotations

import json
import logging
import socket
import threading
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
from support import small_frames

from parties.active import ActiveParty
from parties.federation import FederationError, parse_federation
from parties.passive_online import AuditLog, OnlineScoring, ServeLimits
from parties.server import PassiveServer
from protocols import alignment
from protocols import messages as m
from protocols.transport import InMemoryTransport, frame_handler
from vfl.commands.common import JsonLinesFormatter
from vfl.core.errors import InputError, ProtocolError
from vfl.core.leafmask import leaf_masks
from vfl.core.params import TrainParams

PARAMS = TrainParams(mode="plain", n_estimators=3, max_depth=3)


def _transport(server, before=None):
    def handle(request):
        if before is not None:
            before(request)
        return server.handle(request, "bank@test", "bank")
    return InMemoryTransport("bank", {"telco": frame_handler(handle)})


@pytest.fixture
def trained(tmp_path):
    a, b, _ = small_frames(80)
    server = PassiveServer("telco", b.iloc[:60].reset_index(drop=True), "id", tmp_path / "telco")
    active = ActiveParty("bank", a.iloc[:60].reset_index(drop=True))
    active.fit(_transport(server), ["telco"], PARAMS)
    return server, active, a, b


def _predict(server, active, rows, prediction="node", before=None):
    return active.predict_proba(_transport(server, before), rows.drop(columns="y"), prediction=prediction)[1]


# --------------------------------------------------------------------------- the live table
def test_batch_prediction_sees_reloaded_rows_and_open_sessions_keep_theirs(trained, tmp_path):
    server, active, a, b = trained
    new = a.iloc[60:]
    with pytest.raises(InputError, match="has no row for 20 of the 20 requested sample ids"):
        _predict(server, active, new)
    old = _predict(server, active, a.iloc[:60])
    changed = b.copy()
    feats = [c for c in b.columns if c != "id"]
    changed[feats] = changed[feats].to_numpy()[::-1]          # every row's values move: the answers change
    fresh = PassiveServer("telco", changed, "id", tmp_path / "telco")
    want_new = _predict(fresh, active, a)
    assert not np.array_equal(want_new[:60], old)

    reloaded = []

    def reload_once(request):           # the table changes while a session is open (between its requests)
        if isinstance(request, m.RouteRequest) and not reloaded:
            reloaded.append(server.reload_table(changed, "changed.csv"))
    during = _predict(server, active, a.iloc[:60], before=reload_once)
    assert reloaded == [2] and server.table_version == 2
    np.testing.assert_array_equal(during, old)                 # the open session answered from its own rows
    np.testing.assert_array_equal(_predict(server, active, a), want_new)       # new sessions: the new table
    np.testing.assert_array_equal(_predict(server, active, a, prediction="one-round"), want_new)


def test_a_table_without_the_models_features_is_refused_and_the_old_one_kept(trained):
    server, active, a, b = trained
    with pytest.raises(InputError, match=r"lacks feature column\(s\) \['b0'\] of model .*the table in use is kept"):
        server.reload_table(b.drop(columns="b0"), "thin.csv")
    assert server.table_version == 1
    assert _predict(server, active, a.iloc[:10]).shape == (10,)


# --------------------------------------------------------------------------- scoring, quotas, audit
class Clock:
    def __init__(self):
        self.t, self.day = 1000.0, datetime(2026, 11, 28, 12, tzinfo=timezone.utc)

    def mono(self):
        return self.t

    def wall(self):
        return self.day + timedelta(seconds=self.t - 1000.0)


def _open(online, active, client="bank", cid="c1"):
    sk = active.model.skeleton("telco")
    online.handle(m.ServeOpen(cid, active.model.model_id, sk.tree_sizes, sk.left, sk.right, sk.record_ids,
                              active.model.party_hashes.get("telco", "")), "bank@test", client)


def _score(online, active, ids, client="bank", cid="c1"):
    hashes = alignment.hash_ids(np.asarray(ids), bytes.fromhex(active.model.salt))
    return online.handle(m.ScoreRequest(cid, hashes), "bank@test", client)


def test_scoring_answers_known_and_unknown_applicants(trained):
    server, active, a, b = trained
    online = OnlineScoring(server)
    _open(online, active)
    ids = [int(a["id"][0]), 10_000]
    reply = _score(online, active, ids)
    assert isinstance(reply, m.ScoreResponse) and reply.known.tolist() == [True, False]
    # the known row's masks are those of a one-round batch session; the unknown one's those of a missing row
    nan_row = b.iloc[:1].copy()
    nan_row[[c for c in b.columns if c != "id"]] = np.nan
    nan_row["id"] = 10_000
    side = PassiveServer("telco", pd.concat([b.iloc[:1], nan_row]), "id", server.model_dir)
    masks = []
    tr = InMemoryTransport("bank", {"telco": frame_handler(lambda r: side.handle(r, "bank@test", "bank"))})
    orig = tr.call

    def spy(peer, message):
        reply = orig(peer, message)
        if isinstance(reply, m.LeafMaskResponse):
            masks.append(reply.masks)
        return reply
    tr.call = spy
    frame = a.iloc[:1].drop(columns="y").copy()
    frame2 = frame.copy()
    frame2["id"] = 10_000
    active.predict_proba(tr, pd.concat([frame, frame2]), prediction="one-round")
    sk = active.model.skeleton("telco")
    own = np.flatnonzero(sk.record_ids >= 0)
    decisions = np.unpackbits(reply.decisions, axis=1, count=len(own)).astype(bool)
    np.testing.assert_array_equal(leaf_masks(sk, own, decisions), masks[0])    # the same information as masks
    with pytest.raises(ProtocolError, match="belongs to another client"):
        _score(online, active, ids, client="mallory")
    with pytest.raises(ProtocolError, match="unknown scoring channel 'nope'"):
        _score(online, active, ids, cid="nope")


def test_rate_limit_and_daily_rows_are_the_passive_partys_and_every_request_is_audited(trained, tmp_path):
    server, active, a, _ = trained
    clock, path = Clock(), tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    online = OnlineScoring(server, ServeLimits(requests_per_second=2, rows_per_day=5), audit, clock=clock.mono,
                           wall=clock.wall)
    _open(online, active)
    ids = a["id"].tolist()
    assert isinstance(_score(online, active, ids[:1]), m.ScoreResponse)
    assert isinstance(_score(online, active, ids[1:2]), m.ScoreResponse)
    refused = _score(online, active, ids[2:3])                 # the third in the same instant: 2 per second
    assert isinstance(refused, m.ScoreRefused) and refused.rule == "serve_requests_per_second"
    assert refused.retry_after == pytest.approx(0.5) and "at most 2 online requests per second" in refused.message
    clock.t += 0.5
    assert isinstance(_score(online, active, ids[2:5]), m.ScoreResponse)          # 5 rows today
    clock.t += 1
    over = _score(online, active, ids[5:6])
    assert isinstance(over, m.ScoreRefused) and over.rule == "serve_rows_per_day"
    assert "at most 5 applicants per caller and UTC day (5 scored today, 1 asked)" in over.message
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(e["outcome"], e.get("reason"), e["rows"]) for e in lines] == [
        ("ok", None, 1), ("ok", None, 1), ("refused", "serve_requests_per_second", 1), ("ok", None, 3),
        ("refused", "serve_rows_per_day", 1)]
    salt = bytes.fromhex(active.model.salt)
    assert lines[0]["ids"] == [alignment.hash_ids(np.asarray(ids[:1]), salt)[0].tobytes().hex()]
    assert all(e["caller"] == "bank" and e["model"] == active.model.model_id for e in lines)
    # a restart the same day: the count comes back from the audit log; the next day starts afresh
    audit.close()
    audit2 = AuditLog(path)
    again = OnlineScoring(server, ServeLimits(rows_per_day=5), audit2, clock=clock.mono, wall=clock.wall)
    assert again.rows_today("bank") == 5
    _open(again, active)
    assert isinstance(_score(again, active, ids[5:6]), m.ScoreRefused)
    clock.t += 86400
    assert isinstance(_score(again, active, ids[5:6]), m.ScoreResponse)
    audit2.close()
    assert (path.stat().st_mode & 0o777) == 0o600


def test_the_federation_file_sets_the_limits_of_passive_parties_only():
    base = {"federation": {"active": "bank"}, "parties": {"bank": {}, "telco": {"address": "127.0.0.1:1"}}}
    fed = parse_federation({**base, "parties": {"bank": {}, "telco": {
        "address": "127.0.0.1:1", "serve_requests_per_second": 50, "serve_rows_per_day": 1000}}})
    assert ServeLimits.from_federation(fed, "telco") == ServeLimits(50.0, 1000)
    for bad, text in ((("telco", "serve_rows_per_day", 1.5), "expected an integer more than 0"),
                      (("telco", "serve_requests_per_second", 0), "expected a number more than 0"),
                      (("telco", "serve_rows_per_day", True), "expected an integer"),
                      (("bank", "serve_rows_per_day", 10), "the active party serves no online scoring")):
        party, key, value = bad
        parties = {"bank": {}, "telco": {"address": "127.0.0.1:1"}}
        parties[party] = {**parties[party], key: value}
        with pytest.raises(FederationError, match=f"\\[parties.{party}\\] {key}: {text}"):
            parse_federation({**base, "parties": parties})


# --------------------------------------------------------------------------- health, logs
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_health_is_not_serving_until_the_table_is_loaded(trained, tmp_path):
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("grpc_health")
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from parties.network import _load_table, serve_passive
    from protocols.grpc_security import Security

    server, _, _, b = trained
    b.to_csv(tmp_path / "b.csv", index=False)
    port, release, ready, stop = _free_port(), threading.Event(), threading.Event(), threading.Event()

    def slow_loader(*args):
        release.wait(30)
        return _load_table(*args)
    t = threading.Thread(target=serve_passive, args=("telco", f"127.0.0.1:{port}", tmp_path / "b.csv", "id",
                                                    server.model_dir, Security()),
                         kwargs=dict(on_ready=lambda p: ready.set(), stop_event=stop, table_loader=slow_loader))
    t.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            def status(service=""):
                return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10,
                                  wait_for_ready=True).status
            assert status() == health_pb2.HealthCheckResponse.NOT_SERVING
            assert status("vfl.Party") == health_pb2.HealthCheckResponse.NOT_SERVING
            release.set()
            assert ready.wait(30)
            assert status() == health_pb2.HealthCheckResponse.SERVING
            assert status("vfl.Party") == health_pb2.HealthCheckResponse.SERVING
    finally:
        release.set()
        stop.set()
        t.join(30)


def test_json_log_lines():
    rec = logging.LogRecord("vfl.serve", logging.WARNING, __file__, 1, "party %r: %s", ("telco", "down"), None)
    doc = json.loads(JsonLinesFormatter().format(rec))
    assert doc["level"] == "warning" and doc["logger"] == "vfl.serve" and doc["message"] == "party 'telco': down"
    assert doc["time"].endswith("+00:00")


@pytest.fixture
def _restore_logging():
    saved = {n: (list(lg.handlers), lg.level, lg.propagate) for n in ("vfl", "uvicorn")
             for lg in [logging.getLogger(n)]}
    yield
    for n, (handlers, level, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate


def test_vfl_serve_refuses_bad_options_with_clear_errors(tmp_path, _restore_logging):
    pytest.importorskip("fastapi")
    from click.testing import CliRunner

    from cli import main
    runner = CliRunner()
    r = runner.invoke(main, ["serve", "--model-dir", str(tmp_path / "none"), "--peer", "telco=127.0.0.1:1",
                             "--insecure"])
    assert r.exit_code == 1 and f"model directory {tmp_path / 'none'} does not exist" in r.output
    r = runner.invoke(main, ["serve", "--model-dir", str(tmp_path), "--http-cert", "c.pem", "--insecure"])
    assert r.exit_code == 2 and "--http-cert and --http-key go together" in r.output
    r = runner.invoke(main, ["serve", "--model-dir", str(tmp_path), "--retry-seconds", "-1", "--insecure"])
    assert r.exit_code == 1 and "--retry-seconds must be 0..3600 seconds, got -1.0" in r.output


def test_find_rows_agrees_with_a_dictionary():
    rng = np.random.default_rng(5)
    own = rng.integers(0, 256, size=(500, 16), dtype=np.uint8)
    own[10, :8] = own[11, :8]                       # equal first words: the second word decides
    asked = np.concatenate([own[rng.permutation(500)[:50]], rng.integers(0, 256, size=(20, 16), dtype=np.uint8),
                            own[[11, 10]]])
    oracle = {h.tobytes(): i for i, h in enumerate(own)}
    want = [oracle.get(h.tobytes(), -1) for h in asked]
    got = alignment.find_rows(alignment.check_unique_hashes(own, "telco"), asked)
    assert got.tolist() == want and want[-2:] == [11, 10] and want.count(-1) == 20
    assert alignment.find_rows(alignment.check_unique_hashes(own[:0], "telco"), asked).tolist() == [-1] * len(asked)
