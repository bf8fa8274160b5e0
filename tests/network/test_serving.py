"""Serving under load and abuse (issue 10): concurrent predictions with per-client limits and
"busy, retry", a busy port, stalled uploads, the caller's deadline, sessions bound to their
client, TLS mismatches, per-session locking. Real gRPC on loopback where it matters."""
from __future__ import annotations

import logging
import socket
import threading
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from frames_support import malformed_frames  # noqa: E402
from support import KEY_BITS, small_frames  # noqa: E402

from crypto.keys import WeakKeyWarning  # noqa: E402
from parties.active import ActiveParty  # noqa: E402
from parties.server import PassiveServer  # noqa: E402
from protocols import messages as m  # noqa: E402
from protocols.certs import make_certs  # noqa: E402
from protocols.grpc_client import GrpcTransport, probe_plaintext  # noqa: E402
from protocols.grpc_security import Security  # noqa: E402
from protocols.grpc_server import Caller, PartyServer  # noqa: E402
from protocols.grpc_wire import EXCHANGE, require_grpc  # noqa: E402
from protocols.serialization import dumps, loads  # noqa: E402
from protocols.transport import (  # noqa: E402
    BusyError,
    InMemoryTransport,
    PeerBusyError,
    caller_deadline,
    check_deadline,
    frame_handler,
)
from vfl.core.errors import InputError, PeerError, ProtocolError  # noqa: E402
from vfl.core.params import TrainParams  # noqa: E402

INSECURE = Security()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    make_certs(d, ["bank", "telco", "shop"])
    return d


def tls(pki, name):
    return Security.from_options(name, tls_dir=pki)


@pytest.fixture
def serve():
    servers = []

    def start(handler, security=INSECURE, name="telco", **kw):
        s = PartyServer(name, handler, "127.0.0.1:0", security, **kw)
        port = s.start()
        servers.append(s)
        return s, f"127.0.0.1:{port}"

    yield start
    for s in servers:
        s.stop(grace=None)


