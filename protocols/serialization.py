"""Bytes on the wire: one frame format for every message, never pickle.

Frame layout::

    b"VFL1" | u32 header length | header (UTF-8 JSON) | payload

The header names the message type (looked up in an allow-list, see
:func:`register`), carries scalar fields as JSON and describes each binary
field by offset and length in the payload:

* ``numpy.ndarray``: dtype (numeric or bool only; never object) and shape;
* :class:`BigInts` (ciphertexts or big plaintexts): fixed-width big-endian
  integers, unsigned or two's-complement signed.

Decoding checks the type, the exact field set and every field's declared
type, so a malformed frame is a :class:`ProtocolError`, never a crash deep
inside numpy. A field declared as a str-valued :class:`enum.Enum` travels as
its value and must decode to one of its members.
"""
from __future__ import annotations

import dataclasses
import json
import struct
import typing
from enum import Enum
from typing import Any

import gmpy2
import numpy as np

from crypto.intcodec import bytes_to_ints, ints_to_bytes
from datasets.errors import ProtocolError

MAGIC = b"VFL1"
_ALLOWED_DTYPES = {"|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8"}
MAX_HEADER_BYTES = 16 * 1024 * 1024

_REGISTRY: dict[str, type] = {}


class BigInts:
    """A vector of big integers (ciphertexts mod n^2, or signed plaintext sums)."""

    __slots__ = ("values",)

    def __init__(self, values):
        self.values = list(values)

    def __len__(self):
        return len(self.values)

    def __iter__(self):
        return iter(self.values)

    def __getitem__(self, i):
        return self.values[i]

    def __eq__(self, other):
        return isinstance(other, BigInts) and [int(v) for v in self.values] == [int(v) for v in other.values]

    def __repr__(self):
        return f"BigInts(<{len(self.values)} values>)"


