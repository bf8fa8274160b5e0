"""Ciphertext compression: many packed bin sums in one ciphertext.

A passive party shifts and adds ``per`` sums (each a signed-digit value of
``shift_bits`` bits, see :mod:`crypto.packing`) into one value with Horner's
rule; under encryption a shift by ``w`` bits is ``c^(2^w)`` modulo the cipher modulus (``n^2``
Paillier, ``n`` Okamoto-Uchiyama: :mod:`crypto.schemes`) and an addition is a multiplication.
The key holder then decrypts ``per`` times fewer ciphertexts and splits the signed-digit stream back into sums.

Cost: Horner needs ``w`` squarings mod ``n**2`` per bin sum (``w`` = slot
width), about a thousand per output ciphertext; with many nodes of few rows
(small data, deep trees) that dominates the passive party's work. The key
holder can instead do the shifts in plaintext, where they are free: it sends
``per`` encryptions of every packed value, ``Enc(v * 2**(s*w))`` for
``s = 0..per-1`` (``shifts = per``: :func:`direct_block`, run by the shards' workers), and the
passive party adds each row straight into the slot of its bin: no squaring at
all, ``per`` times more encryption (cheap for the key holder: fixed-base
table and CRT) and gradient bytes.

In between, ``shifts = k`` copies with a **stride** ``s = ceil(per / k)`` (:func:`stride_for`):
copy ``a`` is ``Enc(v * 2**(a*s*w))``. A bin at position ``p = a*s + b`` of its output
ciphertext goes into accumulator ``b`` of that output through copy ``a``; the ``s``
accumulators of an output are then joined by Horner's rule with ``(s - 1) * w``
squarings (:func:`compress` with ``per = s``). ``k`` copies cut the squarings ~``k``-fold
for ``k`` times the bytes: a few copies remove most of Horner's work at a fraction of the
bytes of all ``per`` of them. :func:`choose_shifts` picks the cheapest ``k`` per round.
Every choice gives identical ciphertext plaintexts.
"""
from __future__ import annotations

import time
from typing import Sequence

import gmpy2
import numpy as np

from crypto import parallel
from crypto.intcodec import bytes_to_ints, int_width, ints_to_bytes


def compress(values: Sequence, shift_bits: int, per: int, modulus=None, *, executor=None) -> list:
    """Group ``values`` by ``per`` (last group may be shorter); first value ends lowest.

    With ``modulus`` and an ``executor`` big batches (:func:`crypto.parallel.on_workers`)
    are cut into chunks of whole groups and spread over its workers."""
    if per < 1 or shift_bits < 1:
        raise ValueError("per and shift_bits must be positive")
    if modulus is not None and parallel.on_workers(executor, "compress", len(values) * shift_bits):
        return _compress_workers(values, shift_bits, per, modulus, executor)
    out = []
    if modulus is None:
        for start in range(0, len(values), per):
            chunk = values[start:start + per]
            acc = int(chunk[-1])
            for v in reversed(chunk[:-1]):
                acc = (acc << shift_bits) + int(v)
            out.append(acc)
        return out
    m = gmpy2.mpz(modulus)
    shift = gmpy2.mpz(1) << shift_bits
    for start in range(0, len(values), per):
        chunk = values[start:start + per]
        acc = gmpy2.mpz(chunk[-1])
        for v in reversed(chunk[:-1]):
            acc = gmpy2.powmod(acc, shift, m) * v % m
        out.append(acc)
    return out


