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
