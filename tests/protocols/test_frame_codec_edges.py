"""The frame codec (protocols.serialization) at its edges, in process: what cannot be sent is named
before anything is written, and a frame whose descriptors lie is refused naming the message and
the field (hypothesis over the big-integer descriptor)."""
import json
import struct
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols import messages as m
from protocols.serialization import MAGIC, BigInts, dumps, loads, register
from vfl.core.errors import ProtocolError


def _frame(type_name, fields, blobs, payload=b""):
    header = json.dumps({"type": type_name, "fields": fields, "blobs": blobs}).encode()
    return MAGIC + struct.pack("<I", len(header)) + header + payload


def test_a_big_endian_array_is_sent_little_endian():
    req = m.RouteRequest("s1", np.array([1, 2, 300], dtype=">i8"), np.array([0, 1, 2], dtype=">i4"))
    back = loads(dumps(req))
    assert back.record_ids.dtype.str == "<i8" and back.rows.dtype.str == "<i4"
    assert back.record_ids.tolist() == [1, 2, 300] and back.rows.tolist() == [0, 1, 2]


def test_what_cannot_be_sent_is_named():
    with pytest.raises(ProtocolError, match="field 'record_ids': dtype complex128 cannot be sent"):
        dumps(m.RouteRequest("s1", np.array([1j]), np.array([0])))

    @dataclass
    class Stranger:
        x: int = 1
    with pytest.raises(ProtocolError, match="Stranger is not a registered message type"):
        dumps(Stranger())
    with pytest.raises(ProtocolError, match="frame must be bytes"):
        loads("VFL1....")


def test_registration_rules():
    class NotData:
        pass
    with pytest.raises(TypeError, match="NotData must be a dataclass"):
        register(NotData)

    @dataclass
    class Ack:          # the name of a registered message, another class
        x: int = 0
    with pytest.raises(TypeError, match="message type Ack registered twice"):
        register(Ack)
    assert register(m.Ack) is m.Ack          # the same class again: a no-op


def test_an_array_field_sent_as_json_is_refused():
    frame = _frame("RouteRequest", {"session_id": "s1", "record_ids": [1, 2], "rows": [0, 1]}, {})
    with pytest.raises(ProtocolError, match=r"RouteRequest.record_ids: value of type list does not match"):
        loads(frame)


def test_bigints_behave_as_a_sequence():
    b = BigInts([3, -(1 << 100), 0])
    assert len(b) == 3 and b[1] == -(1 << 100) and list(b) == [3, -(1 << 100), 0]
    assert repr(b) == "BigInts(<3 values>)" and b == BigInts([3, -(1 << 100), 0]) and b != [3, 0, 0]


@given(st.integers(0, 6), st.integers(1, 12), st.booleans(), st.integers(0, 80))
def test_a_bigints_descriptor_must_match_its_bytes(count, width, signed, nbytes):
    desc = {"kind": "bigints", "count": count, "width": width, "signed": signed, "offset": 0, "nbytes": nbytes}
    frame = _frame("HistogramResponse", {"n_values": count, "compute_us": {}}, {"values": desc}, bytes(nbytes))
    if count * width == nbytes:
        assert loads(frame).values == BigInts([0] * count)
    else:
        with pytest.raises(ProtocolError, match=f"HistogramResponse.values'?: {nbytes} bytes do not hold {count} "
                                                f"integers of {width} bytes"):
            loads(frame)