def register(cls):
    """Class decorator: make a dataclass a known message type."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass")
    if cls.__name__ in _REGISTRY and _REGISTRY[cls.__name__] is not cls:
        raise TypeError(f"message type {cls.__name__} registered twice")
    _REGISTRY[cls.__name__] = cls
    return cls


def _encode_bigints(values: list) -> tuple[dict, bytes]:
    signed = any(v < 0 for v in values)
    bits = max((gmpy2.mpz(v).bit_length() for v in values), default=0) + (1 if signed else 0)
    width = max(1, (bits + 7) // 8)
    data = ints_to_bytes(values, width, signed)
    return {"kind": "bigints", "count": len(values), "width": width, "signed": signed}, data


def _decode_bigints(desc: dict, data: bytes, field: str) -> BigInts:
    try:
        count, width, signed = int(desc["count"]), int(desc["width"]), bool(desc["signed"])
    except (KeyError, TypeError, ValueError):
        raise ProtocolError(f"field {field!r}: bad big-integer descriptor") from None
    if count < 0 or width < 1 or count * width != len(data):
        raise ProtocolError(f"field {field!r}: {len(data)} bytes do not hold {count} integers of {width} bytes")
    return BigInts(bytes_to_ints(data, width, signed))


def _type_ok(value, tp) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return isinstance(value, str) and value in _enum_values(tp)
    if tp is str:
        return isinstance(value, str)
    if tp is bytes:
        return isinstance(value, bytes)
    if tp is np.ndarray:
        return isinstance(value, np.ndarray)
    if tp is BigInts:
        return isinstance(value, BigInts)
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        return isinstance(value, list) and all(_type_ok(v, arg) for v in value)
    if origin is dict or tp is dict:
        args = typing.get_args(tp)
        if not isinstance(value, dict):
            return False
        if args:
            return all(_type_ok(k, args[0]) and _type_ok(v, args[1]) for k, v in value.items())
        return True
    return False


_HINTS: dict[type, dict] = {}
_ENUM_VALUES: dict[type, frozenset] = {}


def _enum_values(tp) -> frozenset:
    if tp not in _ENUM_VALUES:
        _ENUM_VALUES[tp] = frozenset(m.value for m in tp)
    return _ENUM_VALUES[tp]


def _hints(cls) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def dumps(message) -> bytes:
    """Serialize a registered message dataclass to bytes."""
    cls = type(message)
    if _REGISTRY.get(cls.__name__) is not cls:
        raise ProtocolError(f"{cls.__name__} is not a registered message type")
    fields, blobs, chunks = {}, {}, []
    offset = 0
    for f in dataclasses.fields(cls):
        v = getattr(message, f.name)
        if isinstance(v, np.ndarray):
            arr = np.ascontiguousarray(v)
            if arr.dtype.str not in _ALLOWED_DTYPES:
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            if arr.dtype.str not in _ALLOWED_DTYPES:
                raise ProtocolError(f"field {f.name!r}: dtype {v.dtype} cannot be sent")
            data = arr.tobytes()
            desc = {"kind": "ndarray", "dtype": arr.dtype.str, "shape": list(arr.shape)}
        elif isinstance(v, BigInts):
            desc, data = _encode_bigints(v.values)
        elif isinstance(v, bytes):
            desc, data = {"kind": "bytes"}, v
        else:
            fields[f.name] = v
            continue
        desc.update(offset=offset, nbytes=len(data))
        blobs[f.name] = desc
        chunks.append(data)
        offset += len(data)
    header = json.dumps({"type": cls.__name__, "fields": fields, "blobs": blobs},
                        separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *chunks])


def loads(frame: bytes, allowed: set[str] | None = None):
    """Parse bytes into a message; raise :class:`ProtocolError` on anything malformed."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise ProtocolError("frame must be bytes")
    frame = bytes(frame)
    if len(frame) < 8 or frame[:4] != MAGIC:
        raise ProtocolError("not a VFL frame (bad magic)")
    (hlen,) = struct.unpack("<I", frame[4:8])
    if hlen > MAX_HEADER_BYTES or 8 + hlen > len(frame):
        raise ProtocolError("frame header length is out of range")
    try:
        header = json.loads(frame[8:8 + hlen].decode())
        type_name, fields, blobs = header["type"], header["fields"], header["blobs"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise ProtocolError("frame header is not valid") from None
    if not isinstance(fields, dict) or not isinstance(blobs, dict):
        raise ProtocolError("frame header is not valid")
    cls = _REGISTRY.get(type_name) if isinstance(type_name, str) else None
    if cls is None or (allowed is not None and type_name not in allowed):
        raise ProtocolError(f"unknown or unexpected message type {type_name!r}")
    payload = memoryview(frame)[8 + hlen:]
    names = {f.name for f in dataclasses.fields(cls)}
    if set(fields) | set(blobs) != names or set(fields) & set(blobs):
        raise ProtocolError(f"{type_name}: fields {sorted(set(fields) | set(blobs))} do not match {sorted(names)}")
    hints = _hints(cls)
    values = dict(fields)
    for name, desc in blobs.items():
        try:
            off, nb, kind = int(desc["offset"]), int(desc["nbytes"]), desc["kind"]
        except (KeyError, TypeError, ValueError):
            raise ProtocolError(f"{type_name}.{name}: bad blob descriptor") from None
        if off < 0 or nb < 0 or off + nb > len(payload):
            raise ProtocolError(f"{type_name}.{name}: blob is out of the frame")
        data = bytes(payload[off:off + nb])
        if kind == "ndarray":
            dtype, shape = desc.get("dtype"), desc.get("shape")
            if dtype not in _ALLOWED_DTYPES or not isinstance(shape, list) or \
                    not all(isinstance(s, int) and s >= 0 for s in shape):
                raise ProtocolError(f"{type_name}.{name}: array dtype/shape not allowed")
            dt = np.dtype(dtype)
            if int(np.prod(shape, dtype=np.int64)) * dt.itemsize != nb:
                raise ProtocolError(f"{type_name}.{name}: {nb} bytes do not match shape {shape}")
            values[name] = np.frombuffer(data, dtype=dt).reshape(shape).copy()
        elif kind == "bigints":
            values[name] = _decode_bigints(desc, data, f"{type_name}.{name}")
        elif kind == "bytes":
            values[name] = data
        else:
            raise ProtocolError(f"{type_name}.{name}: unknown blob kind {kind!r}")
    for name, v in values.items():
        tp = hints[name]
        if not _type_ok(v, tp):
            if isinstance(tp, type) and issubclass(tp, Enum) and isinstance(v, str):
                raise ProtocolError(f"{type_name}.{name}: {v!r} is not one of {sorted(_enum_values(tp))}")
            raise ProtocolError(f"{type_name}.{name}: value of type {type(v).__name__} "
                                f"does not match {tp}")
        if isinstance(tp, type) and issubclass(tp, Enum):
            values[name] = tp(v)
    return cls(**values)
