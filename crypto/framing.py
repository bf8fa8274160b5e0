"""The frame codec between a party and its worker processes (:mod:`crypto.executor`,
:mod:`crypto.worker`).

A frame is ``u32 header length | header (JSON) | blob ...``: the header is a dict
(a request names its operation ``op`` and the slots it reads; a reply carries
scalars such as ``cpu``), the blobs are raw bytes (fixed-width integers, numpy
buffers) whose lengths the codec adds to the header as ``_blobs``. Never pickle:
every process belongs to the same party, but a frame is still only data.
"""
from __future__ import annotations

import json
import struct
from typing import Sequence

_HDR = struct.Struct("<I")

#: one frame as the codec reads it: ``(header, blobs)``
Frame = tuple[dict, list[bytes]]


def encode_frame(header: dict, blobs: Sequence[bytes] = ()) -> list[bytes]:
    """The parts of one frame, to be written in order."""
    header = dict(header, _blobs=[len(b) for b in blobs])
    h = json.dumps(header, separators=(",", ":")).encode()
    return [_HDR.pack(len(h)), h, *blobs]


def _read_exact(stream, n: int) -> bytes:
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError("stream closed")
    return data


def read_frame(stream) -> Frame:
    """Read one frame from a binary stream; :class:`EOFError` when it ends."""
    (hl,) = _HDR.unpack(_read_exact(stream, _HDR.size))
    header = json.loads(_read_exact(stream, hl))
    blobs = [_read_exact(stream, s) if s else b"" for s in header.pop("_blobs", [])]
    return header, blobs


def write_frame(stream, header: dict, blobs: Sequence[bytes] = ()) -> None:
    """Write one frame to a binary stream and flush it."""
    for part in encode_frame(header, blobs):
        stream.write(part)
    stream.flush()
