"""Quantile binning of one party's features, done locally; thresholds never leave it.

Feature ``feature_idx`` gets ``len(thresholds) + 1`` ordinary bins and one
extra bin for missing values (NaN), always the last. A value ``x`` falls in
bin ``#{t in thresholds : t < x}``, so "bin <= bin_idx" is exactly
"x <= thresholds[bin_idx]".

Categorical features (``categorical[j]`` true) hold category *codes* (non-negative integers
into the party's vocabulary, see :func:`datasets.frames.party_data`; -1 for a category never
seen in training, NaN for missing). Each of the ``max_cat`` most frequent codes gets its own
bin (bins ``0..k-1``, in code order), every other code -- rare categories, and at
prediction unseen ones -- falls in the pooled "other" bin ``k``, and missing values in the
missing bin ``k + 1``, so a categorical feature also has ``len(categories) + 2`` slots.
"""
from __future__ import annotations

import numpy as np

from datasets.errors import InputError


def check_max_bin(max_bin) -> int:
    if isinstance(max_bin, bool) or not isinstance(max_bin, (int, np.integer)) or not 2 <= max_bin <= 256:
        raise InputError(f"max_bin must be an integer from 2 to 256, got {max_bin!r}")
    return int(max_bin)


def midpoints(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Midpoints of ``lo < hi`` without overflow: ``lo/2 + hi/2`` (exact whenever ``(lo+hi)/2`` is
    finite and normal; near the float maximum the plain sum would overflow to inf). The result is
    pulled into ``[lo, hi)`` so "x <= midpoint" separates ``lo`` from ``hi`` even for adjacent
    floats and subnormals, where halving rounds."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    with np.errstate(over="ignore"):
        plain = (lo + hi) / 2.0
    mid = np.where(np.isfinite(plain), plain, lo / 2.0 + hi / 2.0)
    mid = np.where(mid >= hi, np.nextafter(hi, -np.inf), mid)
    return np.maximum(mid, lo)


def _thresholds(col: np.ndarray, max_bin: int) -> np.ndarray:
    values = col[~np.isnan(col)]
    if values.size == 0:
        return np.empty(0)
    distinct = np.unique(values)
    if distinct.size <= max_bin:
        return midpoints(distinct[:-1], distinct[1:])
    qs = np.linspace(0, 100, max_bin + 1)[1:-1]
    with np.errstate(over="ignore", invalid="ignore"):
        cuts = np.percentile(values, qs, method="midpoint")
    bad = ~np.isfinite(cuts)
    if bad.any():           # the midpoint of two values near the float maximum overflowed
        lo = np.percentile(values, qs[bad], method="lower")
        hi = np.percentile(values, qs[bad], method="higher")
        cuts[bad] = midpoints(lo, hi)
    cuts = np.unique(cuts)
    return cuts[cuts < distinct[-1]]


MAX_CAT_LIMIT = 1024      # category bins of one feature at most (max_cat)


def check_max_cat(max_cat) -> int:
    if isinstance(max_cat, bool) or not isinstance(max_cat, (int, np.integer)) or \
            not 1 <= max_cat <= MAX_CAT_LIMIT:
        raise InputError(f"max_cat must be an integer from 1 to {MAX_CAT_LIMIT}, got {max_cat!r}")
    return int(max_cat)


def _kept_codes(col: np.ndarray, max_cat: int) -> np.ndarray:
    """The codes that get their own bin: the ``max_cat`` most frequent (ties: smaller code first),
    in increasing code order."""
    codes = col[~np.isnan(col)].astype(np.int64)
    codes = codes[codes >= 0]
    if codes.size == 0:
        return np.empty(0, dtype=np.int64)
    counts = np.bincount(codes)
    present = np.flatnonzero(counts)
    order = present[np.lexsort((present, -counts[present]))]
    return np.sort(order[:max_cat])


def n_features(X) -> int:
    """Columns of ``X``: a 2-D array or a column reader (``shape`` and ``column(j)``, e.g.
    :class:`datasets.loaders.DeferredColumns`: a table read one column at a time)."""
    return int(X.shape[1])


def feature_column(X, j: int, rows=None) -> np.ndarray:
    """Column ``j`` of ``X`` (its rows ``rows``, in order) as float64: a view or a one-column copy
    of an array, or one column of a reader (read, then its rows taken)."""
    if isinstance(X, np.ndarray):
        col = X[:, j] if rows is None else X[rows, j]
        return col if col.dtype == np.float64 else col.astype(np.float64)
    col = np.asarray(X.column(j), dtype=np.float64)
    if col.ndim != 1 or len(col) != X.shape[0]:
        raise ValueError(f"column {j} of the reader has shape {col.shape}, expected ({X.shape[0]},)")
    return col if rows is None else col[rows]


def feature_matrix(X, rows=None) -> np.ndarray:
    """``X[rows]`` as a float64 matrix (column-major, filled a column at a time for a reader)."""
    if isinstance(X, np.ndarray):
        X = _as_features(X)
        return X if rows is None else X[rows]
    n = X.shape[0] if rows is None else len(rows)
    out = np.empty((n, n_features(X)), order="F")
    for j in range(out.shape[1]):
        out[:, j] = feature_column(X, j, rows)
    return out


def _as_features(X):
    """An array as float64 (a reader as it is)."""
    return np.asarray(X, dtype=np.float64) if not hasattr(X, "column") else X


def bin_dtype(n_bins) -> type:
    """uint8 when every feature has at most 256 slots (``n_bins``), else uint16: one byte a value."""
    n_bins = np.asarray(n_bins)
    return np.uint8 if n_bins.size == 0 or int(n_bins.max()) <= 256 else np.uint16


class Binner:
    """Fits per-feature thresholds (numeric) or category bins (categorical) and maps values to
    ``bin_idx``."""

    def __init__(self, max_bin: int = 32, categorical=None, max_cat: int = 64):
        self.max_bin = check_max_bin(max_bin)
        self.max_cat = check_max_cat(max_cat)
        self.categorical = None if categorical is None else np.asarray(categorical, dtype=bool)
        self.thresholds_: list[np.ndarray] | None = None
        self.categories_: dict[int, np.ndarray] = {}     # feature -> kept codes, bin order

    def is_categorical(self, feature_idx: int) -> bool:
        return self.categorical is not None and bool(self.categorical[feature_idx])

    def fit(self, X, rows=None) -> "Binner":
        """Edges of every column of ``X`` (an array or a column reader, see :func:`n_features`),
        or of its rows ``rows`` (read a column at a time: the row subset is never copied whole)."""
        X = self._start(X)
        for j in range(n_features(X)):
            self._fit_column(j, feature_column(X, j, rows))
        return self

    def fit_transform(self, X, rows=None) -> np.ndarray:
        """:meth:`fit` then :meth:`transform` as :attr:`bin_dtype`, in one pass over the columns:
        each column is read once, its edges found and its bins written before the next one is
        read (with a reader, one column of raw values in memory at a time). The bins are
        column-major: what a histogram or a split reads is one feature's column."""
        X = self._start(X)
        out = np.empty((X.shape[0] if rows is None else len(rows), n_features(X)), dtype=np.uint8, order="F")
        for j in range(n_features(X)):
            col = feature_column(X, j, rows)
            self._fit_column(j, col)
            if out.dtype == np.uint8 and len(self.thresholds_[j]) + 2 > 256:
                out = out.astype(np.uint16)      # this feature needs two bytes: every feature gets them
            out[:, j] = self._bins(j, col)
        return out

    def _start(self, X):
        X = _as_features(X)
        if self.categorical is not None and self.categorical.shape != (n_features(X),):
            raise ValueError(f"categorical mask of {self.categorical.shape} for {n_features(X)} features")
        self.thresholds_, self.categories_ = [], {}
        return X

    def _fit_column(self, j: int, col: np.ndarray) -> None:
        if self.is_categorical(j):
            kept = _kept_codes(col, self.max_cat)
            self.categories_[j] = kept
            self.thresholds_.append(np.arange(len(kept), dtype=np.float64))   # bin count only
        else:
            self.thresholds_.append(_thresholds(col, self.max_bin))

    def category_bins(self, feature_idx: int, codes) -> np.ndarray:
        """Bins of category codes of a categorical feature (NaN: the missing bin)."""
        kept = self.categories_[feature_idx]
        codes = np.asarray(codes, dtype=np.float64)
        miss = np.isnan(codes)
        c = np.where(miss, -1, codes).astype(np.int64)
        pos = np.searchsorted(kept, c)
        pos_c = np.minimum(pos, max(len(kept) - 1, 0))
        found = (pos < len(kept)) & (kept[pos_c] == c) if len(kept) else np.zeros(c.shape, dtype=bool)
        out = np.where(found, pos, len(kept))
        return np.where(miss, len(kept) + 1, out)

    def left_codes(self, feature_idx: int, left_bins, max_code: int) -> list[int]:
        """The category codes ``0..max_code-1`` whose bin is in ``left_bins`` (the pooled bin
        expands to every code that is not kept): what a categorical split record stores."""
        bins = self.category_bins(feature_idx, np.arange(max_code, dtype=np.float64))
        return np.flatnonzero(np.isin(bins, np.asarray(left_bins, dtype=np.int64))).tolist()

    @property
    def n_bins(self) -> np.ndarray:
        """Slots per feature: ordinary bins plus the missing bin."""
        return np.array([len(t) + 2 for t in self.thresholds_], dtype=np.int32)

    def missing_bin(self, feature_idx: int) -> int:
        """The bin of missing values of a feature: always its last slot."""
        return len(self.thresholds_[feature_idx]) + 1

    @property
    def bin_offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.n_bins)]).astype(np.int64)

    @property
    def bin_dtype(self) -> type:
        """The smallest unsigned type holding every bin: uint8 up to 256 slots per feature."""
        return bin_dtype(self.n_bins)

    def transform(self, X, rows=None, dtype=np.uint16) -> np.ndarray:
        """Bins of ``X`` (or of its rows ``rows``, a column at a time), as ``dtype`` (uint8 holds
        them when every feature has at most 256 slots, see :attr:`n_bins`)."""
        X = _as_features(X)
        if int(self.n_bins.max(initial=0)) > np.iinfo(dtype).max + 1:
            raise ValueError(f"{np.dtype(dtype).name} cannot hold {int(self.n_bins.max())} bins")
        out = np.empty((X.shape[0] if rows is None else len(rows), n_features(X)), dtype=dtype)
        for j in range(len(self.thresholds_)):
            out[:, j] = self._bins(j, feature_column(X, j, rows))
        return out

    def _bins(self, j: int, col: np.ndarray) -> np.ndarray:
        """Bins of the values ``col`` of feature ``j``."""
        if self.is_categorical(j):
            return self.category_bins(j, col)
        b = np.searchsorted(self.thresholds_[j], col, side="left")
        b[np.isnan(col)] = self.missing_bin(j)
        return b

    def threshold(self, feature_idx: int, bin_idx: int) -> float:
        """Raw-value threshold of the split "bin <= bin_idx" (+inf: all non-missing values left)."""
        if self.is_categorical(feature_idx):
            raise ValueError(f"feature {feature_idx} is categorical: it has no threshold")
        t = self.thresholds_[feature_idx]
        return float(t[bin_idx]) if bin_idx < len(t) else float("inf")


