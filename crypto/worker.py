"""One worker process of a :class:`crypto.executor.LocalExecutor` (``python -m crypto.worker``).

Reads request frames (:mod:`crypto.framing`) from stdin, answers each with one
frame on the original stdout (stray prints go to stderr), and exits when stdin
closes. The operations (:func:`run`, the vocabulary of every executor's requests):

* ``put``: fill a named slot (``ints``: fixed-width big
  integers; ``array``: a numpy array; ``encryptor`` / ``decryptor``: key
  material of the party that owns the executor, to build tables once).
* ``compress``, ``encrypt``, ``decrypt``: a chunk of that batch operation.
* ``obf_fill``: fresh obfuscators into the stock of this worker's encryptor
  (:class:`crypto.paillier.ObfuscatorStock`; they never leave the worker), ``obf_stats``: its counters.

Row shards that stay put (:mod:`crypto.shards`):

* ``fill``: write a piece of a round's gradient values into a shard's slot (range-checked
  ciphertexts); ``get``: a shard's values as bytes; ``drop``: forget slots by prefix.
* ``pack_encrypt``: pack (and encrypt) a shard's fixed-point gradients into a slot, taking
  obfuscators from the worker's stock first and making the rest on the spot (both counted).
* ``ext``: an operation of a module above this floor that reads a party's own data where its
  shards live (e.g. the passive party's ``parties.shard_ops`` reads Parquet pieces, bins them,
  answers the split rule); imported by name in the worker process, so this floor imports nothing
  of the floors above it, and names none: the party hands the modules it allows to the executor
  (:meth:`crypto.executor.Executor.allow`, the ``allow`` operation into the slot
  :data:`EXTENSIONS_SLOT`). The request names ``module`` (one of those) and ``fn`` (a key of that
  module's ``WORKER_OPS``); any other module is refused.
* ``shard_hist``: the partial histograms of one shard for the nodes of one level, from the
  bit-packed node codes; ``shards_hist``: the same over every shard a level asks of this worker,
  summed here (one partial per worker); ``combine``: sum partials (a slice of each: the reduction).
* ``root_partial``: a shard's partial root histogram over all its rows, computed while the rest of
  the round's gradients are still arriving (kept in a slot); ``take``: such a kept partial.
"""
from __future__ import annotations

import importlib
import os
import signal
import sys
import time
import traceback

import gmpy2
import numpy as np

from crypto.compress import compress, direct_block, shifted_plaintexts, stride_for
from crypto.framing import read_frame, write_frame
from crypto.histogram import block_sums
from crypto.intcodec import bytes_to_ints, int_width, ints_to_bytes
from crypto.packing import PackingLayout, pack
from crypto.schemes import decryptor_from_state, encryptor_from_state
from crypto.shards import unpack_codes

_state: dict = {}
_moduli: dict = {}


def _modulus(h: str):
    m = _moduli.get(h)
    if m is None:
        if len(_moduli) > 8:
            _moduli.clear()
        m = _moduli[h] = gmpy2.mpz(h, 16)
    return m


def _put(req, blobs, st):
    kind = req["kind"]
    if kind == "ints":
        obj = bytes_to_ints(blobs[0], int(req["width"]), bool(req.get("signed")))
    elif kind == "array":
        obj = np.frombuffer(blobs[0], dtype=np.dtype(req["dtype"])).reshape(req["shape"])
    elif kind == "encryptor":
        obj = encryptor_from_state(req["state"])
    elif kind == "decryptor":
        obj = decryptor_from_state(req["state"])
    else:
        raise ValueError(f"unknown slot kind {kind!r}")
    st[req["slot"]] = obj
    return {}, []


def _compress(req, blobs, st):
    m = _modulus(req["modulus"])
    w = int_width(m)
    out = compress(bytes_to_ints(blobs[0], w), int(req["shift_bits"]), int(req["per"]), m)
    return {}, [ints_to_bytes(out, w)]


def _encrypt(req, blobs, st):
    enc = st[req["slot"]]
    plain = bytes_to_ints(blobs[0], int(req["width"]), signed=True)
    return {}, [ints_to_bytes(enc.encrypt(plain), int_width(enc.cipher_modulus))]


def _decrypt(req, blobs, st):
    dec = st[req["slot"]]
    out = dec.decrypt_signed(bytes_to_ints(blobs[0], int_width(dec.cipher_modulus)))
    return {}, [ints_to_bytes(out, int_width(dec.n) + 1, signed=True)]


def _fill(req, blobs, st):
    slot, size, w, signed = req["slot"], int(req["size"]), int(req["width"]), bool(req.get("signed"))
    cur = st.get(slot)
    if cur is None or len(cur) != size or st.get(slot + "#round") != req.get("round"):
        cur = st[slot] = [None] * size
        st[slot + "#round"] = req.get("round")
        st[slot + "#filled"] = 0
    vals = bytes_to_ints(blobs[0], w, signed)
    if req.get("modulus"):
        m = _modulus(req["modulus"])
        for v in vals:
            if not 0 < v < m:
                raise ValueError("a ciphertext is out of range")
    pos = 0
    for dest, count in req["segments"]:
        cur[dest:dest + count] = vals[pos:pos + count]
        pos += count
    st[slot + "#filled"] += pos
    return {"filled": st[slot + "#filled"]}, []


