"""The histogram kernel: per-node, per-(feature, bin) sums of packed gradients.

Contract (the hot path; one function, one contract)::

    histogram(values, bin_idx, node_rows, bin_offsets, modulus=None, *, executor=None, joint="auto")
        -> list[list]

* ``values``: one packed value per sample (``n_samples``). With ``modulus`` set
  they are raw Paillier ciphertexts (gmpy2 ``mpz`` in ``[1, modulus)``) and
  "sum" means the homomorphic addition, multiplication modulo
  ``modulus = n**2``; without it they are plaintext ints and "sum" is integer
  addition (``plain`` mode).
* ``bin_idx``: ``(n_samples, n_features)`` integer bin of every sample.
* ``node_rows``: one array of sample indices per node to build (many nodes at
  once: a whole tree level).
* ``bin_offsets``: ``(n_features + 1,)``; feature ``feature_idx`` owns the flat
  slots ``bin_offsets[feature_idx]:bin_offsets[feature_idx + 1]``.
* ``executor``: a :class:`crypto.executor.Executor`; requests big enough for
  :func:`crypto.parallel.on_workers` (ciphertexts only) are cut into (node,
  feature block, row range) units spread over its workers. ``values`` and
  ``bin_idx`` are shared into the workers once and stay there while the caller
  passes the same objects (one ship per round).
* ``stats``: optional dict; ``stats["additions"]`` counts the homomorphic
  additions performed (benchmarks).
* ``slot``: the name under which the executor keeps ``values`` (a caller that keeps
  several vectors in the workers at once, e.g. one per target group, names each).
* ``joint``: ``"auto"`` (default) lets each unit pick, per group of
  consecutive features, plain per-feature accumulation (k=1) or accumulation
  over the *joint* bins of a pair (k=2) or triple (k=3) of features followed
  by summing joint cells into each feature's bins: ``n + (k-1)*C`` additions
  for ``k`` features instead of ``k*n`` (``C`` = non-empty joint cells, known
  exactly from the bins before any ciphertext work). ``1``, ``2`` or ``3``
  force that group size (tests, benchmarks).

Returns, per node, a list of ``bin_offsets[-1]`` sums; an empty bin holds the
identity (``1`` for ciphertexts, the encryption of zero with ``r = 1``; ``0``
in plaintext). Every variant yields exactly the same sums (multiplication mod
``n**2`` is associative and commutative). :func:`reference_histogram` is the
naive plaintext oracle.

Implementation notes (measured, see ``benchmarks/hist_kernel.py``): the inner
loop ``acc[c] = acc[c] * v % m`` streams the ciphertexts in row order into a
small accumulator list, which runs within ~2% of a bare gmpy2 mulmod loop;
visiting rows sorted by bin was slower (the ciphertexts are then read out of
order, out of cache), and delaying the reduction (``acc * a * b % m``)
costs more than it saves at these sizes.
"""
from __future__ import annotations

from typing import Sequence

import gmpy2
import numpy as np

from crypto import parallel
from crypto.intcodec import bytes_to_ints, int_width, ints_to_bytes

MAX_JOINT_CELLS = 1 << 17     # a joint group's code space (accumulator list length)
MIN_JOINT_ROWS = 64           # below this a unit accumulates feature by feature
JOINT_MARGIN = 0.9            # joint cells must save 10% (their loops cost a little more per item)
UNITS_PER_WORKER = 8


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


