"""One worker process of a :class:`crypto.executor.LocalExecutor` (``python -m crypto.worker``).

Reads request frames (:mod:`crypto.framing`) from stdin, answers each with one
frame on the original stdout (stray prints go to stderr), and exits when stdin
closes. The operations (:func:`run`, the vocabulary of every executor's requests):

* ``put``: fill a named slot (``ints``: fixed-width big
  integers; ``array``: a numpy array; ``encryptor`` / ``decryptor``: key
  material of the party that owns the executor, to build tables once).
* ``hist``: one (node, feature block, row range) unit of
  :func:`crypto.histogram.histogram`.
* ``direct``: one unit of the pre-shifted histogram of
  :func:`crypto.compress.compressed_histogram`.
* ``compress``, ``encrypt``, ``decrypt``: a chunk of that batch operation.
* ``obfuscate``: fresh obfuscators for :class:`crypto.obfuscators.ObfuscatorStore`.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback

import gmpy2
import numpy as np

from crypto.compress import compress, direct_block
from crypto.framing import read_frame, write_frame
from crypto.histogram import block_sums
from crypto.intcodec import bytes_to_ints, int_width, ints_to_bytes
from crypto.paillier import Decryptor, Encryptor

_state: dict = {}
_moduli: dict = {}


def _modulus(h: str):
    m = _moduli.get(h)
    if m is None:
        if len(_moduli) > 8:
            _moduli.clear()
        m = _moduli[h] = gmpy2.mpz(h, 16)
    return m


def _put(req, blobs):
    kind = req["kind"]
    if kind == "ints":
        obj = bytes_to_ints(blobs[0], int(req["width"]), bool(req.get("signed")))
    elif kind == "array":
        obj = np.frombuffer(blobs[0], dtype=np.dtype(req["dtype"])).reshape(req["shape"])
        if "sizes" in req:
            starts = np.concatenate([[0], np.cumsum(req["sizes"], dtype=np.int64)])
            obj = (obj, starts)
    elif kind == "encryptor":
        obj = Encryptor.from_state(req["state"])
    elif kind == "decryptor":
        obj = Decryptor.from_state(req["state"])
    else:
        raise ValueError(f"unknown slot kind {kind!r}")
    _state[req["slot"]] = obj
    return {}, []


def _node_rows(req):
    rows, starts = _state[req["rows"]]
    j = int(req["node"])
    return rows[starts[j]:starts[j + 1]][int(req["r0"]):int(req["r1"])]


def _hist(req, blobs):
    values = _state[req["values"]]
    bins = _state[req["bins"]]
    rows = _node_rows(req)
    f0, f1 = int(req["f0"]), int(req["f1"])
    vals = [values[i] for i in rows.tolist()]
    m = _modulus(req["modulus"])
    joint = req["joint"]
    stats = {}
    sums = block_sums(vals, bins[rows, f0:f1], req["n_bins"], m, joint, stats)
    return {"additions": stats.get("additions", 0)}, [ints_to_bytes(sums, int_width(m))]


def _direct(req, blobs):
    values = _state[req["values"]]
    bins = _state[req["bins"]]
    rows = _node_rows(req)
    f0, f1 = int(req["f0"]), int(req["f1"])
    m = _modulus(req["modulus"])
    c0, accs = direct_block(values, int(req["n_samples"]), rows, bins[rows, f0:f1], req["slot0"],
                            req["n_bins"], int(req["per"]), m)
    return {"c0": c0}, [ints_to_bytes(accs, int_width(m))]


def _compress(req, blobs):
    m = _modulus(req["modulus"])
    w = int_width(m)
    out = compress(bytes_to_ints(blobs[0], w), int(req["shift_bits"]), int(req["per"]), m)
    return {}, [ints_to_bytes(out, w)]


def _encrypt(req, blobs):
    enc = _state[req["slot"]]
    plain = bytes_to_ints(blobs[0], int(req["width"]), signed=True)
    return {}, [ints_to_bytes(enc.encrypt(plain), int_width(enc.nsquare))]


def _obfuscate(req, blobs):
    enc = _state[req["slot"]]
    return {}, [ints_to_bytes(enc.obfuscators(int(req["count"])), int_width(enc.nsquare))]


def _decrypt(req, blobs):
    dec = _state[req["slot"]]
    out = dec.decrypt_signed(bytes_to_ints(blobs[0], int_width(dec.nsquare)))
    return {}, [ints_to_bytes(out, int_width(dec.n) + 1, signed=True)]


_OPS = {"put": _put, "hist": _hist, "direct": _direct, "compress": _compress,
        "encrypt": _encrypt, "obfuscate": _obfuscate, "decrypt": _decrypt,
        "ping": lambda req, blobs: ({"pid": os.getpid()}, [])}


def run(req: dict, blobs: list[bytes]) -> tuple[dict, list[bytes]]:
    """Answer one request against this process's slots; the reply header carries ``cpu``
    (seconds of CPU time spent)."""
    t0 = time.process_time()
    header, reply = _OPS[req["op"]](req, blobs)
    header["cpu"] = time.process_time() - t0
    return header, reply


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the parent decides when we stop
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                                      # stray prints must not corrupt frames
    while True:
        try:
            req, blobs = read_frame(inp)
        except EOFError:
            break
        try:
            header, reply = run(req, blobs)
        except Exception:                              # report, keep serving
            header, reply = {"error": traceback.format_exc()}, []
        try:
            write_frame(out, header, reply)
        except (BrokenPipeError, OSError):
            break
    os._exit(0)


if __name__ == "__main__":
    main()