def with_client(server: PassiveServer, client: str, who: str | None = None):
    """A frame handler calling ``server`` as client ``client`` (what PartyServer passes)."""
    return lambda frame: server.handle_frame(frame, Caller(who or client, client))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model trained in mode he (1024-bit key) with one passive server holding its table."""
    d = tmp_path_factory.mktemp("served")
    a, b, _ = small_frames(n=80)
    sb = PassiveServer("telco", b, "id", d / "telco")
    t = InMemoryTransport("bank", {"telco": with_client(sb, "bank")})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=WeakKeyWarning)
        model = ActiveParty("bank", a).fit(t, ["telco"], TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=3,
                                                                     max_depth=3))
    want = {p: ActiveParty.from_model(model).predict_proba(t, a, prediction=p)[1] for p in ("node", "one-round")}
    assert np.allclose(want["node"], want["one-round"])
    return sb, model, a, want


# --- 1. concurrent predictions ------------------------------------------------------------------
@pytest.mark.slow
def test_64_concurrent_predictions_over_grpc_all_succeed_identically(trained, serve, monkeypatch):
    """Before: at most 16 sessions, the 17th evicted one still in use ("unknown or expired
    prediction session"). Now sessions in use are never evicted; at the per-client limit (4
    here, to force it) a new one is refused "busy, retry" and the client retries."""
    sb, model, a, want = trained
    monkeypatch.setattr(sb, "MAX_SESSIONS_PER_CLIENT", 4)
    _, addr = serve(sb.handle_frame)
    results, errors, busy = {}, [], []
    start = threading.Barrier(64)

    def predict(i):
        prediction = "node" if i % 2 else "one-round"
        try:
            with GrpcTransport("bank", {"telco": addr}, INSECURE, timeout=60) as t:
                start.wait()
                results[i] = (prediction, ActiveParty.from_model(model).predict_proba(t, a, prediction=prediction)[1])
                busy.append(t.busy_waits["telco"])
        except Exception as exc:   # reported below
            errors.append(exc)

    threads = [threading.Thread(target=predict, args=(i,)) for i in range(64)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(180)
    assert not errors, errors[:3]
    assert len(results) == 64
    for prediction, proba in results.values():
        np.testing.assert_array_equal(proba, want[prediction])
    assert sum(busy) > 0                 # the limit was reached and the clients retried
    assert sb.open_sessions() == 0       # every session ended (PredictEnd, or its leaf masks)


def test_a_session_in_use_is_never_evicted_and_busy_carries_a_retry_hint(trained, monkeypatch):
    sb, model, a, _ = trained
    monkeypatch.setattr(sb, "MAX_SESSIONS_PER_CLIENT", 2)
    hashes = np.zeros((0, 16), np.uint8)
    h = with_client(sb, "bank")
    for sid in ("s1", "s2"):
        assert isinstance(loads(h(dumps(m.PredictStart(model.model_id, sid, hashes)))), m.Ack)
    reply = loads(h(dumps(m.PredictStart(model.model_id, "s3", hashes))))
    assert reply.kind == m.ErrorKind.BUSY and reply.retry_after > 0 and "busy" in reply.message
    # another client has its own allowance
    assert isinstance(loads(with_client(sb, "shop")(dumps(m.PredictStart(model.model_id, "x1", hashes)))), m.Ack)
    # s1 and s2 stay usable
    for sid in ("s1", "s2"):
        assert isinstance(loads(h(dumps(m.RouteRequest(sid, np.zeros(0, np.int64), np.zeros(0, np.int64))))),
                          m.RouteResponse)
    # an idle session may be evicted (not before SESSION_IDLE_SECONDS)
    monkeypatch.setattr(sb, "SESSION_IDLE_SECONDS", 0.0)
    assert isinstance(loads(h(dumps(m.PredictStart(model.model_id, "s3", hashes)))), m.Ack)
    assert sb.open_sessions("bank") == 2
    for sid in ("s1", "s2", "s3", "x1"):
        who = "shop" if sid == "x1" else "bank"
        assert isinstance(loads(with_client(sb, who)(dumps(m.PredictEnd(sid)))), m.Ack)
    assert sb.open_sessions() == 0


def test_the_client_gives_up_after_bounded_backoff():
    calls = []

    def always_busy(req):
        calls.append(time.monotonic())
        raise BusyError("full", retry_after=0.01)

    t = InMemoryTransport("bank", {"telco": frame_handler(always_busy)})
    t.busy_retries, t.busy_max_wait = 5, 10.0
    with pytest.raises(PeerBusyError, match=r"party 'telco' is busy \(still after 5 retries"):
        t.call("telco", m.PredictEnd("s"))
    assert len(calls) == 6
    gaps = np.diff(calls)
    assert gaps[-1] > gaps[0]            # backoff grows


# --- 2. a busy port -------------------------------------------------------------------------
def test_a_second_server_on_a_busy_port_refuses_to_start(serve):
    """Before: gRPC set SO_REUSEPORT and the second server started silently."""
    _, addr = serve(lambda frame, who: frame)
    port = addr.rsplit(":", 1)[1]
    second = PartyServer("telco2", lambda frame, who: frame, addr, INSECURE)
    with pytest.raises(InputError, match=f"cannot listen on 127.0.0.1:{port}: port {port} is in use"):
        second.start()


# --- 3. limits: stalled uploads, the caller's deadline, per-session locks, sizes ----------------
def test_stalled_uploads_are_cut_off_and_the_server_stays_responsive(serve, caplog):
    """Before: no read timeout; as many stalled uploads as workers blocked the server until the
    clients' deadlines (60 s here)."""
    grpc = require_grpc()
    fh = frame_handler(lambda req: m.Ack({"ok": 1}))
    server, addr = serve(lambda frame, who: fh(frame), max_workers=4, read_timeout=1.0)
    release = threading.Event()
    channel = grpc.insecure_channel(addr)
    stub = channel.stream_stream(EXCHANGE)

    def stalled():
        yield dumps(m.PredictEnd("s"))[:5]
        release.wait(30)

    calls = [stub(stalled(), timeout=60, metadata=[("x-vfl-party", "mallory")]) for _ in range(6)]
    raw = []                             # and raw sockets that stop in the middle of the HTTP/2 preface
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", int(addr.rsplit(":", 1)[1])))
        sock.sendall(b"PRI * HTTP/2.0\r\n")
        raw.append(sock)
    time.sleep(0.3)
    t0 = time.monotonic()
    with GrpcTransport("bank", {"telco": addr}, INSECURE, timeout=10) as t:
        assert t.call("telco", m.PredictEnd("s")).info == {"ok": 1}
    assert time.monotonic() - t0 < 8
    time.sleep(1.5)
    # mallory may hold 2 streams (half of the 4 workers): those are cut, the other 4 answered "busy"
    assert server._watch.cut >= 2 and server._streams.refused >= 4
    busy = 0
    for c in calls:
        try:
            reply = loads(b"".join(c))
        except grpc.RpcError:
            continue
        assert isinstance(reply, m.ErrorReply) and reply.kind == m.ErrorKind.BUSY
        busy += 1
    assert busy >= 4
    release.set()
    channel.close()
    for sock in raw:
        sock.close()


