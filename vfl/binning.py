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


def _thresholds(col: np.ndarray, max_bin: int) -> np.ndarray:
    values = col[~np.isnan(col)]
    if values.size == 0:
        return np.empty(0)
    distinct = np.unique(values)
    if distinct.size <= max_bin:
        return (distinct[:-1] + distinct[1:]) / 2.0
    qs = np.linspace(0, 100, max_bin + 1)[1:-1]
    cuts = np.unique(np.percentile(values, qs, method="midpoint"))
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

    def fit(self, X) -> "Binner":
        X = np.asarray(X, dtype=np.float64)
        if self.categorical is not None and self.categorical.shape != (X.shape[1],):
            raise ValueError(f"categorical mask of {self.categorical.shape} for {X.shape[1]} features")
        self.thresholds_, self.categories_ = [], {}
        for j in range(X.shape[1]):
            if self.is_categorical(j):
                kept = _kept_codes(X[:, j], self.max_cat)
                self.categories_[j] = kept
                self.thresholds_.append(np.arange(len(kept), dtype=np.float64))   # bin count only
            else:
                self.thresholds_.append(_thresholds(X[:, j], self.max_bin))
        return self

    def other_bin(self, feature_idx: int) -> int:
        """The pooled bin of a categorical feature (rare and unseen categories)."""
        return len(self.categories_[feature_idx])

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

    def transform(self, X) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        out = np.empty(X.shape, dtype=np.uint16)
        for j, t in enumerate(self.thresholds_):
            col = X[:, j]
            if self.is_categorical(j):
                out[:, j] = self.category_bins(j, col)
                continue
            b = np.searchsorted(t, col, side="left")
            b[np.isnan(col)] = self.missing_bin(j)
            out[:, j] = b
        return out

    def threshold(self, feature_idx: int, bin_idx: int) -> float:
        """Raw-value threshold of the split "bin <= bin_idx" (+inf: all non-missing values left)."""
        if self.is_categorical(feature_idx):
            raise ValueError(f"feature {feature_idx} is categorical: it has no threshold")
        t = self.thresholds_[feature_idx]
        return float(t[bin_idx]) if bin_idx < len(t) else float("inf")
