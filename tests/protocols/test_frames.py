"""The frame decoder under attack (issue 10 #13): malformed frames get a ProtocolError naming
the field, never another exception; and property tests generated from the message classes'
own field declarations, so every message type and every new field is fuzzed automatically."""
from __future__ import annotations

import dataclasses
import json
import struct
import typing
from enum import Enum

import numpy as np
import pytest
from frames_support import malformed_frames, raw_frame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import examples

from crypto.packing import PackingLayout
from protocols import messages as m
from protocols.serialization import (
    _REGISTRY,
    MAGIC,
    MAX_JSON_DEPTH,
    ArraySpec,
    BigInts,
    ScalarSpec,
    check_message,
    dumps,
    field_spec,
    loads,
)
from protocols.transport import frame_handler
from vfl.core.errors import ProtocolError

CLASSES = [_REGISTRY[name] for name in sorted(_REGISTRY)]


@pytest.mark.parametrize("frame, field", malformed_frames(), ids=[f for _, f in malformed_frames()])
def test_each_malformed_frame_is_refused_naming_the_field(frame, field):
    """Before: OverflowError (Infinity offsets), RecursionError (deep JSON), ValueError (shapes whose
    product overflows int64), KeyError (layout {}), or silent acceptance (tree_idx = -1, an empty
    intersection, SplitRequest arrays of unequal length, float arrays where integers belong)."""
    with pytest.raises(ProtocolError, match=None) as info:
        loads(frame)
    assert field in str(info.value)
    reply = loads(frame_handler(lambda req: m.Ack())(frame))      # what a serving party answers
    assert isinstance(reply, m.ErrorReply) and reply.kind == m.ErrorKind.PROTOCOL and field in reply.message


def test_optional_fields_may_be_absent_required_ones_may_not():
    frame = dumps(m.ErrorReply(m.ErrorKind.BUSY, "x", 2.0))
    (hlen,) = struct.unpack("<I", frame[4:8])
    header = json.loads(frame[8:8 + hlen])
    del header["fields"]["retry_after"]                 # a sender from before the field existed
    assert loads(raw_frame(header)).retry_after == 0.0
    del header["fields"]["message"]
    with pytest.raises(ProtocolError, match="ErrorReply: fields"):
        loads(raw_frame(header))


def test_json_depth_limit_is_exact():
    ok = {"a": 1}
    for _ in range(MAX_JSON_DEPTH - 1):
        ok = {"a": ok}
    assert loads(dumps(m.Ack(ok))).info == ok
    with pytest.raises(ProtocolError, match="Ack.info: nested more than"):
        loads(dumps(m.Ack({"a": ok})))


# --- strategies from the field declarations ------------------------------------------------------
_DTYPES = {"int": [np.int32, np.int64, np.uint8], "uint": [np.uint8, np.uint16], "uint8": [np.uint8],
           "bool": [np.bool_], "float": [np.float64, np.float32]}
_WRONG = [np.float64, np.int16, np.bool_, np.uint8]


def _array(spec: ArraySpec, n: int):
    lead = st.sampled_from([n, n, n, 0, n + 1])
    dims = [lead] + [st.integers(0, 3) for _ in range(spec.ndim - 2)] + \
        ([st.just(spec.width) | st.integers(0, 40)] if spec.width is not None and spec.ndim > 1 else
         [st.integers(0, 4)] if spec.ndim > 1 else [])
    shape = st.tuples(*dims) | st.lists(st.integers(0, 3), max_size=3).map(tuple)    # or any rank
    dtype = st.sampled_from(_DTYPES[spec.kind]) | st.sampled_from(_WRONG)
    low = (spec.min if spec.min is not None else -3) - 1

    def make(args):
        shp, dt, seed = args
        rng = np.random.default_rng(seed)
        if np.dtype(dt).kind == "b":
            return rng.integers(0, 2, size=shp).astype(bool)
        if np.dtype(dt).kind == "u":
            return rng.integers(0, 4, size=shp).astype(dt)
        return (rng.integers(low, low + 12, size=shp)).astype(dt)

    return st.tuples(shape, dtype, st.integers(0, 2 ** 16)).map(make)


_LAYOUT = st.builds(lambda g, h, rows, k: PackingLayout.for_bounds(g, h, rows, k).to_dict(),
                    st.floats(0.01, 4), st.floats(0.01, 1), st.integers(1, 500), st.integers(1, 3))
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10, 10) | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                  max_size=3), max_leaves=8)