def test_work_stops_when_the_callers_deadline_passes(serve):
    stopped = {}

    def slow(req):
        t0 = time.monotonic()
        try:
            for _ in range(200):
                check_deadline("test work")
                time.sleep(0.05)
        except ProtocolError as exc:
            stopped["after"] = time.monotonic() - t0
            stopped["msg"] = str(exc)
            raise
        return m.Ack()

    _, addr = serve(lambda frame, who: frame_handler(slow)(frame))
    with GrpcTransport("bank", {"telco": addr}, INSECURE, timeout=0.5) as t:
        with pytest.raises(PeerError, match="did not answer within 0.5 s"):
            t.call("telco", m.PredictEnd("s"))
    for _ in range(50):
        if "after" in stopped:
            break
        time.sleep(0.1)
    assert stopped["after"] < 2.0 and "deadline passed" in stopped["msg"]
    with caller_deadline(lambda: True):
        check_deadline("x")              # a caller still waiting: no error
    check_deadline("x")                  # outside a server call: no error


def test_histogram_work_checks_the_deadline(trained):
    from parties.passive import PassiveParty
    a, b, _ = small_frames(n=40)
    p = PassiveParty("telco", b)
    t = InMemoryTransport("bank", {"telco": frame_handler(p.handle)})
    ActiveParty("bank", a).fit(t, ["telco"], TrainParams(mode="plain", n_estimators=1, max_depth=2))
    req = m.HistogramRequest(0, np.array([0], np.int32), np.array([0], np.int32), np.zeros((1, p.n_aligned), np.int32))
    p.handle(m.TrainSetup("plain", 8, "x"))
    from crypto.packing import PackingLayout
    from protocols.serialization import BigInts
    layout = PackingLayout.for_bounds(1.0, 0.25, p.n_aligned)
    p.handle(m.Gradients(0, False, layout.to_dict(), 1, BigInts([1] * p.n_aligned)))
    with caller_deadline(lambda: False):
        with pytest.raises(ProtocolError, match="deadline passed.*histograms stopped"):
            p.handle(req)
    assert isinstance(p.handle(req), m.CandidateResponse)      # issue 31: shuffled candidates, not per-bin sums


def test_prediction_does_not_wait_for_the_training_lock(trained):
    """Before: one global lock; a long training request blocked every prediction."""
    sb, model, a, want = trained
    done = threading.Event()
    holder_ready = threading.Event()

    def hold():
        with sb._train_lock:
            holder_ready.set()
            done.wait(20)

    th = threading.Thread(target=hold)
    th.start()
    holder_ready.wait(5)
    try:
        out = {}

        def predict():
            t = InMemoryTransport("bank", {"telco": with_client(sb, "bank")})
            out["p"] = ActiveParty.from_model(model).predict_proba(t, a, prediction="node")[1]

        pt = threading.Thread(target=predict)
        pt.start()
        pt.join(15)
        assert "p" in out
        np.testing.assert_array_equal(out["p"], want["node"])
    finally:
        done.set()
        th.join()


def _training_party(n=60):
    from parties.passive import PassiveParty
    a, b, _ = small_frames(n=n)
    p = PassiveParty("telco", b)
    t = InMemoryTransport("bank", {"telco": frame_handler(p.handle)})
    ActiveParty("bank", a).fit(t, ["telco"], TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=1,
                                                         max_depth=2))
    return p


