"""Bin edges across row shards without gathering a column: per-shard column summaries
(:class:`ColumnSummary`, exact up to ``max_points`` distinct values, else compressed), their
pairwise merge, and :class:`~vfl.core.binning.Binner`'s edges from a merged summary.
"""
from __future__ import annotations

import numpy as np

from datasets.errors import InputError
from vfl.core.binning import Binner, _thresholds, check_max_bin

# A party whose rows are cut into shards (e.g. on Dask workers) fits the same thresholds without
# gathering a column on one process: every shard summarises each of its columns
# (:func:`summarize_shard`), the summaries are merged pairwise in any order (:func:`merge_summaries`,
# a tree reduction), and :func:`thresholds_from_summary` picks the edges.
#
# A summary is EXACT while it holds every distinct value with its count (at most ``max_points``
# distinct values); the edges of an exact summary are those of :class:`Binner` on the gathered
# column, bit for bit: the few-distinct-values rule uses the same midpoints and the quantile rule
# computes numpy's ``percentile(..., method="midpoint")`` on the multiset the summary describes
# (equal values; 0.0 and -0.0 count as one value).
# A column with more distinct values than ``max_points`` (in a shard or after a merge) gets an
# APPROXIMATE summary: its sorted multiset cut into ``max_points`` blocks of consecutive ranks, each
# block kept as one value (the value at the block's middle rank) with the block's count; the
# smallest and largest values are always kept exactly. The quantile rule then runs on that multiset,
# so every edge is a value of the column (or the midpoint of two) within about
# ``n / max_points`` ranks of the exact edge; which values are kept depends on the shard layout and
# the merge order (deterministic for a fixed layout); :class:`ExactEdges` (below) then makes them
# exact in a few small rounds. Missing values (NaN) are counted, never binned: they go to the
# missing bin exactly as in :class:`Binner`.

DEFAULT_SUMMARY_POINTS = 4096