def _get(req, blobs, st):
    w, signed = int(req["width"]), bool(req.get("signed"))
    return {}, [b"".join(ints_to_bytes(st[slot], w, signed) for slot in req["slots"])]


def _drop(req, blobs, st):
    prefix = req["prefix"]
    for key in [k for k in st if k.startswith(prefix)]:
        del st[key]
    return {}, []


def _pack_encrypt(req, blobs, st):
    n, G = int(req["n_rows"]), int(req["group_size"])
    g = np.frombuffer(blobs[0], dtype=np.int64).reshape(n, G)
    h = np.frombuffer(blobs[1], dtype=np.int64).reshape(n, G)
    rows = np.flatnonzero(np.frombuffer(blobs[2], dtype=np.uint8)) if req.get("masked") else None
    layout = PackingLayout.from_dict(req["layout"])
    if rows is not None and not len(rows):
        packed = []
    else:
        packed = pack(g if rows is None else g[rows], h if rows is None else h[rows], layout)
    shifts = int(req["shifts"])
    if shifts > 1:
        packed = shifted_plaintexts(packed, int(req["value_bits"]), shifts, int(req.get("stride", 1)))
    from_stock = on_spot = 0
    if req["encrypt"] and packed:       # obfuscators from this worker's stock first (one product each)
        enc, from_stock, on_spot = st[req["encryptor"]].encrypt_stocked(packed)
    else:
        enc = packed
    if rows is None:
        st[req["slot"]] = list(enc)
    else:   # rows no tree of the round uses: trivial placeholders (never summed)
        one = gmpy2.mpz(1) if req["encrypt"] else 0
        out = []
        m = len(rows)
        for sh in range(shifts):
            block = [one] * n
            for i, v in zip(rows.tolist(), enc[sh * m:(sh + 1) * m]):
                block[i] = v
            out.extend(block)
        st[req["slot"]] = out
    return {"from_stock": from_stock, "on_spot": on_spot}, []


def _obf_fill(req, blobs, st):
    """Make up to ``count`` obfuscators into the stock of the encryptor in ``slot`` (never more
    than ``target`` in stock); the obfuscators stay in this process."""
    stock = st[req["slot"]].stock
    made = stock.fill(int(req["count"]), int(req["target"]) if "target" in req else None)
    return {**stock.stats(), "added": made}, []


def _obf_stats(req, blobs, st):
    enc = st.get(req["slot"])
    return (enc.stock.stats() if enc is not None else {"stock": 0, "made": 0, "taken": 0}), []


def _shard_hist(req, blobs, st):
    out, adds = _shard_sums(req, blobs, st)
    return {"additions": adds}, [ints_to_bytes(out, int(req["width"]), bool(req["signed"]))]


def _add_into(acc: list, part: list, m) -> int:
    """``acc += part`` elementwise (a product mod ``m`` under encryption, ``1`` the empty sum;
    the one place partial sums are added: ``combine``, ``shards_hist``, ``take``); returns the
    additions done."""
    adds = 0
    if m is None:
        for i, v in enumerate(part):
            if v:
                acc[i] += v
                adds += 1
        return adds
    for i, v in enumerate(part):
        if v != 1:
            a = acc[i]
            acc[i] = v if a == 1 else a * v % m
            adds += a != 1
    return adds


def _shards_hist(req, blobs, st):
    """``shard_hist`` over several shards of this worker (``parts``: their ``bins``, ``values``,
    ``n_rows``; the blobs of part ``i`` are ``blobs[i * trees:(i + 1) * trees]``), summed here: one
    partial per worker and level, not one per shard."""
    trees = len(req["bits"])
    m = _modulus(req["modulus"]) if req.get("modulus") else None
    acc, adds = None, 0
    for i, part in enumerate(req["parts"]):
        sub = dict(req, bins=part["bins"], values=part["values"], n_rows=part["n_rows"])
        out, a = _shard_sums(sub, blobs[i * trees:(i + 1) * trees], st)
        adds += a
        if acc is None:
            acc = out
        else:
            adds += _add_into(acc, out, m)
    return {"additions": adds}, [ints_to_bytes(acc or [], int(req["width"]), bool(req["signed"]))]