def _compress_workers(values, shift_bits, per, modulus, executor):
    w = int_width(modulus)
    groups = -(-len(values) // per)
    n_chunks = min(groups, 4 * executor.n_workers)
    step = -(-groups // n_chunks) * per
    mhex = format(int(modulus), "x")
    replies = executor.map([({"op": "compress", "modulus": mhex, "shift_bits": shift_bits, "per": per},
                             [ints_to_bytes(values[i:i + step], w)]) for i in range(0, len(values), step)])
    return [v for _, blobs in replies for v in bytes_to_ints(blobs[0], w)]


# --- straight into compressed slots, from pre-shifted copies ---------------------
def stride_for(per: int, shifts: int) -> int:
    """Slots between two consecutive pre-shifted copies when ``shifts`` copies cover ``per``
    slots (``per``: no copy, Horner over every slot; 1: one copy per slot)."""
    return -(-int(per) // max(1, int(shifts)))


def shift_choices(per: int) -> list[int]:
    """The useful numbers of copies for ``per`` slots: ``ceil(per / stride)`` for every stride
    (other counts only add copies that no slot uses)."""
    return sorted({-(-int(per) // s) for s in range(1, max(1, int(per)) + 1)})


def check_shifts(shifts: int, per: int) -> str | None:
    """Why ``shifts`` copies are not valid for ``per`` slots per ciphertext (None: valid): every
    copy's shift must stay inside the ciphertext's ``per`` slots."""
    if not (isinstance(shifts, int) and 1 <= shifts <= max(1, per)):
        return f"shifts must be between 1 and values_per_ciphertext={per}, got {shifts}"
    if (shifts - 1) * stride_for(per, shifts) > per - 1:
        return f"{shifts} pre-shifted copies do not fit {per} slots (use one of {shift_choices(per)})"
    return None


def shifted_plaintexts(packed: Sequence[int], shift_bits: int, shifts: int, stride: int = 1) -> list[int]:
    """``packed[i] << (s * stride * shift_bits)`` for ``s`` in ``range(shifts)``, shift-major (what
    the key holder encrypts when it does the compression shifts in plaintext)."""
    return [int(v) << (s * stride * shift_bits) for s in range(shifts) for v in packed]


def choose_shifts(n_samples: int, n_bins: int, per: int, shift_bits: int, max_depth: int,
                  encrypt_cost: float = 24.0, trees_per_round: int = 1, n_groups: int = 1, *,
                  wire_seconds_per_byte: float = 0.0, cipher_bytes: int = 0,
                  squaring_seconds: float | None = None) -> int:
    """The number of pre-shifted copies (one of :func:`shift_choices`) that makes one round
    cheapest: 1 (Horner only) ... ``per`` (no Horner).

    ``n_bins``: slots of all passive parties' histograms of one node; ``trees_per_round``
    trees (one per class) share ``n_groups`` gradient vectors. Costs are
    in squarings mod ``n**2``: with ``k`` copies (stride ``s``, :func:`stride_for`) Horner
    spends ``(s - 1) * shift_bits`` per output ciphertext; the copies cost
    ``(k - 1) * n_samples * n_groups`` encryptions of about ``encrypt_cost`` squarings each
    (fixed-base table with the CRT, measured at 1024 and 2048 bits). Nodes built per tree and
    level: 1 at the root, then at most ``2**(d-1)`` smaller children, and never more than
    ``n_samples / 4``.

    The copies also pay for their bytes: ``(k - 1) * n_samples * n_groups`` more
    ciphertexts of ``cipher_bytes``, sent to every peer over the active party's one uplink:
    ``wire_seconds_per_byte`` is the sum over the peers of one over each peer's throughput
    (measured or given by the user; 0: bytes are free), converted into squarings with
    ``squaring_seconds`` (one multiplication mod ``n**2``, :func:`squaring_seconds`).
    """
    if per <= 1:
        return 1
    built = sum(1 if d == 0 else min(2 ** (d - 1), max(1, n_samples // 4)) for d in range(max_depth))
    outputs = trees_per_round * built * n_bins / per
    per_copy = n_samples * n_groups * encrypt_cost
    if wire_seconds_per_byte:
        if not wire_seconds_per_byte > 0 or squaring_seconds is None or not squaring_seconds > 0:
            raise ValueError("bytes on the wire need a positive time per byte and a positive squaring time")
        per_copy += n_samples * n_groups * cipher_bytes * wire_seconds_per_byte / squaring_seconds
    best, best_cost = 1, None
    for k in shift_choices(per):
        cost = outputs * (stride_for(per, k) - 1) * shift_bits + (k - 1) * per_copy
        if best_cost is None or cost < best_cost:
            best, best_cost = k, cost
    return best


def squaring_seconds(modulus, repeat: int = 1000, runs: int = 5) -> float:
    """Seconds of one multiplication mod ``modulus`` on this machine (the best of ``runs``
    runs, so a busy machine's interruptions do not count; ~10 ms at 2048-bit keys)."""
    m = gmpy2.mpz(modulus)
    x = (m - 3) // 2 + 1
    best = float("inf")
    for _ in range(runs):
        y = x
        t0 = time.perf_counter()
        for _ in range(repeat):
            y = y * y % m
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best


def direct_block(values: Sequence, n_samples: int, rows, bins, slot0: int, n_bins: Sequence[int],
                 per: int, modulus=None, stride: int = 1) -> tuple[int, list]:
    """Add the rows of one block straight into compressed ciphertexts.

    ``values[a * n_samples + i]`` is sample ``i``'s value shifted by ``a * stride`` slots;
    the block's first bin is flat slot ``slot0`` (flat over all nodes of the
    request). Returns ``(first ciphertext index, partial accumulators)``: ``stride``
    accumulators per ciphertext (accumulator ``b`` of ciphertext ``c`` at ``(c - c0) *
    stride + b``; with ``stride`` 1 the ciphertexts themselves)."""
    rows = np.asarray(rows, dtype=np.int64)
    bins = np.asarray(bins)
    width = int(sum(n_bins))
    c0 = slot0 // per
    c1 = (slot0 + max(width, 1) - 1) // per
    one = 0 if modulus is None else 1
    acc = [one] * ((c1 - c0 + 1) * stride)
    m = modulus
    off = slot0
    for f, nb in enumerate(n_bins):
        slots = off + bins[:, f].astype(np.int64)
        pos = slots % per
        idx = (pos // stride) * n_samples + rows
        cj = ((slots // per - c0) * stride + pos % stride).tolist()
        if m is None:
            for x, c in zip(idx.tolist(), cj):
                acc[c] += values[x]
        else:
            for x, c in zip(idx.tolist(), cj):
                acc[c] = acc[c] * values[x] % m
        off += int(nb)
    return c0, acc
