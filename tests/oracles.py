"""Test oracles of the histogram kernels, and the training's kernel (:meth:`crypto.shards.ShardSet.histograms`)
run on a given executor for arbitrary nodes.

The inline twins (:func:`node_histograms`, :func:`compressed_histogram`) are what the deleted
``crypto.histogram.histogram`` / ``crypto.compress.compressed_histogram`` computed in the calling
process: per node, the kernel the workers run (:func:`crypto.histogram.block_sums`,
:func:`crypto.compress.direct_block`); :func:`reference_histogram` is the naive plaintext oracle."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from crypto.compress import compress, direct_block
from crypto.histogram import block_sums
from crypto.intcodec import int_width, ints_to_bytes
from crypto.packing import PackingLayout
from crypto.shards import ShardedGradients, ShardSet, value_width


def reference_histogram(plain_values: Sequence[int], bin_idx: np.ndarray,
                        node_rows: Sequence[np.ndarray], bin_offsets: np.ndarray) -> list[list[int]]:
    """Naive plaintext oracle: sum of ``plain_values`` per node, feature and bin."""
    bin_idx = np.asarray(bin_idx)
    out = []
    for rows in node_rows:
        rows = set(int(r) for r in rows)
        sums = []
        for feature_idx in range(bin_idx.shape[1]):
            n_bins = int(bin_offsets[feature_idx + 1] - bin_offsets[feature_idx])
            for b in range(n_bins):
                sums.append(sum(int(plain_values[r]) for r in rows if int(bin_idx[r, feature_idx]) == b))
        out.append(sums)
    return out


def node_histograms(values: Sequence, bin_idx: np.ndarray, node_rows: Sequence[np.ndarray], bin_offsets,
                    modulus=None, joint="auto", stats: dict | None = None) -> list[list]:
    """Per node, the flat (feature, bin) sums of ``values`` (ciphertexts mod ``modulus``, or plain
    ints): :func:`crypto.histogram.block_sums` over the node's rows, in this process."""
    bin_idx = np.asarray(bin_idx)
    n_bins = np.diff(np.asarray(bin_offsets, dtype=np.int64)).tolist()
    out = []
    for rows in node_rows:
        rows = np.asarray(rows, dtype=np.int64)
        out.append(block_sums([values[r] for r in rows.tolist()], bin_idx[rows], n_bins, modulus, joint, stats))
    return out


def compressed_histogram(values: Sequence, bin_idx, node_rows, bin_offsets, shift_bits: int, per: int,
                         modulus=None, *, shifts: int = 1, executor=None, joint="auto") -> list:
    """What a passive party returns for ``node_rows``, ``per`` bin sums per output value:
    ``shifts=1``: :func:`node_histograms` then Horner :func:`crypto.compress.compress` (on
    ``executor`` if given); ``shifts=per``: ``values`` holds ``per`` shifted copies per sample
    and each row goes straight into its slot (:func:`crypto.compress.direct_block`)."""
    if shifts == 1:
        hists = node_histograms(values, bin_idx, node_rows, bin_offsets, modulus, joint)
        return compress([v for h in hists for v in h], shift_bits, per, modulus, executor=executor)
    if shifts != per:
        raise ValueError(f"shifts must be 1 or per={per}, got {shifts}")
    bin_idx = np.asarray(bin_idx)
    offsets = np.asarray(bin_offsets, dtype=np.int64)
    n_bins = np.diff(offsets).tolist()
    n_samples = bin_idx.shape[0]
    total = int(offsets[-1])
    out = [0 if modulus is None else 1] * (-(-total * len(node_rows) // per))
    for j, rows in enumerate(node_rows):
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            continue
        c0, accs = direct_block(values, n_samples, rows, bin_idx[rows], j * total, n_bins, per, modulus)
        for c, a in enumerate(accs, start=c0):
            out[c] = out[c] + a if modulus is None else (a if out[c] == 1 else out[c] * a % modulus)
    return out


def sharded_histograms(executor, values: Sequence, bin_idx: np.ndarray, node_rows: Sequence[np.ndarray],
                       bin_offsets, modulus=None, *, layout: PackingLayout | None = None, shifts: int = 1,
                       per: int = 1, joint="auto", max_rows: int | None = None, stats: dict | None = None):
    """The training's kernel on ``executor``: the rows cut into shards on its workers (bins placed,
    ``values`` written as the intake does), every node a tree of its own, one
    :meth:`crypto.shards.ShardSet.histograms` request. ``shifts == 1``: per node its flat sums
    (like :func:`node_histograms`); else the compressed output (like :func:`compressed_histogram`)."""
    bin_idx = np.asarray(bin_idx)
    n = bin_idx.shape[0]
    n_bins = np.diff(np.asarray(bin_offsets, dtype=np.int64)).tolist()
    layout = layout or PackingLayout.for_bounds(1.0, 0.25, max_rows=n)
    shards = ShardSet(executor, n, max_rows=max_rows, prefix="oracle/")
    try:
        shards.place_array("bins", bin_idx)
        width, signed = value_width(modulus, layout.value_bits, per if shifts > 1 else 1)
        if modulus is not None:
            width, signed = int_width(modulus), False
        g = ShardedGradients(0, modulus is not None, layout, int(per), int(shifts), 1, width, signed,
                             np.zeros(n, dtype=bool))
        shards.forward(g, 0, n, ints_to_bytes(list(values), width, signed),
                       None if modulus is None else format(int(modulus), "x"))
        assignment = np.zeros((max(1, len(node_rows)), n), dtype=np.int64)
        for t, rows in enumerate(node_rows):
            assignment[t, np.asarray(rows, dtype=np.int64)] = 1
        sums, header = shards.histograms(g, assignment, list(range(len(node_rows))), [1] * len(node_rows),
                                         n_bins, modulus, joint)
    finally:
        shards.drop()
    if stats is not None:
        stats["additions"] = stats.get("additions", 0) + int(header.get("additions", 0))
    if shifts > 1:
        return sums
    total = int(sum(n_bins))
    return [sums[j * total:(j + 1) * total] for j in range(len(node_rows))]