def _shard_sums(req, blobs, st):
    """One shard's partial histograms of a level's nodes: ``(values, additions)``."""
    n = int(req["n_rows"])
    bins = st[req["bins"]]
    values = st[req["values"]]
    if st.get(req["values"] + "#filled") != len(values):
        raise ValueError("the shard did not receive all gradient values of the round")
    codes = [unpack_codes(b, int(bits), n) for b, bits in zip(blobs, req["bits"])]
    shifts, per, groups = int(req["shifts"]), int(req["per"]), int(req["groups"])
    n_bins = req["n_bins"]
    total = int(sum(n_bins))
    m = _modulus(req["modulus"]) if req.get("modulus") else None
    one = 0 if m is None else gmpy2.mpz(1)
    out = [one] * int(req["n_out"])
    block = shifts * n
    stats: dict = {}
    stride = stride_for(per, shifts)          # accumulators per output ciphertext (shifts > 1)
    for i, (p, c, j) in enumerate(req["nodes"]):
        rows = np.flatnonzero(codes[p] == c)
        if not len(rows):
            continue
        vals_j = values[j * block:(j + 1) * block] if groups > 1 else values
        if shifts == 1:
            vals = [vals_j[r] for r in rows.tolist()]
            out[i * total:(i + 1) * total] = block_sums(vals, bins[rows], n_bins, m, req["joint"], stats)
        else:
            c0, accs = direct_block(vals_j, n, rows, bins[rows], i * total, n_bins, per, m, stride)
            for k, a in enumerate(accs, start=c0 * stride):
                if m is None:
                    out[k] += a
                else:
                    out[k] = a if out[k] == 1 else out[k] * a % m
    return out, stats.get("additions", 0)


def _root_partial(req, blobs, st):
    """A shard's partial root histogram (``shard_hist`` with every row at the node) kept in slot
    ``out``; replies which rows hold an identity value (a placeholder) in every copy of each group."""
    header, (out,) = _shard_hist(req, blobs, st)
    st[req["out"]] = out
    values = st[req["values"]]
    n, shifts, groups = int(req["n_rows"]), int(req["shifts"]), int(req["groups"])
    one = 1 if req.get("modulus") else 0
    ident = np.ones((groups, n), dtype=bool)
    for j in range(groups):
        for s in range(shifts):
            base = (j * shifts + s) * n
            ident[j] &= np.fromiter((v == one for v in values[base:base + n]), dtype=bool, count=n)
    return header, [np.packbits(ident.ravel()).tobytes()]


def _take(req, blobs, st):
    """A kept partial (``slot``), or the sum of several (``slots``, with ``width``/``signed``/
    ``modulus``: one partial per worker)."""
    if "slots" not in req:
        return {}, [st[req["slot"]]]
    w, signed = int(req["width"]), bool(req.get("signed"))
    m = _modulus(req["modulus"]) if req.get("modulus") else None
    acc, adds = None, 0
    for slot in req["slots"]:
        part = bytes_to_ints(st[slot], w, signed)
        if acc is None:
            acc = part
        else:
            adds += _add_into(acc, part, m)
    return {"additions": adds}, [ints_to_bytes(acc or [], w, signed)]


def _combine(req, blobs, st):
    """The elementwise sum of the partials in ``blobs`` (a slice of each, see
    :meth:`crypto.executor.Executor.sum_parts`)."""
    w, signed = int(req["width"]), bool(req.get("signed"))
    m = _modulus(req["modulus"]) if req.get("modulus") else None
    acc = bytes_to_ints(blobs[0], w, signed)
    adds = 0
    for blob in blobs[1:]:
        adds += _add_into(acc, bytes_to_ints(blob, w, signed), m)
    return {"additions": adds}, [ints_to_bytes(acc, w, signed)]


#: the slot of the modules whose ``WORKER_OPS`` the ``ext`` operation may run, as the party that
#: uses the executor allowed them (:meth:`crypto.executor.Executor.allow`)
EXTENSIONS_SLOT = "allowed-extensions"


def _allow(req, blobs, st):
    st[req["slot"]] = tuple(str(name) for name in req["modules"])
    return {}, []


def _ext(req, blobs, st):
    name = req["module"]
    allowed = st.get(EXTENSIONS_SLOT, ())
    if name not in allowed:
        raise ValueError(f"worker extension {name!r} is not allowed by the party using this executor "
                         f"(allowed: {list(allowed)})")
    ops = importlib.import_module(name).WORKER_OPS
    return ops[req["fn"]](req, blobs, st)


_OPS = {"put": _put, "compress": _compress,
        "encrypt": _encrypt, "decrypt": _decrypt, "obf_fill": _obf_fill,
        "obf_stats": _obf_stats,
        "fill": _fill, "get": _get, "drop": _drop, "pack_encrypt": _pack_encrypt, "shard_hist": _shard_hist,
        "shards_hist": _shards_hist,
        "root_partial": _root_partial, "take": _take, "combine": _combine, "ext": _ext, "allow": _allow,
        "ping": lambda req, blobs, st: ({"pid": os.getpid()}, [])}


def run(req: dict, blobs: list[bytes], state: dict | None = None) -> tuple[dict, list[bytes]]:
    """Answer one request against the slots of ``state`` (default: this process's slots);
    the reply header carries ``cpu`` (seconds of CPU time spent)."""
    t0 = time.process_time()
    header, reply = _OPS[req["op"]](req, blobs, _state if state is None else state)
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
