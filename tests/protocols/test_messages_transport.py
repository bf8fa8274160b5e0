"""Serialization (bytes, never pickle), malformed frames, transports, alignment."""
import json
import struct

import gmpy2
import numpy as np
import pytest

from crypto.packing import PackingLayout
from parties.passive import PassiveParty
from protocols import alignment
from protocols import messages as m
from protocols.serialization import _REGISTRY, MAGIC, BigInts, dumps, loads
from protocols.transport import InMemoryTransport, frame_handler
from vfl.core.errors import InputError, PeerError, ProtocolError


def _roundtrip(msg):
    frame = dumps(msg)
    assert isinstance(frame, bytes) and frame[:4] == MAGIC
    assert b"pickle" not in frame and b"\x80\x04" not in frame[:16]
    back = loads(frame)
    assert type(back) is type(msg)
    return back


def test_messages_round_trip_with_arrays_and_big_integers():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    back = _roundtrip(m.HistogramRequest(3, np.array([0], np.int32), np.array([5], np.int32), a))
    assert back.round_idx == 3 and back.node_ids.tolist() == [5]
    assert back.assignment.dtype == np.int32 and np.array_equal(back.assignment, a)
    big = [gmpy2.mpz(2) ** 2047 + 12345, gmpy2.mpz(1), gmpy2.mpz(0)]
    layout = PackingLayout.for_bounds(1.0, 0.25, 100).to_dict()
    back = _roundtrip(m.Gradients(0, True, layout, 12, BigInts(big)))
    assert [int(v) for v in back.values] == [int(v) for v in big]
    signed = [-(2 ** 90), 2 ** 90, -1, 0]
    back = _roundtrip(m.HistogramResponse(4, BigInts(signed)))
    assert [int(v) for v in back.values] == signed
    back = _roundtrip(m.AlignRequest("s", b"\x00" * 16))
    assert back.salt == b"\x00" * 16
    back = _roundtrip(m.SplitResponse(np.array([1, 2]), np.array([True, False, True]), np.array([1, 2])))
    assert back.go_left.dtype == bool and back.go_left.tolist() == [True, False, True]


def test_ciphertexts_travel_as_fixed_width_big_endian():
    vals = [gmpy2.mpz(1), gmpy2.mpz(2) ** 100]
    frame = dumps(m.HistogramResponse(2, BigInts(vals)))
    header_len = struct.unpack("<I", frame[4:8])[0]
    header = json.loads(frame[8:8 + header_len])
    desc = header["blobs"]["values"]
    assert desc["width"] == 13 and desc["count"] == 2 and not desc["signed"]
    payload = frame[8 + header_len:]
    assert payload == (1).to_bytes(13, "big") + (2 ** 100).to_bytes(13, "big")


def _frame(header: dict, payload: bytes = b"") -> bytes:
    h = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(h)) + h + payload


@pytest.mark.parametrize("frame", [
    b"",
    b"XXXX\x00\x00\x00\x00",
    MAGIC + struct.pack("<I", 10 ** 9),
    _frame({"type": "NoSuchMessage", "fields": {}, "blobs": {}}),
    _frame({"type": "Ack", "fields": {"info": {}, "extra": 1}, "blobs": {}}),
    _frame({"type": "AlignAck", "fields": {"n_rows": "many", "n_kept": 1}, "blobs": {}}),
    _frame({"type": "IdHashes", "fields": {}, "blobs": {"hashes": {
        "kind": "ndarray", "dtype": "|O", "shape": [1], "offset": 0, "nbytes": 8}}}, b"\0" * 8),
    _frame({"type": "IdHashes", "fields": {}, "blobs": {"hashes": {
        "kind": "ndarray", "dtype": "<i8", "shape": [5], "offset": 0, "nbytes": 40}}}, b"\0" * 8),
    _frame({"type": "HistogramResponse", "fields": {"n_values": 1}, "blobs": {"values": {
        "kind": "bigints", "count": 3, "width": 4, "signed": False, "offset": 0, "nbytes": 12}}}, b"\0" * 11),
    MAGIC + struct.pack("<I", 3) + b"{{{",
])
def test_malformed_frames_are_protocol_errors(frame):
    with pytest.raises(ProtocolError):
        loads(frame)


def test_in_memory_transport_counts_bytes_both_ways_and_reports_errors():
    def handle(msg):
        if isinstance(msg, m.PublicKey):
            raise InputError("bad key")
        return m.Ack({"echo": 1})

    t = InMemoryTransport("a", {"b": frame_handler(handle)}, record=True)
    reply = t.call("b", m.TrainEnd("x", True))
    assert reply.info == {"echo": 1}
    sent, back = t.log[0][2], t.log[1][2]
    assert t.bytes_sent[("a", "b")] == len(sent) and t.bytes_sent[("b", "a")] == len(back)
    with pytest.raises(InputError, match="party 'b': bad key"):
        t.call("b", m.PublicKey("ff"))
    with pytest.raises(PeerError, match="no party named 'c'"):
        t.call("c", m.PublicKey("ff"))
    # a garbage frame sent straight to the handler gets an ErrorReply, not a crash
    assert isinstance(loads(frame_handler(handle)(b"garbage")), m.ErrorReply)