# --------------------------------------------------------------------------- bin edges across shards
#
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


# --------------------------------------------------------------------------- exact edges from approximate summaries
#
# When a merged summary is approximate, the edges can still be made exact in a few more rounds over
# the shards (a distributed selection): the edges need only the values at ~2 * (max_bin - 1) known
# ranks. For each such rank the driver brackets the value between two values of the summary; every
# shard answers, per bracket, how many of its values lie below it and a summary (at most
# ``bracket_points`` points) of those inside it; the merged answers either pin the rank's value
# (an exact inside summary) or give a bracket about ``bracket_points / 4`` times narrower for the
# next round. The result is Binner's edges, equal values, whatever the data and the shard layout.
# Each round's query and answers are small: per column at most 2 * (max_bin - 1) brackets, and
# per bracket one count and ``bracket_points`` points.

DEFAULT_BRACKET_POINTS = 32


class ExactEdges:
    """Driver side of the exact refinement: ``query()`` -> every shard ``answer_edge_query`` ->
    ``merge_edge_answers`` -> ``update()``, until ``done``; then ``binner()``.

    ``summaries``: the merged per-feature summaries of every shard (:func:`merge_shard_summaries`);
    columns whose summary is exact are final at once (no query)."""

    def __init__(self, summaries, max_bin: int = 32, bracket_points: int = DEFAULT_BRACKET_POINTS):
        self.max_bin = check_max_bin(max_bin)
        self.bracket_points = _check_bracket_points(bracket_points)
        self.summaries = list(summaries)
        self.rounds = 0
        self.thresholds: list[np.ndarray | None] = []
        self.known: dict[int, dict[int, float]] = {}                   # column -> rank -> value
        self.pending: dict[int, dict[int, tuple[float, float]]] = {}   # column -> rank -> bracket
        for j, s in enumerate(self.summaries):
            if s.exact or s.n == 0:
                self.thresholds.append(thresholds_from_summary(s, self.max_bin))
                continue
            self.thresholds.append(None)
            prev, nxt, _ = _midpoint_ranks(s.n, self.max_bin)
            self.known[j] = {}
            low, high = float(s.values[0]), float(s.values[-1])
            self.pending[j] = {int(r): (*_bracket(s.values, s.counts, int(r)), low, high)
                               for r in np.unique(np.concatenate([prev, nxt]))}

    @property
    def done(self) -> bool:
        return not any(self.pending.values())

    def query(self) -> dict[int, np.ndarray]:
        """``{column: brackets (m x 2: low and high value, both inclusive)}`` for the shards."""
        return {j: np.array(sorted({p[:2] for p in pend.values()}), dtype=np.float64).reshape(-1, 2)
                for j, pend in self.pending.items() if pend}

    def update(self, query: dict[int, np.ndarray], answers: dict) -> None:
        """Take the merged answers (:func:`merge_edge_answers`) to ``query``.

        Every answer resolves a rank or leaves it a bracket holding strictly fewer distinct values
        of the column (so the rounds end): ``[lo, hi]`` known to hold it is cut to the summary
        points around it; a miss (the value lies outside) cuts the known range ``[low, high]`` at
        the bracket's end."""
        self.rounds += 1
        for j, brackets in query.items():
            got = answers.get(j)
            if got is None or len(got) != len(brackets):
                raise InputError(f"the answers miss feature {j} or some of its brackets")
            index = {(lo, hi): a for (lo, hi), a in zip(brackets.tolist(), got)}
            s = self.summaries[j]
            for r, (lo, hi, low, high) in list(self.pending[j].items()):
                below, inside = index[(lo, hi)]
                k = r - int(below)
                if 0 <= k < inside.n:
                    if inside.exact:
                        self.known[j][r] = float(_at_ranks(inside.values, inside.counts, k))
                        del self.pending[j][r]
                    else:
                        self.pending[j][r] = (*_bracket(inside.values, inside.counts, k), lo, hi)
                elif k < 0:         # below the bracket (a sketch misjudged the rank): [low, lo)
                    self.pending[j][r] = (low, lo, low, lo)
                else:               # above it: (hi, high]
                    self.pending[j][r] = (hi, high, hi, high)
            if not self.pending[j]:
                prev, nxt, gamma = _midpoint_ranks(s.n, self.max_bin)
                at = self.known[j]
                cuts = np.unique(_midpoint_lerp(np.array([at[int(r)] for r in prev]),
                                                np.array([at[int(r)] for r in nxt]), gamma))
                self.thresholds[j] = cuts[cuts < s.values[-1]]

    def binner(self) -> Binner:
        if not self.done:
            raise InputError("the exact edges are not known yet: answer the pending queries first")
        binner = Binner(self.max_bin)
        binner.thresholds_ = [np.asarray(t, dtype=np.float64) for t in self.thresholds]
        return binner


