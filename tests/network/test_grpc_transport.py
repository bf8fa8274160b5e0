"""The gRPC transport on real sockets (server in a thread of this process): authentication,
size caps, malformed frames, timeouts; and the pieces of network mode that need no socket
(passive server state, checkpoints, fan-out)."""
from __future__ import annotations

import ast
import hashlib
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from support import small_frames  # noqa: E402

import parties.server as server_mod  # noqa: E402
from parties.active import ActiveParty  # noqa: E402
from parties.checkpoint import Checkpoint  # noqa: E402
from parties.passive import PassiveParty  # noqa: E402
from parties.server import PassiveServer  # noqa: E402
from protocols import alignment  # noqa: E402
from protocols import messages as m  # noqa: E402
from protocols.certs import MissingDependency, make_certs  # noqa: E402
from protocols.grpc_client import GrpcTransport  # noqa: E402
from protocols.grpc_security import Security, parse_peers  # noqa: E402
from protocols.grpc_server import PartyServer  # noqa: E402
from protocols.serialization import loads  # noqa: E402
from protocols.transport import InMemoryTransport, frame_handler  # noqa: E402
from vfl.api import Federation  # noqa: E402
from vfl.core.errors import InputError, PeerError, ProtocolError  # noqa: E402
from vfl.core.params import TrainParams  # noqa: E402


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two CAs: the federation's (bank, telco, shop) and a stranger's (mallory, telco)."""
    d = tmp_path_factory.mktemp("pki")
    make_certs(d / "fed", ["bank", "telco", "shop"])
    make_certs(d / "other", ["mallory", "bank", "telco"])
    return d


def echo_handler(delay: float = 0.0):
    def handle(req):
        if isinstance(req, m.AlignRequest) and req.session_id == "boom":
            raise RuntimeError("a bug in the handler")
        time.sleep(delay)
        n = len(req.hashes) if isinstance(req, m.PredictStart) else 0
        return m.Ack({"type": type(req).__name__, "n": n})
    fh = frame_handler(handle)
    return lambda frame, who: fh(frame)


@pytest.fixture
def server_factory():
    servers = []

    def make(security, name="telco", handler=None, **kw):
        s = PartyServer(name, handler or echo_handler(), "127.0.0.1:0", security, **kw)
        port = s.start()
        servers.append(s)
        return f"127.0.0.1:{port}"

    yield make
    for s in servers:
        s.stop(grace=None)


def client(name, addr, security, peer="telco", **kw):
    return GrpcTransport(name, {peer: addr}, security, **kw)


def ok_call(t, peer="telco"):
    return t.call(peer, m.PredictStart("m", "s", np.zeros((3, 16), np.uint8))).info


def test_mutual_tls_accepts_the_federation_and_refuses_others(pki, server_factory):
    fed, other = pki / "fed", pki / "other"
    addr = server_factory(Security.from_options("telco", fed, allowed_clients=["bank"]))
    good = client("bank", addr, Security.from_options("bank", fed))
    assert good.connect(timeout=10)["telco"]["role"] == "passive"
    assert ok_call(good) == {"type": "PredictStart", "n": 3}

    # a certificate from another CA (even for the name 'bank'): the TLS handshake fails
    for name in ("bank", "mallory"):
        with pytest.raises(PeerError, match="TLS handshake with party 'telco'"):
            ok_call(client(name, addr, Security.from_options(name, other), timeout=5))
    # no certificate at all (plaintext client to a TLS server)
    with pytest.raises(PeerError, match="party 'telco'"):
        ok_call(client("bank", addr, Security(), timeout=5))
    # the federation's CA but a name the server does not accept
    with pytest.raises(PeerError, match="refused our credentials.*not among the allowed clients"):
        ok_call(client("shop", addr, Security.from_options("shop", fed), timeout=5))
    # a server whose certificate is not for the peer name we dial is not trusted
    with pytest.raises(PeerError, match="TLS handshake"):
        ok_call(client("bank", addr, Security.from_options("bank", fed), peer="shop", timeout=5), peer="shop")
    assert ok_call(good)["n"] == 3          # still serving
    good.close()


def test_token_is_required_and_checked(tmp_path, server_factory):
    tok = tmp_path / "tok"
    tok.write_text("correct-horse-battery-staple\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("incorrect-horse-battery-staple\n")
    addr = server_factory(Security.from_options("telco", insecure=True, token_file=tok))
    with pytest.raises(PeerError, match="refused our credentials.*no access token"):
        ok_call(client("bank", addr, Security()))
    with pytest.raises(PeerError, match="refused our credentials.*wrong access token"):
        ok_call(client("bank", addr, Security.from_options("bank", insecure=True, token_file=wrong)))
    with pytest.raises(PeerError, match="refused our credentials"):
        client("bank", addr, Security()).connect(timeout=2)
    assert ok_call(client("bank", addr, Security.from_options("bank", insecure=True, token_file=tok)))["n"] == 3
    short = tmp_path / "short"
    short.write_text("abc")
    with pytest.raises(InputError, match="at least 16"):
        Security.from_options("bank", insecure=True, token_file=short)


def test_oversized_malformed_and_failing_requests_are_refused_while_serving(server_factory):
    grpc = pytest.importorskip("grpc")
    addr = server_factory(Security(), max_frame_bytes=64 * 1024)
    t = client("bank", addr, Security(), timeout=10)
    with pytest.raises(PeerError, match="too large.*exceeds this party's cap"):
        t.call("telco", m.PredictStart("m", "s", np.zeros((10_000, 16), np.uint8)))      # 160 KB, announced
    # a client that does not announce the size: refused while streaming, after the cap
    stub = t._channels["telco"].stream_stream("/vfl.Party/Exchange")
    chunks = (bytes(32 * 1024) for _ in range(8))
    with pytest.raises(grpc.RpcError) as info:
        b"".join(stub(chunks, timeout=10))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # a frame announced larger than sent (truncated)
    with pytest.raises(grpc.RpcError) as info:
        b"".join(stub(iter([b"VFL1"]), timeout=10, metadata=[("x-vfl-frame-bytes", "100")]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # malformed frames and unknown types come back as ErrorReply
    assert "bad magic" in loads(t._exchange("telco", b"\x00" * 40)).message
    header = json.dumps({"type": "Popen", "fields": {}, "blobs": {}}).encode()
    reply = loads(t._exchange("telco", b"VFL1" + len(header).to_bytes(4, "little") + header))
    assert isinstance(reply, m.ErrorReply) and "unknown or unexpected message type 'Popen'" in reply.message
    # a bug in the handler: an error naming the party, and the server goes on
    with pytest.raises(PeerError, match="internal error at party 'telco': RuntimeError"):
        t.call("telco", m.AlignRequest("boom", bytes(16)))
    # the local cap refuses before sending
    small = client("bank", addr, Security(), max_frame_bytes=1024)
    with pytest.raises(InputError, match="more than the frame cap"):
        small.call("telco", m.PredictStart("m", "s", np.zeros((100, 16), np.uint8)))
    assert ok_call(t)["n"] == 3


def test_grpc_calls_check_the_declared_reply_type(server_factory):
    t = client("bank", server_factory(Security()), Security(), timeout=10)
    with pytest.raises(PeerError, match="party 'telco' answered AlignRequest with Ack, expected IdHashes"):
        t.call("telco", m.AlignRequest("s", bytes(16)))            # the echo server answers Ack
    with pytest.raises(PeerError, match="party 'telco' answered AlignRequest with Ack"):
        t.call_many({"telco": m.AlignRequest("s", bytes(16))})
    assert ok_call(t)["n"] == 3


def test_large_frames_are_streamed_in_chunks(server_factory):
    addr = server_factory(Security())
    t = client("bank", addr, Security(), timeout=30)
    n = 300_000                       # 4.8 MB > gRPC's 4 MiB per-message limit
    assert t.call("telco", m.PredictStart("m", "s", np.zeros((n, 16), np.uint8))).info["n"] == n
    assert t.bytes_report()["bank->telco"] > 16 * n


def big_reply_handler():
    def reply(req):         # a few rows: 40 kB each; many rows: one byte each
        n = len(req.hashes)
        return m.ScoreResponse(np.ones((n, 40_000 if n <= 1000 else 1), np.uint8), np.ones(n, bool))
    fh = frame_handler(reply)
    return lambda frame, who: fh(frame)


def test_small_requests_take_the_unary_call_and_large_ones_the_stream(server_factory, monkeypatch):
    """Issue 35: a request frame of at most one chunk goes as one message (/vfl.Party/Call), its
    reply as one message even beyond gRPC's 4 MiB default (up to the frame cap); a larger request
    streams in chunks (/vfl.Party/Exchange)."""
    addr = server_factory(Security(), handler=big_reply_handler())
    t = client("bank", addr, Security(), timeout=30)
    used = []
    for name in ("_call_stubs", "_exchange_stubs"):
        stub = getattr(t, name)["telco"]
        getattr(t, name)["telco"] = lambda *a, _s=stub, _n=name, **k: (used.append(_n), _s(*a, **k))[1]
    small = t.call("telco", m.ScoreRequest("ch", np.zeros((150, 16), np.uint8)))       # a 6 MB reply
    assert small.decisions.shape == (150, 40_000) and used == ["_call_stubs"]
    big = t.call("telco", m.ScoreRequest("ch", np.zeros((70_000, 16), np.uint8)))      # 1.1 MB request
    assert len(big.known) == 70_000 and used == ["_call_stubs", "_exchange_stubs"]
    capped = client("bank", addr, Security(), timeout=30, max_frame_bytes=5 << 20)
    with pytest.raises(PeerError, match="party 'telco'"):        # a one-message reply above our frame cap
        capped.call("telco", m.ScoreRequest("ch", np.zeros((150, 16), np.uint8)))
    huge = client("bank", addr, Security(), timeout=30, max_frame_bytes=4 << 30)   # past one message's 2 GiB
    calls = []
    huge._call_stubs["telco"] = lambda *a, **k: calls.append(1)
    assert huge.call("telco", m.ScoreRequest("ch", np.zeros((2, 16), np.uint8))).decisions.shape == (2, 40_000)
    assert calls == []                                            # every call streams


def test_a_server_without_the_call_method_is_served_by_the_stream(server_factory, monkeypatch):
    """An older passive party (no /vfl.Party/Call): UNIMPLEMENTED, before it ran anything; the
    client uses Exchange from then on, and the request is served once."""
    seen = []
    fh = frame_handler(lambda req: (seen.append(type(req).__name__), m.Ack({"n": 1}))[1])
    real_start = PartyServer.start

    def start_without_call(self):
        grpc = pytest.importorskip("grpc")
        orig = grpc.method_handlers_generic_handler

        def only_old(service, methods):
            return orig(service, {k: v for k, v in methods.items() if k != "Call"})
        monkeypatch.setattr(grpc, "method_handlers_generic_handler", only_old)
        try:
            return real_start(self)
        finally:
            monkeypatch.setattr(grpc, "method_handlers_generic_handler", orig)
    monkeypatch.setattr(PartyServer, "start", start_without_call)
    addr = server_factory(Security(), handler=lambda frame, who: fh(frame))
    t = client("bank", addr, Security(), timeout=10)
    assert t.call("telco", m.PredictStart("m", "s", np.zeros((3, 16), np.uint8))).info == {"n": 1}
    assert t._no_call == {"telco"} and seen == ["PredictStart"]
    assert t.call("telco", m.PredictStart("m", "s", np.zeros((3, 16), np.uint8))).info == {"n": 1}
    assert seen == ["PredictStart", "PredictStart"]


def test_timeout_names_the_peer_and_marks_it_failed(server_factory):
    addr = server_factory(Security(), handler=echo_handler(delay=3.0))
    t = client("bank", addr, Security(), timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(PeerError, match=r"party 'telco' at 127\.0\.0\.1:\d+ did not answer within 0.5 s"):
        ok_call(t)
    assert time.monotonic() - t0 < 2.5
    with pytest.raises(PeerError, match="failed earlier"):
        ok_call(t)


def test_unreachable_peer_and_wrong_party_at_an_address(server_factory):
    addr = server_factory(Security(), name="telco")
    with pytest.raises(PeerError, match="is party 'telco', not 'shop'"):
        GrpcTransport("bank", {"shop": addr}, Security()).connect(timeout=5)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(PeerError, match=r"party 'shop' at 127\.0\.0\.1:\d+ is not reachable after 1 s"):
        GrpcTransport("bank", {"shop": f"127.0.0.1:{free}"}, Security()).connect(timeout=1)
    assert time.monotonic() - t0 < 5


def test_concurrent_call_many_and_address_parsing(server_factory):
    # two calls of 1 s each: served one after the other they take 2 s; at once, 1 s and the overhead
    a = server_factory(Security(), name="telco", handler=echo_handler(delay=1.0))
    b = server_factory(Security(), name="shop", handler=echo_handler(delay=1.0))
    t = GrpcTransport("bank", {"telco": a, "shop": b}, Security(), timeout=10)
    t0 = time.monotonic()
    replies = t.call_many({p: m.PredictStart("m", "s", np.zeros((2, 16), np.uint8)) for p in ("telco", "shop")})
    assert time.monotonic() - t0 < 1.9             # both served at once
    assert set(replies) == {"telco", "shop"}
    assert parse_peers(["a=1.2.3.4:5", "b=[::1]:7"]) == {"a": "1.2.3.4:5", "b": "[::1]:7"}
    for bad in ["a", "a=host", "=h:1", "a=h:99999"]:
        with pytest.raises(InputError, match="HOST:PORT"):
            parse_peers([bad])
    with pytest.raises(InputError, match="given twice"):
        parse_peers(["a=h:1", "a=h:2"])


def test_missing_grpc_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc", None)
    with pytest.raises(MissingDependency, match=r"pip install '\.\[net\]'"):
        GrpcTransport("bank", {"telco": "127.0.0.1:1"}, Security())
    monkeypatch.setitem(sys.modules, "cryptography", None)
    with pytest.raises(MissingDependency, match="cryptography.*pip install"):
        make_certs("/nonexistent-never-created", ["a"])


def test_security_options_and_certificate_checks(pki, tmp_path):
    with pytest.raises(InputError, match="--tls-dir DIR .* or, for plaintext"):
        Security.from_options("bank")
    with pytest.raises(InputError, match="not both"):
        Security.from_options("bank", pki / "fed", insecure=True)
    with pytest.raises(InputError, match="lacks ca.pem, nobody.pem, nobody.key"):
        Security.from_options("nobody", tmp_path)
    (tmp_path / "ca.pem").write_bytes((pki / "fed" / "ca.pem").read_bytes())
    (tmp_path / "shop.pem").write_bytes((pki / "fed" / "bank.pem").read_bytes())
    (tmp_path / "shop.key").write_bytes((pki / "fed" / "bank.key").read_bytes())
    with pytest.raises(InputError, match=r"issued for \['bank'\], not for party 'shop'"):
        Security.from_options("shop", tmp_path)
    with pytest.raises(InputError, match="needs --tls-dir"):
        Security.from_options("bank", insecure=True, allowed_clients=["x"])
    with pytest.raises(InputError, match="DNS label"):
        make_certs(tmp_path / "c", ["bad_name"])
    with pytest.raises(InputError, match="bank.pem and .*bank.key already exist"):
        make_certs(pki / "fed", ["bank"])
    assert (pki / "fed" / "bank.key").stat().st_mode & 0o077 == 0       # private keys are private


# --- without sockets: the passive server's state, checkpoints, fan-out ------------------------------
def _server(tmp_path, frame, name="b", policy=None):
    return PassiveServer(name, frame, "id", tmp_path / name, policy=policy)


def _fit(active, server_map, params, transport_cls=InMemoryTransport, **kw):
    t = transport_cls(active.name, {n: s.handle_frame for n, s in server_map.items()})
    return active.fit(t, list(server_map), params, **kw), t


def test_passive_server_persists_and_serves_models(tmp_path):
    a, b, c = small_frames()
    params = TrainParams(mode="plain", n_estimators=3, max_depth=2)
    sb, sc = _server(tmp_path, b, "b"), _server(tmp_path, c, "c")
    model, t = _fit(ActiveParty("a", a), {"b": sb, "c": sc}, params)
    ref = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)])
    ref.fit(params)
    f = tmp_path / "b" / f"{model.model_id}.json"
    assert json.loads(f.read_text())["completed"] is True
    # a restarted server loads the model and answers predictions like the in-memory federation
    sb2, sc2 = _server(tmp_path, b, "b"), _server(tmp_path, c, "c")
    assert model.model_id in sb2.models
    pred = ActiveParty.from_model(model)
    t2 = InMemoryTransport("a", {"b": sb2.handle_frame, "c": sc2.handle_frame})
    np.testing.assert_allclose(pred.predict_proba(t2, a)[1], ref.predict_proba(), atol=1e-12)
    # wrong model, bad model id, a training message without a session
    with pytest.raises(InputError, match="holds no model 'nope'"):
        t2.call("b", m.PredictStart("nope", "s", np.zeros((1, 16), np.uint8)))
    sb2.handle(m.AlignRequest("s1", bytes(16)))
    with pytest.raises(ProtocolError, match="model id '../../etc/passwd' is not acceptable"):
        sb2.handle(m.TrainSetup("plain", 8, "../../etc/passwd"))
    # (a finished model set up again: see tests/parties/test_files_integrity.py, only TrainResume may follow)
    # a second model trained by the same server: both are served, each by its own model id
    model2, _ = _fit(ActiveParty("a", a), {"b": sb2, "c": sc2}, TrainParams(mode="plain", n_estimators=2,
                                                                            max_depth=3))
    assert set(sb2.models) == {model.model_id, model2.model_id} and len(list((tmp_path / "b").glob("*.json"))) == 2
    ref2 = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)])
    ref2.fit(TrainParams(mode="plain", n_estimators=2, max_depth=3))
    np.testing.assert_allclose(ActiveParty.from_model(model2).predict_proba(t2, a)[1], ref2.predict_proba(),
                               atol=1e-12)
    np.testing.assert_allclose(pred.predict_proba(t2, a)[1], ref.predict_proba(), atol=1e-12)
    with pytest.raises(ProtocolError, match="does not accept Ack"):
        sb2.handle(m.Ack())
    with pytest.raises(ProtocolError, match="no training session"):
        _server(tmp_path, b, "b").handle(m.HistogramRequest(0, np.zeros(1, np.int32), np.zeros(1, np.int32),
                                                            np.zeros((1, 3), np.int32)))


class _Dies(Exception):
    pass


def test_checkpoint_resume_in_memory_gives_the_uninterrupted_model(tmp_path):
    a, b, c = small_frames(n=150)
    params = TrainParams(mode="plain", n_estimators=5, max_depth=3)
    full, _ = _fit(ActiveParty("a", a), {"b": _server(tmp_path / "full", b, "b"),
                                         "c": _server(tmp_path / "full", c, "c")}, params)
    sb, sc = _server(tmp_path, b, "b"), _server(tmp_path, c, "c")
    saved = []

    def stop_after_two(r, info):
        if r == 1:
            raise _Dies()

    with pytest.raises(_Dies):
        _fit(ActiveParty("a", a), {"b": sb, "c": sc}, params, on_round=stop_after_two,
             checkpoint=saved.append)
    ck = saved[-1]
    assert ck.n_rounds == 2 and ck.completed is False
    ck.save(tmp_path / "ck.json")
    ck = Checkpoint.load(tmp_path / "ck.json")
    assert "private" not in json.dumps(ck.to_dict()).lower()
    # resuming with other data or other parameters is refused
    a2 = a.copy()
    a2.loc[0, "a0"] += 1.0
    with pytest.raises(InputError, match="aligned training data differ"):
        _fit(ActiveParty("a", a2), {"b": _server(tmp_path, b, "b"), "c": _server(tmp_path, c, "c")}, params,
             resume=ck)
    with pytest.raises(InputError, match="max_depth 3 -> 2"):
        _fit(ActiveParty("a", a), {"b": _server(tmp_path, b, "b"), "c": _server(tmp_path, c, "c")},
             TrainParams(mode="plain", n_estimators=5, max_depth=2), resume=ck)
    with pytest.raises(InputError, match="dp-mode training cannot be resumed"):
        _fit(ActiveParty("a", a), {"b": _server(tmp_path, b, "b"), "c": _server(tmp_path, c, "c")},
             TrainParams(mode="dp", n_estimators=5, max_depth=3, epsilon=1.0), resume=ck)
    b2 = b.copy()
    b2.loc[3, "b0"] = 7.0
    with pytest.raises(InputError, match="party 'b': its training data changed"):
        _fit(ActiveParty("a", a), {"b": _server(tmp_path, b2, "b"), "c": _server(tmp_path, c, "c")}, params,
             resume=ck)
    # passive servers restart from their files
    sb, sc = _server(tmp_path, b, "b"), _server(tmp_path, c, "c")
    resumed, _ = _fit(ActiveParty("a", a), {"b": sb, "c": sc}, params, resume=ck)
    assert resumed.model_id == ck.model_id and resumed.n_rounds == 5
    for r1, r2 in zip(full.rounds, resumed.rounds):
        for t1, t2 in zip(r1, r2):
            assert [n[:2] + n[3:] for n in t1.structure()] == [n[:2] + n[3:] for n in t2.structure()]
            np.testing.assert_allclose([n.value for n in t1.nodes], [n.value for n in t2.nodes], rtol=1e-12)


def test_resume_refused_when_a_passive_lost_its_table(tmp_path):
    a, b, c = small_frames(n=150)
    params = TrainParams(mode="plain", n_estimators=4, max_depth=3)
    saved = []

    def stop(r, info):
        if r == 1:
            raise _Dies()

    with pytest.raises(_Dies):
        _fit(ActiveParty("a", a), {"b": _server(tmp_path, b, "b"), "c": _server(tmp_path, c, "c")}, params,
             on_round=stop, checkpoint=saved.append)
    with pytest.raises(InputError, match="party 'b' has no saved lookup table"):
        _fit(ActiveParty("a", a), {"b": _server(tmp_path / "elsewhere", b, "b"), "c": _server(tmp_path, c, "c")},
             params, resume=saved[-1])


class _ConcurrentMemory(InMemoryTransport):
    concurrent = True


def test_fan_out_to_several_passives_gives_the_same_model(tmp_path):
    """With a concurrent transport the passive parties are asked in parallel; same trees."""
    from parties.remote import source_map

    a, b, c = small_frames()
    params = TrainParams(mode="plain", n_estimators=3, max_depth=3)
    calls = []

    class Concurrent(InMemoryTransport):
        concurrent = True

        def call(self, peer, message):
            calls.append((threading.current_thread().name, type(message).__name__))
            return super().call(peer, message)

    m1, _ = _fit(ActiveParty("a", a), {"b": _server(tmp_path, b, "b"), "c": _server(tmp_path, c, "c")}, params,
                 Concurrent)
    assert any(th.startswith("vfl-fanout") and kind == "HistogramRequest" for th, kind in calls)
    ref = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)])
    ref.fit(params)
    for r1, r2 in zip(m1.rounds, ref.model.rounds):
        for t1, t2 in zip(r1, r2):
            assert [n[:2] + n[3:] for n in t1.structure()] == [n[:2] + n[3:] for n in t2.structure()]
            np.testing.assert_allclose([n.value for n in t1.nodes], [n.value for n in t2.nodes], rtol=1e-12)
    assert source_map(Concurrent("a", {}), [object()]) is None     # nothing to run side by side


def test_passive_server_handles_requests_from_threads(tmp_path):
    """The server serializes requests: concurrent prediction sessions do not mix."""
    a, b, c = small_frames()
    params = TrainParams(mode="plain", n_estimators=2, max_depth=2)
    sb = _server(tmp_path, b, "b")
    model, _ = _fit(ActiveParty("a", a), {"b": sb}, params)
    results, errors = [], []

    def predict():
        try:
            t = InMemoryTransport("a", {"b": sb.handle_frame})
            results.append(ActiveParty.from_model(model).predict_proba(t, a)[1])
        except Exception as exc:   # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=predict) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and len(results) == 4
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_active_process_dies_without_notice_then_resumes(tmp_path):
    """The active party vanishes mid-training (no TrainEnd): the passive servers keep their tables;
    the restarted active party resumes from its checkpoint with the same servers."""
    a, b, c = small_frames(n=150)
    params = TrainParams(mode="plain", n_estimators=4, max_depth=3)
    full, _ = _fit(ActiveParty("a", a), {"b": _server(tmp_path / "full", b, "b"),
                                         "c": _server(tmp_path / "full", c, "c")}, params)

    class Vanishing(InMemoryTransport):
        rounds = 0

        def call(self, peer, message):
            if isinstance(message, m.GradientsStart) and message.round_idx == 2:
                raise _Dies()                 # dies in round 2, after some messages of it
            if isinstance(message, m.TrainEnd):
                raise AssertionError("a dead process sends nothing")
            return super().call(peer, message)

    sb, sc = _server(tmp_path, b, "b"), _server(tmp_path, c, "c")
    saved = []
    with pytest.raises(_Dies):
        _fit(ActiveParty("a", a), {"b": sb, "c": sc}, params, Vanishing, checkpoint=saved.append)
    assert sb.training is not None and saved[-1].n_rounds == 2
    resumed, _ = _fit(ActiveParty("a", a), {"b": sb, "c": sc}, params, resume=saved[-1])
    for r1, r2 in zip(full.rounds, resumed.rounds):
        for t1, t2 in zip(r1, r2):
            assert [n[:2] + n[3:] for n in t1.structure()] == [n[:2] + n[3:] for n in t2.structure()]
    got = json.loads((tmp_path / "b" / f"{resumed.model_id}.json").read_text())
    want = json.loads((tmp_path / "full" / "b" / f"{full.model_id}.json").read_text())
    assert got["completed"] is True and got["records"] == want["records"]


def _same_trees(m1, m2):
    assert m1.n_rounds == m2.n_rounds
    for r1, r2 in zip(m1.rounds, m2.rounds):
        for t1, t2 in zip(r1, r2):
            assert [n[:2] + n[3:] for n in t1.structure()] == [n[:2] + n[3:] for n in t2.structure()]
            np.testing.assert_allclose([n.value for n in t1.nodes], [n.value for n in t2.nodes], rtol=1e-12)


def test_passive_server_with_psi_one_round_prediction_and_policies(tmp_path):
    a, b, c = small_frames()
    psi_only = {"allowed_align": ("psi",)}
    sb, sc = _server(tmp_path, b, "b", psi_only), _server(tmp_path, c, "c")
    model, _ = _fit(ActiveParty("a", a), {"b": sb, "c": sc},
                    TrainParams(mode="plain", n_estimators=2, max_depth=3, align="psi"))
    ref = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)])
    ref.fit(TrainParams(mode="plain", n_estimators=2, max_depth=3))
    _same_trees(model, ref.model)
    want = ref.predict_proba()
    # a restarted server keeps serving the model, with its policy
    sb2, sc2 = _server(tmp_path, b, "b", psi_only), _server(tmp_path, c, "c")
    t = InMemoryTransport("a", {"b": sb2.handle_frame, "c": sc2.handle_frame})
    pred = ActiveParty.from_model(model)
    for prediction in ("one-round", "node"):
        np.testing.assert_allclose(pred.predict_proba(t, a, prediction=prediction, align="psi")[1], want,
                                   atol=1e-12)
    np.testing.assert_allclose(pred.predict_proba(t, a)[1], want, atol=1e-12)     # as trained: psi
    with pytest.raises(PeerError, match="party 'b' does not allow alignment by 'hash'"):
        pred.predict_proba(t, a, align="hash")
    with pytest.raises(PeerError, match="party 'b' does not allow alignment by 'hash'"):
        _fit(ActiveParty("a", a), {"b": sb2, "c": sc2}, TrainParams(mode="plain", n_estimators=1))
    node_only = _server(tmp_path, b, "b", {"allowed_prediction": ("node",)})
    t3 = InMemoryTransport("a", {"b": node_only.handle_frame, "c": sc2.handle_frame})
    with pytest.raises(PeerError, match="does not allow prediction by 'one-round'"):
        pred.predict_proba(t3, a, prediction="one-round")
    with pytest.raises(InputError, match="unknown passive-party policy"):
        _server(tmp_path, b, "b", {"allowed_everything": True})


def test_dp_mode_through_the_passive_server(tmp_path):
    a, b, c = small_frames()
    params = TrainParams(mode="dp", n_estimators=2, max_depth=3, epsilon=float("inf"))   # no noise: comparable
    sb, sc = _server(tmp_path, b, "b"), _server(tmp_path, c, "c")
    model, _ = _fit(ActiveParty("a", a), {"b": sb, "c": sc}, params)
    ref = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)])
    ref.fit(params)
    _same_trees(model, ref.model)
    d = json.loads((tmp_path / "b" / f"{model.model_id}.json").read_text())
    assert d["completed"] is True and d["records"] and "dp_release" in d
    t = InMemoryTransport("a", {"b": _server(tmp_path, b, "b").handle_frame,
                                "c": _server(tmp_path, c, "c").handle_frame})
    np.testing.assert_allclose(ActiveParty.from_model(model).predict_proba(t, a)[1], ref.predict_proba(),
                               atol=1e-12)
    capped = _server(tmp_path / "capped", b, "b", {"dp_max_epsilon_per_feature": 0.5})
    with pytest.raises(InputError, match="releases at most epsilon_per_feature=0.5"):
        _fit(ActiveParty("a", a), {"b": capped}, TrainParams(mode="dp", n_estimators=1, epsilon_per_feature=1.0))


# --- the server sees a passive party only through its public accessors --------------------------
def _public_only(party):
    """``party`` seen through its public attributes only: reaching for a private one raises."""
    class PublicOnly:
        def __getattr__(self, name):
            if name.startswith("_"):
                raise AttributeError(f"the server reached into the passive party: {name}")
            return getattr(party, name)

        def __setattr__(self, name, value):
            if name.startswith("_"):
                raise AttributeError(f"the server reached into the passive party: {name}")
            setattr(party, name, value)
    return PublicOnly()


class _PublicOnlyParty:
    """Stands in for PassiveParty in parties.server: every party it makes hides its privates."""
    accepts = staticmethod(PassiveParty.accepts)

    def __new__(cls, *args, **kw):
        return _public_only(PassiveParty(*args, **kw))

    @staticmethod
    def from_model_dict(d, source="passive model"):
        return _public_only(PassiveParty.from_model_dict(d, source))


def test_server_code_touches_no_private_attribute_of_another_object():
    tree = ast.parse(Path(server_mod.__file__).read_text())
    reached = [(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
               and not (isinstance(node.value, ast.Name) and node.value.id == "self")]
    assert reached == []


def test_server_serves_a_passive_party_whose_privates_are_hidden(tmp_path, monkeypatch):
    """Training with a validation set, an interrupted training resumed, predictions by hash and PSI,
    node by node and in one round: all through PassiveParty's public accessors."""
    monkeypatch.setattr(server_mod, "PassiveParty", _PublicOnlyParty)
    with pytest.raises(AttributeError, match="reached into the passive party: _state"):
        _PublicOnlyParty("b", small_frames()[1])._state
    (a, b, c), cut = small_frames(n=200), 150
    (a, va), (b, vb), (c, vc) = [(f.iloc[:cut], f.iloc[cut:]) for f in (a, b, c)]

    def servers(d):
        return {n: PassiveServer(n, f, "id", d / n, validation_frame=v) for n, f, v in (("b", b, vb), ("c", c, vc))}

    params = TrainParams(mode="plain", n_estimators=4, max_depth=3)
    ref = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)])
    ref.fit(params, validation={"a": va, "b": vb, "c": vc})
    saved = []

    def die(r, info):
        if r == 1:
            raise _Dies()

    with pytest.raises(_Dies):
        _fit(ActiveParty("a", a), servers(tmp_path), params, validation=va, on_round=die, checkpoint=saved.append)
    model, _ = _fit(ActiveParty("a", a), servers(tmp_path), params, validation=va, resume=saved[-1])
    _same_trees(model, ref.model)
    assert model.history == ref.model.history
    restarted = servers(tmp_path)
    assert all(model.model_id in s.models for s in restarted.values())
    t = InMemoryTransport("a", {n: s.handle_frame for n, s in restarted.items()})
    pred = ActiveParty.from_model(model)
    for prediction in ("one-round", "node"):
        for align in ("hash", "psi"):
            np.testing.assert_allclose(pred.predict_proba(t, a, prediction=prediction, align=align)[1],
                                       ref.predict_proba(), atol=1e-12)


