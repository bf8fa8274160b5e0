"""Serialization (bytes, never pickle), malformed frames, transports, alignment."""
import json
import struct

import gmpy2
import numpy as np
import pytest

from protocols import alignment
from protocols import messages as m
from protocols.serialization import MAGIC, BigInts, dumps, loads
from protocols.transport import InMemoryTransport, frame_handler
from vfl.errors import InputError, PeerError, ProtocolError


def _roundtrip(msg):
    frame = dumps(msg)
    assert isinstance(frame, bytes) and frame[:4] == MAGIC
    assert b"pickle" not in frame and b"\x80\x04" not in frame[:16]
    back = loads(frame)
    assert type(back) is type(msg)
    return back


def test_messages_round_trip_with_arrays_and_big_integers():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    back = _roundtrip(m.HistogramRequest(3, 1, np.array([0], np.int32), np.array([5], np.int32), a))
    assert back.round_idx == 3 and back.depth == 1
    assert back.assignment.dtype == np.int32 and np.array_equal(back.assignment, a)
    big = [gmpy2.mpz(2) ** 2047 + 12345, gmpy2.mpz(1), gmpy2.mpz(0)]
    back = _roundtrip(m.Gradients(0, True, {"x": 1}, 12, BigInts(big)))
    assert [int(v) for v in back.values] == [int(v) for v in big]
    signed = [-(2 ** 90), 2 ** 90, -1, 0]
    back = _roundtrip(m.HistogramResponse(4, BigInts(signed)))
    assert [int(v) for v in back.values] == signed
    back = _roundtrip(m.AlignRequest("s", b"\x00" * 16, "train"))
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
    reply = t.call("b", m.TrainEnd("x", 1, True))
    assert reply.info == {"echo": 1}
    sent, back = t.log[0][2], t.log[1][2]
    assert t.bytes_sent[("a", "b")] == len(sent) and t.bytes_sent[("b", "a")] == len(back)
    with pytest.raises(InputError, match="party 'b': bad key"):
        t.call("b", m.PublicKey("ff"))
    with pytest.raises(PeerError, match="no party named 'c'"):
        t.call("c", m.Ack())
    # a garbage frame sent straight to the handler gets an ErrorReply, not a crash
    assert isinstance(loads(frame_handler(handle)(b"garbage")), m.ErrorReply)


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
    req = m.HistogramRequest(3, 0, np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros((1, 3), np.int32))
    reply = loads(handler(dumps(req)))
    assert isinstance(reply, m.ErrorReply) and "before gradients" in reply.message


def test_stale_round_requests_are_refused():
    from conftest import small_frames

    from parties.passive_state import RoundGradients
    from vfl import ActiveParty, Federation, PassiveParty, TrainParams
    a, b, _ = small_frames(60)
    telco = PassiveParty("telco", b)
    fed = Federation(ActiveParty("bank", a), [telco])
    fed.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2))
    train = telco._state.train                           # as if a round's gradients were held
    train.grads = RoundGradients([0] * 60, [[0] * 60], 1, 1, None)
    train.assignment = np.zeros((1, 60), np.int32)
    with pytest.raises(ProtocolError, match="gradients of round 1, not of round 0"):
        telco.handle(m.HistogramRequest(0, 0, np.zeros(1, np.int32), np.zeros(1, np.int32),
                                        np.zeros((1, 60), np.int32)))
    with pytest.raises(ProtocolError, match="not of round 0"):
        telco.handle(m.SplitRequest(0, np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32),
                                    np.zeros(1, np.int32), np.zeros(1, bool)))