def test_a_reply_of_an_undeclared_type_is_a_peer_error_naming_peer_request_and_reply():
    wrong = {"b": frame_handler(lambda req: m.Ack())}           # answers Ack to everything
    t = InMemoryTransport("a", wrong)
    req = m.HistogramRequest(0, np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros((1, 3), np.int32))
    with pytest.raises(PeerError, match=r"party 'b' answered HistogramRequest with Ack, expected HistogramResponse"):
        t.call("b", req)
    with pytest.raises(PeerError, match=r"party 'b' answered AlignRequest with Ack, expected IdHashes"):
        t.call_many({"b": m.AlignRequest("s", bytes(16))})
    assert t.call("b", m.PublicKey("ff")) == m.Ack()             # a declared reply passes
    # only requests can be sent: a reply type is refused before any byte goes out
    with pytest.raises(ProtocolError, match="IdHashes is not a request"):
        t.call("b", m.IdHashes(np.zeros((1, 16), np.uint8)))
    assert t.messages_sent[("a", "b")] == 3


def test_every_message_is_a_declared_request_or_a_declared_reply():
    replies = {r for rs in m.REPLIES.values() for r in rs}
    assert set(_REGISTRY.values()) == set(m.REPLIES) | replies | {m.ErrorReply}
    assert not set(m.REPLIES) & replies                        # no message is both
    # every request the passive party serves has a declared reply
    served = {name[len("_on_"):] for name in dir(PassiveParty) if name.startswith("_on_")}
    assert served <= {t.__name__ for t in m.REPLIES}


def test_protocol_words_are_enums_with_unchanged_wire_bytes():
    assert dumps(m.ErrorReply(m.ErrorKind.INPUT, "x")) == dumps(m.ErrorReply("input", "x"))
    back = loads(dumps(m.ErrorReply("protocol", "x")))
    assert back.kind is m.ErrorKind.PROTOCOL and back.kind == "protocol"
    req = loads(dumps(m.PsiRequest("s", bytes(16), "validate", "m", np.zeros((1, 32), np.uint8))))
    assert req.purpose is m.PsiPurpose.VALIDATE and f"{req.purpose}" == "validate"
    with pytest.raises(ProtocolError, match=r"ErrorReply\.kind: 'oops' is not one of \['busy', 'input', 'protocol'\]"):
        loads(dumps(m.ErrorReply("oops", "x")))
    # an input error at the peer is the caller's InputError, a protocol error its PeerError
    for kind, exc in ((m.ErrorKind.INPUT, InputError), (m.ErrorKind.PROTOCOL, PeerError)):
        t = InMemoryTransport("a", {"b": lambda frame, kind=kind: dumps(m.ErrorReply(kind, "no"))})
        with pytest.raises(exc, match="party 'b'"):
            t.call("b", m.PublicKey("ff"))


def test_alignment_hashes_intersection_and_errors():
    salt = b"s" * 16
    ha = alignment.hash_ids([1, 2, 3, 4], salt)
    hb = alignment.hash_ids(["3", "4", "5"], salt)         # same ids as strings match
    assert ha.shape == (4, 16) and ha.dtype == np.uint8
    common = alignment.intersect({"a": ha, "b": hb})
    assert len(common) == 2
    assert alignment.positions(ha, common, "a").tolist() in ([2, 3], [3, 2])
    assert not np.array_equal(alignment.hash_ids([1], salt), alignment.hash_ids([1], b"t" * 16))
    with pytest.raises(InputError, match="duplicate"):
        alignment.intersect({"a": alignment.hash_ids([1, 1], salt), "b": hb})
    with pytest.raises(InputError, match="no sample id in common"):
        alignment.intersect({"a": alignment.hash_ids([1], salt), "b": alignment.hash_ids([2], salt)})
    with pytest.raises(InputError, match="no row for 1"):
        alignment.positions(hb, alignment.hash_ids([9], salt), "b")


def test_passive_refuses_out_of_order_requests_with_protocol_errors():
    import pandas as pd

    from parties.passive import PassiveParty
    frame = pd.DataFrame({"id": [1, 2, 3], "x": [0.1, 0.2, 0.3]})
    party = PassiveParty("telco", frame)
    party.salt = b"s" * 16                 # as after loading a model or a PSI alignment
    handler = frame_handler(party.handle)
    # an alignment result before any alignment request: a clear refusal, not a crash
    reply = loads(handler(dumps(m.AlignResult(alignment.hash_ids([1], b"s" * 16)))))
    assert isinstance(reply, m.ErrorReply) and "before alignment" in reply.message
    # a histogram request before gradients, and one for a round it does not hold
    req = m.HistogramRequest(3, np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros((1, 3), np.int32))
    reply = loads(handler(dumps(req)))
    assert isinstance(reply, m.ErrorReply) and "before gradients" in reply.message


def test_stale_round_requests_are_refused():
    from support import small_frames

    from crypto.shards import ShardedGradients
    from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
    a, b, _ = small_frames(60)
    telco = PassiveParty("telco", b)
    fed = Federation(ActiveParty("bank", a), [telco])
    fed.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2))
    train = telco._state.train                           # as if a round's gradients were held
    train.grads = ShardedGradients(1, False, None, 1, 1, 1, 8, True, np.ones(60, dtype=bool))
    train.assignment = np.zeros((1, 60), np.int32)
    with pytest.raises(ProtocolError, match="gradients of round 1, not of round 0"):
        telco.handle(m.HistogramRequest(0, np.zeros(1, np.int32), np.zeros(1, np.int32),
                                        np.zeros((1, 60), np.int32)))
    with pytest.raises(ProtocolError, match="not of round 0"):       # a split names a position (issue 31)
        telco.handle(m.CandidatePick(0, np.zeros(1, np.int32), np.zeros(1, np.int32), np.ones(1, np.int32),
                                     np.zeros(1, np.int32), np.full(1, -1, np.int32), np.zeros(1, bool)))