def test_passive_data_digest_keeps_the_value_saved_lookup_tables_hold():
    """parties.checkpoint.data_digest gives the fingerprint unfinished lookup tables were written
    with (feature names and aligned rows; no ids, no labels), so their trainings still resume."""
    a, b, _ = small_frames(60)
    p = PassiveParty("b", b.iloc[::-1])
    Federation(ActiveParty("a", a.iloc[::2]), [p]).fit(TrainParams(mode="plain", n_estimators=1, max_depth=1))
    kept = b.iloc[::2]          # the common rows, in the canonical order: by salted id hash
    keys = alignment.hashes_to_keys(alignment.hash_ids(kept["id"].to_numpy(), p.salt))
    X = kept[["b0", "b1"]].to_numpy()[sorted(range(len(kept)), key=keys.__getitem__)]
    assert p.n_aligned == 30 and np.array_equal(p.aligned_features(), X)
    old = hashlib.sha256(json.dumps(["b0", "b1"]).encode())
    old.update(np.ascontiguousarray(X).tobytes())
    assert PassiveServer._data_digest(p) == old.hexdigest()


def test_dp_mode_with_noise_and_a_ledger_through_the_passive_server(tmp_path):
    """Mode dp with noise through the server: the policy's ledger charges the edges and the release,
    the next training past the lifetime budget is refused, and the training rows are never routed."""
    from parties.dp_ledger import PrivacyLedger, summary
    a, b, c = small_frames()
    ledger = tmp_path / "b.ledger.json"
    sb = _server(tmp_path, b, "b", {"dp_ledger_path": str(ledger), "dp_lifetime_epsilon": 3.0})
    params = TrainParams(mode="dp", n_estimators=2, max_depth=2, epsilon=2.0, dp_select=None)
    model, _ = _fit(ActiveParty("a", a), {"b": sb}, params)
    (entry,) = summary(PrivacyLedger(ledger).read()).values()
    assert entry["epsilon"] == pytest.approx(2.0) and set(entry["kinds"]) == {"dp-edges", "dp-release"}
    with pytest.raises(PeerError, match="lifetime budget 3"):
        _fit(ActiveParty("a", a), {"b": sb}, params)
    t = InMemoryTransport("a", {"b": _server(tmp_path, b, "b").handle_frame})
    with pytest.raises(PeerError, match="refuses to route"):
        ActiveParty.from_model(model).predict_proba(t, a)
