"""Malformed frames of the wire format (issue 10 #13), shared by the decoder tests and the
serving tests: each is ``(frame bytes, text the refusal must contain)``."""
import json
import struct

import numpy as np

from protocols import messages as m
from protocols.serialization import MAGIC, dumps


def raw_frame(header, payload: bytes = b"") -> bytes:
    """A frame from a header given as a dict (JSON-encoded, Infinity allowed) or as bytes."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(h)) + h + payload


def _header(message) -> tuple[dict, bytes]:
    frame = dumps(message)
    (hlen,) = struct.unpack("<I", frame[4:8])
    return json.loads(frame[8:8 + hlen]), frame[8 + hlen:]


def _patched(message, path: list, value, payload: bytes | None = None, more=()) -> bytes:
    """``message``'s frame with the header entry at ``path`` (and each of ``more``) replaced."""
    header, body = _header(message)
    for p, v in [(path, value), *more]:
        node = header
        for key in p[:-1]:
            node = node[key]
        node[p[-1]] = v
    return raw_frame(header, body if payload is None else payload)


def _hist(n_nodes=1):
    return m.HistogramRequest(0, np.zeros(n_nodes, np.int32), np.arange(n_nodes, dtype=np.int32),
                              np.zeros((1, 4), np.int32))


def _deep(depth: int) -> bytes:
    return b'{"type":"Ack","fields":{"info":' + b'{"a":' * depth + b"1" + b"}" * depth + b'},"blobs":{}}'


def malformed_frames() -> list[tuple[bytes, str]]:
    split = m.SplitRequest(0, np.array([1, 2], np.int32), np.array([0, 0], np.int32), np.array([0, 0], np.int32),
                           np.array([0, 0], np.int32), np.array([True, False]))
    return [
        # array shapes whose product overflows int64 (2**64 wraps to 0) or is astronomically large
        (_patched(_hist(), ["blobs", "node_ids", "shape"], [2 ** 32, 2 ** 32],
                  more=[(["blobs", "node_ids", "nbytes"], 0)]), "HistogramRequest.node_ids"),
        (_patched(_hist(), ["blobs", "assignment", "shape"], [10 ** 30, 10 ** 30]), "HistogramRequest.assignment"),
        (_patched(_hist(), ["blobs", "assignment", "shape"], [1] * 40), "HistogramRequest.assignment"),
        # Infinity / NaN / fractional offsets and counts
        (_patched(_hist(), ["blobs", "node_ids", "offset"], float("inf")), "HistogramRequest.node_ids"),
        (_patched(_hist(), ["blobs", "node_ids", "nbytes"], float("nan")), "HistogramRequest.node_ids"),
        (_patched(m.HistogramResponse(1, m.BigInts([5])), ["blobs", "values", "count"], float("inf")),
         "HistogramResponse.values"),
        (_patched(m.HistogramResponse(1, m.BigInts([5])), ["blobs", "values", "width"], 1.5),
         "HistogramResponse.values"),
        (_patched(m.HistogramResponse(1, m.BigInts([5])), ["blobs", "values", "width"], 10 ** 9),
         "HistogramResponse.values"),
        # JSON nested 100,000 levels deep; a field nested deeper than allowed
        (raw_frame(_deep(100_000)), "nested too deeply"),
        (raw_frame(_deep(50)), "Ack.info: nested more than"),
        # a layout {} and other impossible layouts
        (_patched(m.Gradients(0, True, {}, 1, m.BigInts([1])), ["fields", "layout"], {}), "Gradients.layout"),
        (_patched(m.Gradients(0, True, {}, 1, m.BigInts([1])), ["fields", "layout"],
                  {"precision_bits": 1, "n_targets": 1, "max_rows": 1, "g_max": 1, "h_max": 1, "g_bits": 10 ** 6,
                   "h_bits": 1}), "Gradients.layout"),
        # negative tree index (used to wrap to the last tree), float arrays where integers belong
        (dumps(m.HistogramRequest(0, np.array([-1], np.int32), np.array([0], np.int32), np.zeros((1, 4), np.int32))),
         "HistogramRequest.tree_idx"),
        (dumps(m.SplitRequest(0, np.array([0.5]), np.array([0]), np.array([0]), np.array([0]), np.array([True]))),
         "SplitRequest.node_ids"),
        (dumps(m.RouteRequest("s", np.array([1.0]), np.array([0]))), "RouteRequest.record_ids"),
        (dumps(m.LeafMaskRequest("s", np.array([1]), np.array([-1]), np.array([-1]), np.array([-1.0]))),
         "LeafMaskRequest.record_ids"),
        # an empty intersection
        (dumps(m.AlignResult(np.zeros((0, 16), np.uint8))), "AlignResult.hashes: is empty"),
        (dumps(m.PsiResult("s", np.zeros(0, np.int64))), "PsiResult.positions: is empty"),
        # SplitRequest arrays of unequal length
        (_patched(split, ["blobs", "bin_idx", "shape"], [1], payload=None), "SplitRequest"),
        (dumps(m.SplitRequest(0, np.array([1, 2]), np.array([0]), np.array([0]), np.array([0]), np.array([True]))),
         "must have the same length"),
        # ids and scalars out of range
        (dumps(m.TrainResume("m", -1, 0)), "TrainResume.n_rounds"),
        (dumps(m.PredictStart("m" * 1000, "s", np.zeros((1, 16), np.uint8))), "PredictStart.model_id"),
        (dumps(m.PublicKey("zz")), "PublicKey.n"),
        (dumps(m.PublicKey("ff", "ou", "zz", "3")), "PublicKey.g"),
        (dumps(m.PublicKey("ff", "ou", "3", "")), "PublicKey.h"),
        (dumps(m.PublicKey("ff", "paillier", "3", "5")), "PublicKey: a Paillier key has no g or h"),
        (dumps(m.PublicKey("ff", "elgamal")), "PublicKey.scheme"),
        (dumps(m.TrainSetup("he", 8, "x", None, 64, "rsa")), "TrainSetup.scheme"),
        (dumps(m.DPReleaseRequest("m", float("nan"))), "DPReleaseRequest.epsilon_per_feature"),
        (dumps(m.ErrorReply(m.ErrorKind.BUSY, "x", -1.0)), "ErrorReply.retry_after"),
        # structure
        (_patched(m.TrainEnd("m", True), ["blobs"], {"x": 5}), "TrainEnd"),
        (_patched(m.IdHashes(np.zeros((1, 16), np.uint8)), ["blobs", "hashes"], 7), "IdHashes.hashes"),
    ]
