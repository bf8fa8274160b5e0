"""The histogram kernel: per-(feature, bin) sums of packed gradients over one block of rows.

:func:`block_sums` is what every worker runs for a shard's rows at a node
(:mod:`crypto.shards`: ``shard_hist``, ``shards_hist``, ``root_partial``; issue 24 removed the
older per-request paths that shipped the whole ciphertext vector to every worker):

* ``vals``: the block's packed values, one per row. With ``modulus`` set they are raw ciphertexts
  (gmpy2 ``mpz`` in ``[1, modulus)``) and "sum" means the homomorphic addition, multiplication
  modulo ``modulus``, the key's cipher modulus (:mod:`crypto.schemes`: ``n**2`` for Paillier, ``n``
  for Okamoto-Uchiyama); without it they are plaintext ints and "sum" is
  integer addition (``plain`` mode).
* ``bins``: ``(rows, n_features)`` integer bin of every row; ``n_bins``: slots per feature.
* ``stats``: optional dict; ``stats["additions"]`` counts the homomorphic additions performed.
* ``joint``: ``"auto"`` (default) picks, per group of consecutive features, plain per-feature
  accumulation (k=1) or accumulation over the *joint* bins of a pair (k=2) or triple (k=3) of
  features followed by summing joint cells into each feature's bins: ``n + (k-1)*C`` additions
  for ``k`` features instead of ``k*n`` (``C`` = non-empty joint cells, known exactly from the
  bins before any ciphertext work). ``1``, ``2`` or ``3`` force that group size (tests,
  benchmarks).

Returns the flat sums; an empty bin holds the identity (``1`` for ciphertexts, the encryption of
zero with ``r = 1``; ``0`` in plaintext). Every variant yields exactly the same sums
(multiplication modulo the cipher modulus is associative and commutative).

Implementation notes (measured, see ``benchmarks/hist_kernel.py``): the inner
loop ``acc[c] = acc[c] * v % m`` streams the ciphertexts in row order into a
small accumulator list, which runs within ~2% of a bare gmpy2 mulmod loop;
visiting rows sorted by bin was slower (the ciphertexts are then read out of
order, out of cache), and delaying the reduction (``acc * a * b % m``)
costs more than it saves at these sizes.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

MAX_JOINT_CELLS = 1 << 17     # a joint group's code space (accumulator list length)
MIN_JOINT_ROWS = 64           # below this a unit accumulates feature by feature
JOINT_MARGIN = 0.9            # joint cells must save 10% (their loops cost a little more per item)


def _check_joint(joint):
    if joint not in ("auto", 1, 2, 3):
        raise ValueError(f"joint must be 'auto', 1, 2 or 3, got {joint!r}")
    return joint


def _accumulate(vals, codes, n_cells, modulus):
    """Sum ``vals`` into ``n_cells`` cells by ``codes`` (a list of ints)."""
    if modulus is None:
        acc = [0] * n_cells
        for v, c in zip(vals, codes):
            acc[c] += v
        return acc
    m = modulus
    acc = [1] * n_cells
    for v, c in zip(vals, codes):
        acc[c] = acc[c] * v % m
    return acc


def _marginals(cells, nonempty, dims, modulus):
    """Per-feature bin sums from the joint cells ``cells[code]`` (mixed radix ``dims``)."""
    outs = [[0 if modulus is None else 1] * d for d in dims]
    nz = np.asarray(nonempty, dtype=np.int64)
    digits = []
    rest = nz
    for d in reversed(dims):                         # last feature varies fastest
        digits.append((rest % d).tolist())
        rest = rest // d
    digits.reverse()
    vals = [cells[c] for c in nz.tolist()]
    m = modulus
    for out, dig in zip(outs, digits):
        if m is None:
            for v, b in zip(vals, dig):
                out[b] += v
        else:
            for v, b in zip(vals, dig):
                out[b] = out[b] * v % m
    return outs


def plan_groups(bins: np.ndarray, n_bins: Sequence[int], joint="auto") -> list[tuple[int, ...]]:
    """Split the columns of ``bins`` (one unit's rows) into consecutive groups of 1-3 features.

    ``auto`` walks the features and takes, at each position, the group size with
    the lowest additions per feature: ``n`` alone, ``(n + C2)/2`` for a pair,
    ``(n + 2*C3)/3`` for a triple, with ``C`` the exact number of non-empty
    joint cells; a group must beat ``JOINT_MARGIN * n``.
    """
    joint = _check_joint(joint)
    n, F = bins.shape
    groups: list[tuple[int, ...]] = []
    if joint == 1 or (joint == "auto" and n < MIN_JOINT_ROWS):
        return [(f,) for f in range(F)]
    f = 0
    while f < F:
        best, best_cost = (f,), JOINT_MARGIN * n
        for k in ((2, 3) if joint == "auto" else (joint,)):
            if f + k > F:
                continue
            dims = [int(n_bins[f + j]) for j in range(k)]
            if int(np.prod(dims)) > MAX_JOINT_CELLS:
                continue
            cells = int(np.count_nonzero(np.bincount(_codes(bins, f, dims), minlength=int(np.prod(dims)))))
            cost = (n + (k - 1) * cells) / k
            if joint != "auto" or cost < best_cost:
                best, best_cost = tuple(range(f, f + k)), cost
        groups.append(best)
        f += len(best)
    return groups


def _codes(bins: np.ndarray, f0: int, dims: Sequence[int]) -> np.ndarray:
    code = bins[:, f0].astype(np.int64)
    for j, d in enumerate(dims[1:], start=1):
        code = code * int(d) + bins[:, f0 + j]
    return code


def block_sums(vals: Sequence, bins: np.ndarray, n_bins: Sequence[int], modulus=None, joint="auto",
               stats: dict | None = None) -> list:
    """The flat bin sums of one block: rows ``vals``/``bins`` (``bins[i, j]`` = bin of row i in
    the block's feature j, with ``n_bins[j]`` slots). Used inline and by the workers.

    ``stats["additions"]`` is increased by the homomorphic additions performed, not
    counting the first value into an empty slot (the textbook count for one feature is
    ``n - non-empty bins``)."""
    bins = np.asarray(bins)
    n = bins.shape[0]
    out: list = []
    adds = 0
    for group in plan_groups(bins, n_bins, joint):
        dims = [int(n_bins[f]) for f in group]
        if len(group) == 1:
            col = bins[:, group[0]]
            out.extend(_accumulate(vals, col.tolist(), dims[0], modulus))
            adds += n - int(np.count_nonzero(np.bincount(col, minlength=dims[0]))) if n else 0
            continue
        codes = _codes(bins, group[0], dims)
        n_cells = int(np.prod(dims))
        cells = _accumulate(vals, codes.tolist(), n_cells, modulus)
        nonempty = np.flatnonzero(np.bincount(codes, minlength=n_cells))
        for marg in _marginals(cells, nonempty, dims, modulus):
            out.extend(marg)
        if n:
            adds += n - len(nonempty) + sum(len(nonempty) - int(np.count_nonzero(np.bincount(
                _codes(bins, f, [d]), minlength=d))) for f, d in zip(group, dims))
    if stats is not None:
        stats["additions"] = stats.get("additions", 0) + adds
    return out