def _check_bracket_points(bracket_points) -> int:
    if isinstance(bracket_points, bool) or not isinstance(bracket_points, (int, np.integer)) or bracket_points < 8:
        raise InputError(f"bracket_points must be an integer >= 8, got {bracket_points!r}")
    return int(bracket_points)


def _bracket(values, counts, k: int) -> tuple[float, float]:
    """Two points of an approximate multiset (sorted distinct ``values`` with ``counts`` standing
    for blocks of consecutive ranks) that should enclose its rank ``k``: the points either side of
    the block holding ``k``; never all the points (so a bracket holds fewer distinct values each
    round). Every point is a value of the column."""
    cum = np.cumsum(counts)
    m = len(values) - 1
    i = min(int(np.searchsorted(cum, k, side="right")), m)
    a, b = max(i - 1, 0), min(i + 1, m)
    if a == 0 and b == m:           # three points or fewer: one gap, on the side of k in its block
        upper = k >= cum[i] - counts[i] / 2
        a, b = (i, i + 1) if (upper and i < m) or i == 0 else (i - 1, i)
    return float(values[a]), float(values[b])


def answer_edge_query(X, query: dict[int, np.ndarray], bracket_points: int = DEFAULT_BRACKET_POINTS) -> dict:
    """A shard's answer: per column and bracket, ``(how many values lie below it, a summary of those
    in it)`` (runs where the shard lives)."""
    bracket_points = _check_bracket_points(bracket_points)
    X = np.asarray(X, dtype=np.float64)
    out = {}
    for j, brackets in query.items():
        col = X[:, int(j)]
        distinct, counts = _sorted_unique(np.sort(col[~np.isnan(col)]))
        below = np.concatenate([[0], np.cumsum(counts)])
        brackets = np.asarray(brackets, dtype=np.float64).reshape(-1, 2)
        starts = np.searchsorted(distinct, brackets[:, 0], side="left")
        ends = np.searchsorted(distinct, brackets[:, 1], side="right")
        answers = []
        for a, b in zip(starts.tolist(), ends.tolist()):
            values, weights = distinct[a:b], counts[a:b]
            exact = len(values) <= bracket_points
            if not exact:
                values, weights = _compress(values, weights, bracket_points)
            answers.append((int(below[a]), ColumnSummary._trusted(values, weights, exact)))
        out[int(j)] = answers
    return out