def _value(cls, f: dataclasses.Field, tp, n: int):
    spec = field_spec(f)
    args = typing.get_args(tp)
    if type(None) in args and len(args) == 2:         # an optional field: None or a value
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | _value(cls, f, inner, n)
    if tp is np.ndarray:
        return _array(spec if isinstance(spec, ArraySpec) else ArraySpec("int", 1), n)
    if tp is BigInts:
        return st.lists(st.integers(-2 ** 70, 2 ** 300), max_size=5).map(BigInts)
    if tp is bool:
        return st.booleans()
    if tp is int:
        lo = int(spec.min) if isinstance(spec, ScalarSpec) and spec.min is not None else -5
        hi = int(spec.max) if isinstance(spec, ScalarSpec) and spec.max is not None else lo + 2 ** 20
        return st.integers(lo, hi) | st.integers(lo - 3, hi + 3) | st.integers(-2 ** 70, 2 ** 70)
    if tp is float:
        return st.floats(0, 100) | st.floats(allow_nan=True, allow_infinity=True)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return st.sampled_from([x.value for x in tp]) | st.text(max_size=6)
    if tp is str:
        if f.name == "n":          # a hex modulus
            return st.integers(3, 2 ** 80).map(lambda v: format(v, "x")) | st.text(max_size=5)
        return st.text(min_size=1, max_size=12) | st.text(max_size=300)
    if tp is bytes:
        return st.binary(max_size=40)
    if tp is dict or typing.get_origin(tp) is dict:
        if cls is m.Gradients and f.name == "layout":
            return _LAYOUT | st.dictionaries(st.text(max_size=14), st.integers(-2, 5000), max_size=8)
        if cls is m.HistogramResponse:
            return st.dictionaries(st.sampled_from(["histogram", "compress"]), st.integers(0, 10 ** 6), max_size=2)
        return st.dictionaries(st.text(max_size=6), _JSON, max_size=4)
    if typing.get_origin(tp) is list:       # e.g. DriftReply.names
        (inner,) = typing.get_args(tp)
        return st.lists(_value(cls, f, inner, n), max_size=4) | st.lists(st.integers(), max_size=2)
    raise AssertionError(f"{cls.__name__}.{f.name}: no strategy for {tp} (extend this test)")


@st.composite
def messages(draw):
    """Any registered message, its fields drawn from their declared types and specs (valid and
    invalid values alike; arrays of one message mostly share a length)."""
    cls = draw(st.sampled_from(CLASSES))
    hints = typing.get_type_hints(cls)
    n = draw(st.integers(0, 5))
    values = {f.name: draw(_value(cls, f, hints[f.name], n)) for f in dataclasses.fields(cls)}
    return cls(**values)


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if not (isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)):
                return False
        elif isinstance(x, float) and np.isnan(x):
            return isinstance(y, float) and np.isnan(y)
        elif x != y:
            return False
    return True


FUZZ = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.data_too_large])


@pytest.mark.slow
@FUZZ
@given(messages())
def test_round_trip_is_identity_for_valid_messages_and_a_refusal_otherwise(msg):
    try:
        check_message(msg)
        valid = True
    except ProtocolError:
        valid = False
    frame = dumps(msg)
    if valid:
        assert _same(loads(frame), msg)
        assert dumps(loads(frame)) == frame
    else:
        with pytest.raises(ProtocolError):
            loads(frame)


def _decode_or_refuse(frame: bytes):
    try:
        out = loads(frame)
    except ProtocolError:
        return None
    check_message(out)              # whatever decodes is a valid message
    assert type(out).__name__ in _REGISTRY
    return out


@pytest.mark.slow
@FUZZ
@given(messages(), st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, 10 ** 6))
def test_corrupted_bytes_decode_or_are_refused(msg, flips, cut):
    frame = bytearray(dumps(msg))
    for pos, val in flips:
        frame[pos % len(frame)] = val
    _decode_or_refuse(bytes(frame))
    _decode_or_refuse(bytes(frame[:cut % (len(frame) + 1)]))


@pytest.mark.slow
@FUZZ
@given(messages(), st.data())
def test_rewritten_headers_decode_or_are_refused(msg, data):
    frame = dumps(msg)
    (hlen,) = struct.unpack("<I", frame[4:8])
    header, payload = json.loads(frame[8:8 + hlen]), frame[8 + hlen:]
    section = data.draw(st.sampled_from(["fields", "blobs", "type"]))
    if section == "type":
        header["type"] = data.draw(st.sampled_from(sorted(_REGISTRY)) | _JSON)
    elif header[section]:
        key = data.draw(st.sampled_from(sorted(header[section])))
        target = header[section][key]
        if isinstance(target, dict) and target and data.draw(st.booleans()):
            sub = data.draw(st.sampled_from(sorted(target)))
            target[sub] = data.draw(_JSON | st.integers(-2 ** 70, 2 ** 70) | st.floats())
        else:
            header[section][key] = data.draw(_JSON | st.floats())
    else:
        header[section] = data.draw(_JSON)
    _decode_or_refuse(raw_frame(header, payload))


def test_every_registered_message_has_a_strategy():
    """A new message type or field fails here if the generator cannot build it."""
    for cls in CLASSES:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            _value(cls, f, hints[f.name], 2)
    assert MAGIC == b"VFL1"
