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

Fields may also declare what their values must look like (:func:`array`,
:func:`count`, :func:`text` in the dataclass field's metadata; arrays of equal
length in the class attribute ``SAME_LENGTH``; anything else in a
``validate(self)`` method raising :class:`ProtocolError`). The decoder checks
all of it for every message (:func:`check_message`), so a handler only ever
sees a message whose integer arrays are integers of the right rank and sign,
whose lengths agree and whose sizes are in range; what needs the receiver's
state (a node of the level being built, a record of the model) is checked by
the handler.
"""
from __future__ import annotations

import dataclasses
import json
import math
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
#: nesting depth of JSON values (dicts and lists) a header field may have
MAX_JSON_DEPTH = 16
#: dimensions of an array on the wire
MAX_NDIM = 4
#: the largest big integer on the wire, in bytes (a ciphertext of a 16,384-bit key)
MAX_BIGINT_BYTES = 4096

_ARRAY_KINDS = {"int": "iu", "uint8": "u", "bool": "b", "float": "f", "uint": "u"}


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """What an ``np.ndarray`` field must hold: ``kind`` (``int``: any integer dtype; ``uint``;
    ``uint8``; ``bool``; ``float``), ``ndim``, the size of the last axis (``width``), the
    smallest value allowed (``min``, integers) and whether it may be empty."""
    kind: str
    ndim: int = 1
    width: int | None = None
    min: int | None = None
    nonempty: bool = False

    def describe(self) -> str:
        kind = {"int": "integer", "uint": "unsigned integer"}.get(self.kind, self.kind)
        if self.width is not None:
            dims = ", ".join(["n"] * (self.ndim - 1) + [str(self.width)])
            return f"({dims}) {kind} array"
        return f"{self.ndim}-d {kind} array"

    def check(self, where: str, a) -> None:
        if not isinstance(a, np.ndarray):
            raise ProtocolError(f"{where}: expected a {self.describe()}")
        if a.dtype.kind not in _ARRAY_KINDS[self.kind] or (self.kind == "uint8" and a.dtype.itemsize != 1) \
                or a.ndim != self.ndim or (self.width is not None and a.shape[-1] != self.width):
            raise ProtocolError(f"{where}: expected a {self.describe()}, got {a.dtype} of shape {list(a.shape)}")
        if self.nonempty and a.size == 0:
            raise ProtocolError(f"{where}: is empty")
        if self.min is not None and a.size and int(a.min()) < self.min:
            raise ProtocolError(f"{where}: value {int(a.min())} is out of range (smallest allowed: {self.min})")


@dataclasses.dataclass(frozen=True)
class ScalarSpec:
    """What a scalar field must hold: integers or floats in ``[min, max]`` (floats: never NaN,
    infinite only if ``finite`` is False); strings of at most ``max_len`` characters."""
    min: float | None = None
    max: float | None = None
    finite: bool = True
    max_len: int | None = None
    nonempty: bool = False

    def check(self, where: str, v) -> None:
        if isinstance(v, str):
            if self.max_len is not None and len(v) > self.max_len:
                raise ProtocolError(f"{where}: longer than {self.max_len} characters")
            if self.nonempty and not v:
                raise ProtocolError(f"{where}: is empty")
            return
        if isinstance(v, float) and (math.isnan(v) or (self.finite and math.isinf(v))):
            raise ProtocolError(f"{where}: {v} is not a finite number")
        if self.min is not None and v < self.min:
            raise ProtocolError(f"{where}: {v} is out of range (smallest allowed: {self.min})")
        if self.max is not None and v > self.max:
            raise ProtocolError(f"{where}: {v} is out of range (largest allowed: {self.max})")


def array(kind: str, ndim: int = 1, width: int | None = None, min: int | None = None,
          nonempty: bool = False, default=dataclasses.MISSING, empty_default: str | None = None):
    """A dataclass field holding an array of this shape and kind (see :class:`ArraySpec`);
    ``default=None`` for an optional array (None is not checked against the spec);
    ``empty_default``: a numpy dtype, the field defaults to an empty array of it."""
    spec = {"vfl": ArraySpec(kind, ndim, width, min, nonempty)}
    if empty_default is not None:
        return dataclasses.field(default_factory=lambda: np.zeros(0, dtype=empty_default), metadata=spec)
    return dataclasses.field(default=default, metadata=spec)


def count(min: int = 0, max: int | None = None, default=dataclasses.MISSING):
    """An integer field in ``[min, max]``."""
    return dataclasses.field(default=default, metadata={"vfl": ScalarSpec(min, max)})


def number(min: float | None = None, max: float | None = None, finite: bool = True,
           default=dataclasses.MISSING):
    """A float field in ``[min, max]`` (never NaN; infinite only if ``finite`` is False)."""
    return dataclasses.field(default=default, metadata={"vfl": ScalarSpec(min, max, finite)})


def text(max_len: int = 256, nonempty: bool = False, default=dataclasses.MISSING):
    """A string field of at most ``max_len`` characters."""
    return dataclasses.field(default=default, metadata={"vfl": ScalarSpec(max_len=max_len, nonempty=nonempty)})


def field_spec(f: dataclasses.Field):
    """The :class:`ArraySpec` or :class:`ScalarSpec` of a message field (None: only its type)."""
    return f.metadata.get("vfl") if f.metadata else None


def check_message(message) -> None:
    """Everything a message's class declares about its fields (types, specs, equal lengths,
    ``validate``); raise :class:`ProtocolError` naming the field. :func:`loads` calls it."""
    cls = type(message)
    name = cls.__name__
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        v = getattr(message, f.name)
        where = f"{name}.{f.name}"
        tp = hints[f.name]
        if not _type_ok(v, tp):
            if isinstance(tp, type) and issubclass(tp, Enum) and isinstance(v, str):
                raise ProtocolError(f"{where}: {v!r} is not one of {sorted(_enum_values(tp))}")
            raise ProtocolError(f"{where}: value of type {type(v).__name__} does not match {tp}")
        if _depth(v) > MAX_JSON_DEPTH:
            raise ProtocolError(f"{where}: nested more than {MAX_JSON_DEPTH} levels deep")
        spec = field_spec(f)
        if spec is not None and v is not None:
            spec.check(where, v)
    for group in getattr(cls, "SAME_LENGTH", ()):
        lengths = {g: len(getattr(message, g)) for g in group}
        if len(set(lengths.values())) > 1:
            raise ProtocolError(f"{name}: fields {', '.join(group)} must have the same length, got "
                                + ", ".join(f"{g}={n}" for g, n in lengths.items()))
    validate = getattr(message, "validate", None)
    if validate is not None:
        validate()


def _depth(v, limit: int = MAX_JSON_DEPTH + 1) -> int:
    """Nesting depth of dicts/lists in ``v`` (iterative; stops counting past ``limit``)."""
    if not isinstance(v, (dict, list)):
        return 0
    deepest, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        for c in (x.values() if isinstance(x, dict) else x):
            if isinstance(c, (dict, list)):
                stack.append((c, d + 1))
    return deepest

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
    n, width, signed = desc.get("count"), desc.get("width"), desc.get("signed")
    if not (_is_int(n) and _is_int(width) and isinstance(signed, bool)):
        raise ProtocolError(f"field {field!r}: bad big-integer descriptor (count, width, signed)")
    count = n
    if width > MAX_BIGINT_BYTES:
        raise ProtocolError(f"field {field!r}: integers of {width} bytes are larger than allowed "
                            f"({MAX_BIGINT_BYTES} bytes)")
    if count < 0 or width < 1 or count * width != len(data):
        raise ProtocolError(f"field {field!r}: {len(data)} bytes do not hold {count} integers of {width} bytes")
    return BigInts(bytes_to_ints(data, width, signed))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
        return isinstance(value, tp) or (isinstance(value, str) and type(value) is str
                                         and value in _enum_values(tp))
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
            arr = np.ascontiguousarray(v).reshape(v.shape)     # (ascontiguousarray makes 0-d arrays 1-d)
            if arr.dtype.str not in _ALLOWED_DTYPES:
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            if arr.dtype.str not in _ALLOWED_DTYPES:
                raise ProtocolError(f"field {f.name!r}: dtype {v.dtype} cannot be sent")
            data = memoryview(arr.reshape(-1).view(np.uint8))   # joined below: the frame is the one copy
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
    """Parse bytes into a message; raise :class:`ProtocolError` on anything malformed (never
    anything else: a decoding failure names the message type and the field)."""
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
    except RecursionError:
        raise ProtocolError("frame header is nested too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise ProtocolError("frame header is not valid") from None
    if not isinstance(fields, dict) or not isinstance(blobs, dict):
        raise ProtocolError("frame header is not valid")
    cls = _REGISTRY.get(type_name) if isinstance(type_name, str) else None
    if cls is None or (allowed is not None and type_name not in allowed):
        raise ProtocolError(f"unknown or unexpected message type {str(type_name)[:64]!r}")
    payload = memoryview(frame)[8 + hlen:]
    dfields = dataclasses.fields(cls)
    names = {f.name for f in dfields}
    # fields with a default may be absent (a sender from before they were added)
    optional = {f.name for f in dfields if f.default is not dataclasses.MISSING
                or f.default_factory is not dataclasses.MISSING}
    given = set(fields) | set(blobs)
    if not (names - optional) <= given or not given <= names or set(fields) & set(blobs):
        raise ProtocolError(f"{type_name}: fields {sorted(str(k)[:64] for k in given)} do not match "
                            f"{sorted(names)}")
    values = dict(fields)
    for name, desc in blobs.items():
        where = f"{type_name}.{name}"
        if not isinstance(desc, dict):
            raise ProtocolError(f"{where}: bad blob descriptor")
        off, nb, kind = desc.get("offset"), desc.get("nbytes"), desc.get("kind")
        if not (_is_int(off) and _is_int(nb)):
            raise ProtocolError(f"{where}: bad blob descriptor (offset and nbytes must be integers)")
        if off < 0 or nb < 0 or off + nb > len(payload):
            raise ProtocolError(f"{where}: blob is out of the frame")
        data = payload[off:off + nb]        # a view: an array is copied once, out of the frame
        if kind == "ndarray":
            values[name] = _decode_array(desc, data, where)
        elif kind == "bigints":
            values[name] = _decode_bigints(desc, bytes(data), where)
        elif kind == "bytes":
            values[name] = bytes(data)
        else:
            raise ProtocolError(f"{where}: unknown blob kind {str(kind)[:32]!r}")
    hints = _hints(cls)
    for name in list(values):
        tp = hints[name]
        if isinstance(tp, type) and issubclass(tp, Enum) and _type_ok(values[name], tp):
            values[name] = tp(values[name])
    try:
        message = cls(**values)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"{type_name}: {exc}") from None
    check_message(message)
    return message


def _decode_array(desc: dict, data: memoryview, where: str) -> np.ndarray:
    dtype, shape = desc.get("dtype"), desc.get("shape")
    if not isinstance(dtype, str) or dtype not in _ALLOWED_DTYPES:
        raise ProtocolError(f"{where}: array dtype {str(dtype)[:16]!r} is not allowed")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(_is_int(s) and s >= 0 for s in shape):
        raise ProtocolError(f"{where}: array shape must be a list of at most {MAX_NDIM} non-negative integers")
    dt = np.dtype(dtype)
    size = math.prod(shape)                     # exact (Python integers): never overflows
    if size * dt.itemsize != len(data):
        raise ProtocolError(f"{where}: {len(data)} bytes do not match shape {shape} of {dtype}")
    return np.frombuffer(data, dtype=dt).reshape(shape).copy()