def merge_edge_answers(answers, bracket_points: int = DEFAULT_BRACKET_POINTS) -> dict:
    """Several shards' answers to one query as one (counts added, summaries merged); associative."""
    bracket_points = _check_bracket_points(bracket_points)
    answers = list(answers)
    if not answers:
        raise InputError("no answers to merge")
    out = {}
    for j in answers[0]:
        per = [a[j] for a in answers]
        if any(len(p) != len(per[0]) for p in per):
            raise InputError(f"the answers for feature {j} disagree on the number of brackets")
        out[j] = [(sum(p[i][0] for p in per), _merge_points([p[i][1] for p in per], bracket_points))
                  for i in range(len(per[0]))]
    return out


def _merge_points(summaries, max_points: int) -> ColumnSummary:
    values = np.concatenate([s.values for s in summaries])
    counts = np.concatenate([s.counts for s in summaries])
    distinct, inverse = np.unique(values, return_inverse=True)
    counts = np.bincount(inverse, weights=counts, minlength=len(distinct)).astype(np.int64)
    exact = all(s.exact for s in summaries) and len(distinct) <= max_points
    if len(distinct) > max_points:
        distinct, counts = _compress(distinct, counts, max_points)
    return ColumnSummary._trusted(distinct, counts, exact)


def fit_sharded_binner(shards, max_bin: int = 32, map_shards=None, max_points: int = DEFAULT_SUMMARY_POINTS,
                       bracket_points: int = DEFAULT_BRACKET_POINTS, exact: bool = True) -> Binner:
    """Binner's thresholds for rows cut into ``shards`` (feature matrices), computed shard by shard.

    ``map_shards(fn, *args)`` runs ``fn(shard, *args)`` on every shard and returns the results in
    shard order (default: a loop here; an executor runs it where the shards live, ``shards`` then
    being whatever handles it needs). With ``exact`` (the default) approximate summaries are refined
    until the edges are Binner's; without it the approximate edges are kept (one round)."""
    shards = list(shards)
    if map_shards is None:
        def map_shards(fn, *args):
            return [fn(s, *args) for s in shards]
    merged = merge_shard_summaries(map_shards(summarize_shard, max_points), max_points)
    if not exact:
        return binner_from_summaries(merged, max_bin)
    plan = ExactEdges(merged, max_bin, bracket_points)
    while not plan.done:
        query = plan.query()
        plan.update(query, merge_edge_answers(map_shards(answer_edge_query, query, bracket_points), bracket_points))
    return plan.binner()