def test_sizes_are_checked_against_the_session(trained):
    """Before: a Gradients message with 4,096-bit slots and 660 values per ciphertext, or a
    HistogramRequest naming 30,000 nodes, made the passive party work for minutes."""
    from crypto import schemes
    from crypto.keys import generate_keypair
    from crypto.packing import PackingLayout
    from protocols.serialization import BigInts
    p = _training_party()
    n = p.n_aligned
    p.handle(m.TrainSetup("he", 8, "x"))
    pk, sk = generate_keypair(KEY_BITS)
    p.handle(m.PublicKey(**schemes.public_key_fields(pk, sk)))
    huge = {"precision_bits": 20, "n_targets": 1, "max_rows": n, "g_max": 1, "h_max": 1, "g_bits": 2048,
            "h_bits": 2048}
    with pytest.raises(ProtocolError, match="Gradients.layout: 660 values of 4096 bits per ciphertext do not fit"):
        p.handle(m.Gradients(0, True, huge, 660, BigInts([1] * n)))
    layout = PackingLayout.for_bounds(1.0, 0.25, n)
    with pytest.raises(ProtocolError, match="max_rows=100000 but the training has"):
        p.handle(m.Gradients(0, True, {**layout.to_dict(), "max_rows": 100000}, 1, BigInts([1] * n)))
    p.handle(m.Gradients(0, True, layout.to_dict(), 1, BigInts([pk.nsquare - 1] * n)))
    a = np.zeros((1, n), np.int32)
    nodes = np.arange(30000, dtype=np.int32)
    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match=r"HistogramRequest.node_ids: 29999 nodes of tree 0 hold no row of the "
                                            r"round \(at most 256 may\)"):
        p.handle(m.HistogramRequest(0, np.zeros(30000, np.int32), nodes, a))
    assert time.monotonic() - t0 < 2
    with pytest.raises(ProtocolError, match="HistogramRequest.tree_idx: tree 3 is out of range"):
        p.handle(m.HistogramRequest(0, np.array([3], np.int32), np.array([0], np.int32), a))
    with pytest.raises(ProtocolError, match="HistogramRequest.assignment: 5 trees"):
        p.handle(m.HistogramRequest(0, np.array([0], np.int32), np.array([0], np.int32), np.zeros((5, n), np.int32)))
    with pytest.raises(ProtocolError, match="a node is named twice"):
        p.handle(m.HistogramRequest(0, np.array([0, 0], np.int32), np.array([0, 0], np.int32), a))
    assert isinstance(p.handle(m.HistogramRequest(0, np.array([0], np.int32), np.array([0], np.int32), a)),
                      m.CandidateResponse)           # issue 31: shuffled candidates, not per-bin sums
    # issue 31: a split is named by a candidate's position (CandidatePick), checked against the session too
    with pytest.raises(ProtocolError, match="CandidatePick.tree_idx: tree 1 is out of range"):
        p.handle(m.CandidatePick(0, np.array([0], np.int32), np.array([1], np.int32), np.array([1], np.int32),
                                 np.array([0], np.int32), np.array([-1], np.int32), np.array([True])))
    k = 300          # nodes the last answer did not offer candidates for: refused at the first, before any work
    with pytest.raises(ProtocolError, match="refuses CandidatePick.*node 1 of tree 0 has no candidates of the last "
                                            "answer"):
        p.handle(m.CandidatePick(0, np.arange(1, k + 1, dtype=np.int32), np.zeros(k, np.int32), np.ones(k, np.int32),
                                 np.zeros(k, np.int32), np.full(k, -1, np.int32), np.ones(k, bool)))
    assert len(p.records) == 0           # nothing was recorded by the refused requests


# --- 10. a training session belongs to its client ---------------------------------------------------
def test_a_training_session_belongs_to_the_client_that_opened_it(tmp_path):
    """Before: any accepted client could take over a training in progress (the first then got
    "a ciphertext is out of range" or "request before setup")."""
    a, b, _ = small_frames(n=60)
    sb = PassiveServer("telco", b, "id", tmp_path / "telco")
    mallory = InMemoryTransport("shop", {"telco": with_client(sb, "certificate shop")})
    interfered = []

    def meddle(round_idx, *_):
        for msg in (m.AlignRequest("evil", b"\0" * 16), m.TrainSetup("plain", 8, "evil"), m.TrainEnd("x", False)):
            with pytest.raises(PeerError, match="belongs to another client"):
                mallory.call("telco", msg)
            interfered.append(type(msg).__name__)

    t = InMemoryTransport("bank", {"telco": with_client(sb, "certificate bank")})
    params = TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=2, max_depth=2)
    model = ActiveParty("bank", a).fit(t, ["telco"], params, on_round=meddle)
    assert interfered and model.model_id in sb.models
    # the session is over: another client may now train
    ActiveParty("shop", a).fit(mallory, ["telco"], TrainParams(mode="plain", n_estimators=1, max_depth=1))


def test_a_training_session_is_bound_over_grpc_by_certificate(pki, serve, tmp_path):
    a, b, _ = small_frames(n=40)
    sb = PassiveServer("telco", b, "id", tmp_path / "telco")
    _, addr = serve(sb.handle_frame, security=tls(pki, "telco"))
    with GrpcTransport("bank", {"telco": addr}, tls(pki, "bank")) as bank, \
            GrpcTransport("shop", {"telco": addr}, tls(pki, "shop")) as shop:
        bank.call("telco", m.AlignRequest("s1", b"\1" * 16))
        with pytest.raises(PeerError, match="belongs to another client"):
            shop.call("telco", m.AlignRequest("s2", b"\2" * 16))
        bank.call("telco", m.AlignRequest("s3", b"\3" * 16))      # the owner may restart it