class ColumnSummary:
    """One column's values on one shard (or merged from several): sorted ``values`` with ``counts``.

    ``exact``: the summary holds every distinct non-missing value with its true count;
    ``n_missing``: how many NaN the column holds (counted, never binned)."""

    __slots__ = ("values", "counts", "exact", "n_missing")

    def __init__(self, values, counts, exact: bool, n_missing: int = 0):
        self.values = np.asarray(values, dtype=np.float64)
        self.counts = np.asarray(counts, dtype=np.int64)
        self.exact = bool(exact)
        self.n_missing = int(n_missing)
        if self.values.shape != self.counts.shape or self.values.ndim != 1:
            raise InputError("a column summary needs as many counts as values")
        if np.isnan(self.values).any() or (self.counts <= 0).any() or (np.diff(self.values) <= 0).any():
            raise InputError("a column summary holds strictly increasing non-missing values with positive counts")

    @classmethod
    def _trusted(cls, values: np.ndarray, counts: np.ndarray, exact: bool, n_missing: int = 0) -> "ColumnSummary":
        """Built here from sorted distinct values and positive counts (no checks)."""
        obj = cls.__new__(cls)
        obj.values, obj.counts, obj.exact, obj.n_missing = values, counts, exact, n_missing
        return obj

    @property
    def n(self) -> int:
        """Non-missing values summarised."""
        return int(self.counts.sum())

    def to_dict(self) -> dict:
        return {"values": self.values.tolist(), "counts": self.counts.tolist(), "exact": self.exact,
                "n_missing": self.n_missing}

    @classmethod
    def from_dict(cls, d: dict) -> "ColumnSummary":
        try:
            return cls(d["values"], d["counts"], d["exact"], d["n_missing"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"bad column summary: {exc}") from None

    def __repr__(self) -> str:
        return (f"ColumnSummary({len(self.values)} points, n={self.n}, n_missing={self.n_missing}, "
                f"{'exact' if self.exact else 'approximate'})")


def _check_points(max_points) -> int:
    if isinstance(max_points, bool) or not isinstance(max_points, (int, np.integer)) or max_points < 256:
        raise InputError(f"max_points must be an integer >= 256 (the largest max_bin), got {max_points!r}")
    return int(max_points)


def _compress(values: np.ndarray, counts: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """The multiset ``values`` x ``counts`` (sorted, distinct) as at most ``max_points`` points:
    consecutive ranks in blocks, each block one value (its middle rank's) with the block's count;
    the first and the last rank are blocks of their own (min and max stay exact)."""
    n = int(counts.sum())
    inner = max_points - 2
    bounds = np.unique(np.concatenate([[0, 1], 1 + (np.arange(inner + 1) * (n - 2)) // inner, [n - 1, n]]))
    lo, hi = bounds[:-1], bounds[1:]
    cum = np.cumsum(counts)
    reps = values[np.searchsorted(cum, (lo + hi - 1) // 2, side="right")]
    weights = hi - lo
    start = _run_starts(reps)                                   # equal neighbours: one point
    return reps[start], np.add.reduceat(weights, start)


def _run_starts(v: np.ndarray) -> np.ndarray:
    """Where each run of equal values of a sorted array starts."""
    flag = np.ones(len(v), dtype=bool)
    flag[1:] = v[1:] != v[:-1]
    return np.flatnonzero(flag)


def _sorted_unique(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(v, return_counts=True)`` of an already sorted array, without sorting again."""
    start = _run_starts(v)
    return v[start], np.diff(np.append(start, len(v))).astype(np.int64)


def summarize_column(col, max_points: int = DEFAULT_SUMMARY_POINTS) -> ColumnSummary:
    """A shard's column (NaN = missing) as a :class:`ColumnSummary` of at most ``max_points`` points."""
    max_points = _check_points(max_points)
    col = np.asarray(col, dtype=np.float64)
    missing = np.isnan(col)
    values, counts = np.unique(col[~missing], return_counts=True)
    if len(values) <= max_points:
        return ColumnSummary(values, counts, True, int(missing.sum()))
    return ColumnSummary(*_compress(values, counts, max_points), False, int(missing.sum()))


def summarize_shard(X, max_points: int = DEFAULT_SUMMARY_POINTS) -> list[ColumnSummary]:
    """Every column of a shard's feature matrix (rows x features) summarised."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise InputError(f"a shard's features must be a 2-d matrix, got shape {X.shape}")
    return [summarize_column(X[:, j], max_points) for j in range(X.shape[1])]


def merge_summaries(summaries, max_points: int = DEFAULT_SUMMARY_POINTS) -> ColumnSummary:
    """One summary of the union of the shards' rows; exact when every input is exact and the union
    has at most ``max_points`` distinct values. Associative in the exact case (any tree order)."""
    max_points = _check_points(max_points)
    summaries = list(summaries)
    if not summaries:
        raise InputError("no column summaries to merge")
    values = np.concatenate([s.values for s in summaries])
    counts = np.concatenate([s.counts for s in summaries])
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    distinct, start = np.unique(values, return_index=True)
    counts = np.add.reduceat(counts, start) if len(values) else counts
    n_missing = sum(s.n_missing for s in summaries)
    exact = all(s.exact for s in summaries)
    if len(distinct) <= max_points:
        return ColumnSummary(distinct, counts, exact, n_missing)
    return ColumnSummary(*_compress(distinct, counts, max_points), False, n_missing)


def merge_shard_summaries(shards, max_points: int = DEFAULT_SUMMARY_POINTS) -> list[ColumnSummary]:
    """Per feature, the merge of every shard's summary (``shards``: one :func:`summarize_shard`
    result per shard, all with the same number of features)."""
    shards = [list(s) for s in shards]
    if not shards:
        raise InputError("no shard summaries to merge")
    widths = {len(s) for s in shards}
    if len(widths) != 1:
        raise InputError(f"shard summaries disagree on the number of features: {sorted(widths)}")
    return [merge_summaries([s[j] for s in shards], max_points) for j in range(widths.pop())]


def _midpoint_ranks(n: int, max_bin: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy's ``percentile(method="midpoint")`` at Binner's quantiles of ``n`` sorted values:
    per quantile the ranks of its two neighbours and the interpolation weight (0 or 0.5)."""
    return _midpoint_ranks_at(n, np.linspace(0, 100, max_bin + 1)[1:-1])


def _midpoint_ranks_at(n: int, qs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    quantiles = np.true_divide(np.asanyarray(qs, dtype=np.float64), 100)
    virtual = 0.5 * (np.floor((n - 1) * quantiles) + np.ceil((n - 1) * quantiles))
    gamma = np.where(virtual % 1 == 0, 0.0, 0.5)
    prev = np.floor(virtual).astype(np.int64)
    nxt = prev + 1
    top = virtual >= n - 1
    prev[top] = n - 1
    nxt[top] = n - 1
    return prev, nxt, gamma


def _midpoint_lerp(a: np.ndarray, b: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """numpy's ``_lerp`` (the same operations, so the same bits)."""
    diff = b - a
    out = a + diff * gamma
    return np.where(gamma >= 0.5, b - diff * (1 - gamma), out)


def _at_ranks(values: np.ndarray, counts: np.ndarray, ranks) -> np.ndarray:
    """The values at 0-based ``ranks`` of the sorted multiset ``values`` x ``counts``."""
    return values[np.searchsorted(np.cumsum(counts), ranks, side="right")]


def _multiset_midpoint_percentiles(values: np.ndarray, counts: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """``np.percentile(np.repeat(values, counts), qs, method="midpoint")`` without the repeat: the
    same virtual indices, neighbours and interpolation as numpy (so the same bits)."""
    prev, nxt, gamma = _midpoint_ranks_at(int(counts.sum()), qs)
    return _midpoint_lerp(_at_ranks(values, counts, prev), _at_ranks(values, counts, nxt), gamma)


def thresholds_from_summary(summary: ColumnSummary, max_bin: int) -> np.ndarray:
    """A feature's thresholds from its merged summary; for an exact summary, those of
    :class:`Binner` on the gathered column (same rule, same bits)."""
    max_bin = check_max_bin(max_bin)
    distinct, counts = summary.values, summary.counts
    if distinct.size == 0:
        return np.empty(0)
    if distinct.size <= max_bin and summary.exact:
        return _thresholds(distinct, max_bin)       # the few-distinct-values rule of Binner itself
    qs = np.linspace(0, 100, max_bin + 1)[1:-1]
    cuts = np.unique(_multiset_midpoint_percentiles(distinct, counts, qs))
    return cuts[cuts < distinct[-1]]


def binner_from_summaries(summaries, max_bin: int = 32) -> Binner:
    """A fitted :class:`Binner` from the merged per-feature summaries (:func:`merge_shard_summaries`)."""
    binner = Binner(max_bin)
    binner.thresholds_ = [thresholds_from_summary(s, binner.max_bin) for s in summaries]
    return binner