def _units(sizes: Sequence[int], n_features: int, n_workers: int):
    """Cut (node, feature block, row range) units of roughly equal additions."""
    total = sum(sizes) * n_features
    target = max(parallel.POLICY.unit, total // max(1, UNITS_PER_WORKER * n_workers))
    units = []
    for j, n in enumerate(sizes):
        if n == 0:
            continue
        if n * n_features <= target:
            blocks = [(0, n_features)]
        else:
            width = max(min(6, n_features), (target // max(n, 1)) // 6 * 6)
            blocks = [(f, min(f + width, n_features)) for f in range(0, n_features, width)]
        for f0, f1 in blocks:
            r = max(1, -(-n * (f1 - f0) // target))
            step = -(-n // r)
            for r0 in range(0, n, step):
                units.append((j, f0, f1, r0, min(r0 + step, n)))
    units.sort(key=lambda u: -(u[4] - u[3]) * (u[2] - u[1]))
    return units


def share_inputs(executor, values, bin_idx, modulus, slot: str = "values") -> None:
    """Ship ``values`` (ciphertexts) and ``bin_idx`` to the executor's workers unless they hold them."""
    width = int_width(modulus)
    executor.share_lazy(slot, values, lambda: ({"kind": "ints", "width": width, "signed": False},
                                               [ints_to_bytes(values, width)]))
    executor.share_lazy("bins", bin_idx, lambda: ({"kind": "array", "dtype": bin_idx.dtype.str,
                                                   "shape": list(bin_idx.shape)},
                                                  [np.ascontiguousarray(bin_idx).tobytes()]))


def share_rows(executor, node_rows) -> tuple[list[int], object]:
    sizes = [len(r) for r in node_rows]
    rows = np.concatenate([np.asarray(r, dtype=np.int64) for r in node_rows]) if node_rows else \
        np.zeros(0, dtype=np.int64)
    token = object()
    executor.share("rows", token, {"kind": "array", "dtype": rows.dtype.str, "shape": [len(rows)],
                               "sizes": sizes}, [rows.tobytes()])
    return sizes, token


def histogram(values: Sequence, bin_idx: np.ndarray, node_rows: Sequence[np.ndarray],
              bin_offsets: np.ndarray, modulus=None, *, executor=None, joint="auto",
              stats: dict | None = None, slot: str = "values") -> list[list]:
    joint = _check_joint(joint)
    bin_idx = np.asarray(bin_idx)
    offsets = np.asarray(bin_offsets, dtype=np.int64)
    n_bins = np.diff(offsets).tolist()
    n_features = len(n_bins)
    if bin_idx.ndim != 2 or bin_idx.shape[1] != n_features:
        raise ValueError(f"bin_idx of shape {bin_idx.shape} does not match {n_features} features")
    node_rows = [np.asarray(r, dtype=np.int64) for r in node_rows]
    total = int(offsets[-1])
    work = sum(len(r) for r in node_rows) * n_features
    if modulus is not None and parallel.on_workers(executor, "histogram", work):
        return _histogram_workers(executor, values, bin_idx, node_rows, offsets, modulus, joint, stats, slot)
    out = []
    for rows in node_rows:
        if len(rows) == len(values) and np.array_equal(rows, np.arange(len(values))):
            vals = values
        else:
            vals = [values[r] for r in rows.tolist()]
        sums = block_sums(vals, bin_idx[rows], n_bins, modulus, joint, stats)
        assert len(sums) == total
        out.append(sums)
    return out


def _histogram_workers(executor, values, bin_idx, node_rows, offsets, modulus, joint, stats=None,
                       slot="values"):
    width = int_width(modulus)
    share_inputs(executor, values, bin_idx, modulus, slot)
    sizes, _ = share_rows(executor, node_rows)
    n_features = len(offsets) - 1
    units = _units(sizes, n_features, executor.n_workers)
    mhex = format(int(modulus), "x")
    replies = executor.map([({"op": "hist", "values": slot, "bins": "bins", "rows": "rows", "node": j,
                          "f0": f0, "f1": f1, "r0": r0, "r1": r1, "modulus": mhex,
                          "n_bins": np.diff(offsets[f0:f1 + 1]).tolist(), "joint": joint}, ())
                        for j, f0, f1, r0, r1 in units])
    m = gmpy2.mpz(modulus)
    total = int(offsets[-1])
    out = [[gmpy2.mpz(1)] * total for _ in node_rows]
    adds = 0
    for (j, f0, f1, _, _), (header, blobs) in zip(units, replies):
        acc = out[j]
        start = int(offsets[f0])
        adds += int(header.get("additions", 0))
        for i, v in enumerate(bytes_to_ints(blobs[0], width), start=start):
            if acc[i] == 1:
                acc[i] = v
            elif v != 1:                       # partial sums of the same bin from two row ranges
                acc[i] = acc[i] * v % m
                adds += 1
    if stats is not None:
        stats["additions"] = stats.get("additions", 0) + adds
    return out


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