# --- 12. wrong or garbage replies name the peer, on both transports --------------------------------------
@pytest.mark.parametrize("reply", [dumps(m.Ack()), b"garbage", dumps(m.IdHashes(np.zeros((2, 8), np.uint8)))])
def test_wrong_and_garbage_replies_name_the_peer(serve, reply):
    pattern = "answered AlignRequest with Ack" if reply == dumps(m.Ack()) else "sent a malformed reply to AlignRequest"
    mem = InMemoryTransport("bank", {"telco": lambda frame: reply})
    with pytest.raises(PeerError, match=f"party 'telco' ({pattern})"):
        mem.call("telco", m.AlignRequest("s", b"\0" * 16))
    _, addr = serve(lambda frame, who: reply)
    with GrpcTransport("bank", {"telco": addr}, INSECURE, timeout=10) as t:
        with pytest.raises(PeerError, match=f"party 'telco' ({pattern})"):
            t.call("telco", m.AlignRequest("s", b"\0" * 16))


# --- 16. TLS on one side only ----------------------------------------------------------------------
@pytest.mark.parametrize("server_tls", [True, False])
def test_a_tls_mismatch_is_named_quickly(pki, serve, server_tls):
    """Before: the plaintext client waited the whole connect timeout, then "unavailable (did the
    process stop?)"."""
    fh = frame_handler(lambda req: m.Ack())
    _, addr = serve(lambda frame, who: fh(frame), security=tls(pki, "telco") if server_tls else INSECURE)
    assert probe_plaintext(addr) == ("other" if server_tls else "plaintext")
    client_sec = INSECURE if server_tls else tls(pki, "bank")
    t0 = time.monotonic()
    with GrpcTransport("bank", {"telco": addr}, client_sec, timeout=30) as t:
        with pytest.raises(PeerError, match="TLS mismatch"):
            t.connect()
    assert time.monotonic() - t0 < 10


def test_nothing_listening_is_not_a_tls_mismatch():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert probe_plaintext(f"127.0.0.1:{port}", timeout=1) is None
    with GrpcTransport("bank", {"telco": f"127.0.0.1:{port}"}, INSECURE, timeout=1) as t:
        with pytest.raises(PeerError, match="not reachable") as info:
            t.connect()
    assert "TLS mismatch" not in str(info.value)


# --- 13. malformed frames at a serving party: a refusal, never an internal error -------------------
def test_malformed_frames_never_reach_the_internal_error_path(trained, serve, caplog):
    sb, *_ = trained
    _, addr = serve(sb.handle_frame)
    grpc = require_grpc()
    with grpc.insecure_channel(addr) as ch:
        stub = ch.stream_stream(EXCHANGE)
        with caplog.at_level(logging.WARNING):
            for frame, field in malformed_frames():
                reply = loads(b"".join(stub(iter([frame]), timeout=10)))
                assert isinstance(reply, m.ErrorReply) and reply.kind == m.ErrorKind.PROTOCOL, field
                assert field in reply.message, (field, reply.message)
                assert "internal error" not in reply.message
    assert "Traceback" not in caplog.text and "failed on a request" not in caplog.text


def test_a_leaf_mask_request_is_bounded(trained, monkeypatch):
    """Before: a skeleton of millions of leaves made the party allocate rows x leaves bytes."""
    import parties.passive_predict as pp
    sb, model, a, _ = trained
    h = with_client(sb, "bank")
    hashes = __import__("protocols.alignment", fromlist=["hash_ids"]).hash_ids(a["id"].to_numpy()[:10],
                                                                              bytes.fromhex(model.salt))
    assert isinstance(loads(h(dumps(m.PredictStart(model.model_id, "big", hashes)))), m.Ack)
    monkeypatch.setattr(pp, "MAX_MASK_BYTES", 100)
    n = 2001           # one tree: a root and 1000 internal nodes in a chain, 1001 leaves
    left = np.full(n, -1, np.int32)
    right = np.full(n, -1, np.int32)
    for i in range(1000):
        left[2 * i], right[2 * i] = 2 * i + 1, 2 * i + 2
    reply = loads(h(dumps(m.LeafMaskRequest("big", np.array([n], np.int32), left, right,
                                            np.full(n, -1, np.int64)))))
    assert reply.kind == m.ErrorKind.PROTOCOL and "the masks of 10 rows would take 1260 bytes" in reply.message
    assert isinstance(loads(h(dumps(m.PredictEnd("big")))), m.Ack)
