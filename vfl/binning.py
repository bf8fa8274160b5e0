"""Quantile binning of one party's features, done locally; thresholds never leave it.

Feature ``feature_idx`` gets ``len(thresholds) + 1`` ordinary bins and one
extra bin for missing values (NaN), always the last. A value ``x`` falls in
bin ``#{t in thresholds : t < x}``, so "bin <= bin_idx" is exactly
"x <= thresholds[bin_idx]".
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


class Binner:
    """Fits per-feature thresholds and maps values to ``bin_idx``."""

    def __init__(self, max_bin: int = 32):
        self.max_bin = check_max_bin(max_bin)
        self.thresholds_: list[np.ndarray] | None = None

    def fit(self, X) -> "Binner":
        X = np.asarray(X, dtype=np.float64)
        self.thresholds_ = [_thresholds(X[:, j], self.max_bin) for j in range(X.shape[1])]
        return self

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
            b = np.searchsorted(t, col, side="left")
            b[np.isnan(col)] = self.missing_bin(j)
            out[:, j] = b
        return out

    def threshold(self, feature_idx: int, bin_idx: int) -> float:
        """Raw-value threshold of the split "bin <= bin_idx" (+inf: all non-missing values left)."""
        t = self.thresholds_[feature_idx]
        return float(t[bin_idx]) if bin_idx < len(t) else float("inf")
