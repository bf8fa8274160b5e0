"""DP bin edges (:mod:`vfl.core.dp_model`): private bounds and quantile edges on a symmetric log
scale, and :class:`DPBinner`, a party's bins from DP histograms and public bins.
"""
from __future__ import annotations

import math

import numpy as np

from datasets.errors import InputError
from vfl.core.binning import Binner, _thresholds
from vfl.core.dp_bins_file import _symexp, _symlog, public_thresholds
from vfl.core.dp_noise import NoiseSource, SecureNoise

_SYMLOG_RANGE = 30.0          # grid of the DP bounds: sign(x) log1p(|x|) in [-30, 30] (|x| < 1e13)
_COARSE_CELLS = 120           # cells of width 0.5 on that scale


# --------------------------------------------------------------------------- DP bin edges
def dp_bounds(z: np.ndarray, epsilon: float, noise: NoiseSource, sensitivity: float = 1.0) -> tuple[float, float]:
    """``epsilon``-DP bounds of ``z`` (symmetric-log values): a Laplace histogram over fixed cells of
    [-R, R] (a row changes one count by one under add/remove: ``sensitivity`` 1; a changed row moves
    between two cells: 2), then, as post-processing, the span of the cells whose noisy count passes
    ``tau = sensitivity ln(cells / 0.01) / epsilon`` (so an empty cell passes with probability about
    1/200 over all cells); none passes: the noisiest-max cell. Discrete Laplace counts."""
    cells = _COARSE_CELLS
    width = 2 * _SYMLOG_RANGE / cells
    counts = np.bincount(np.clip(((z + _SYMLOG_RANGE) / width).astype(np.int64), 0, cells - 1),
                         minlength=cells)
    scale = sensitivity / epsilon
    noisy = noise.laplace_counts(counts, scale).astype(np.float64)
    keep = np.flatnonzero(noisy > sensitivity * math.log(cells / 0.01) / epsilon)
    if keep.size == 0:
        keep = np.array([int(np.argmax(noisy))])
    return -_SYMLOG_RANGE + keep[0] * width, -_SYMLOG_RANGE + (keep[-1] + 1) * width


def dp_thresholds(col: np.ndarray, max_bin: int, epsilon: float, noise: NoiseSource) -> np.ndarray:
    """DP bin edges of one feature: ``max_bin - 1`` edges equally spaced on the symmetric log scale
    ``sign(x) log(1 + |x|)`` between ``epsilon``-DP bounds (:func:`dp_bounds`); values outside fall
    in the first or last bin. NaN (missing) rows take no part."""
    z = _symlog(col[~np.isnan(col)])
    lo, hi = dp_bounds(z, epsilon, noise)
    inner = np.linspace(lo, hi, max_bin + 1)[1:-1]
    return np.unique(_symexp(inner))


class DPBinner(Binner):
    """A party's bins from DP histograms: ``epsilon`` for all its features together (split evenly
    over the features that need DP edges); ``public``: ``{feature index: entry}`` of user-given
    public bounds or edges (:func:`check_dp_bins`), which spend no budget; ``inf``: the exact
    quantile bins of :class:`vfl.core.binning.Binner` (public bins ignored: the non-private training)."""

    def __init__(self, max_bin: int = 32, epsilon: float = math.inf, noise: NoiseSource | None = None,
                 public: dict | None = None,
                 party: str = ""):
        super().__init__(max_bin)
        if not (isinstance(epsilon, (int, float)) and epsilon > 0) or math.isnan(epsilon):
            raise InputError(f"DP binning needs an epsilon > 0, got {epsilon!r}")
        self.epsilon = float(epsilon)
        # bounds or edges (an entry with only mode dp's "missing" flag is not a public bin)
        self.public = {j: e for j, e in (public or {}).items() if "edges" in e or "lo" in e}
        self.party = party
        self.noise = SecureNoise() if noise is None else noise
        self.spent = 0.0

    def fit(self, X) -> "DPBinner":
        X = np.asarray(X, dtype=np.float64)
        n_features = X.shape[1]
        if math.isinf(self.epsilon):
            self.thresholds_ = [_thresholds(X[:, j], self.max_bin) for j in range(n_features)]
            return self
        bad = [j for j in self.public if not (isinstance(j, (int, np.integer)) and 0 <= j < n_features)]
        if bad:
            raise InputError(f"public bins of party {self.party!r}: no feature {bad[0]!r}")
        n_dp = n_features - len(self.public)
        per = self.epsilon / max(n_dp, 1)
        self.thresholds_ = [public_thresholds(self.public[j], self.max_bin, f"public bins of party "
                                              f"{self.party!r}, feature {j}")
                            if j in self.public else dp_thresholds(X[:, j], self.max_bin, per, self.noise)
                            for j in range(n_features)]
        self.spent = self.epsilon if n_dp > 0 else 0.0
        return self

    def report(self) -> dict:
        """What the binning spent: ``{"epsilon", "dp_features", "public_features"}``."""
        n = len(self.thresholds_ or [])
        return {"epsilon": self.spent, "dp_features": n - len(self.public), "public_features": len(self.public)}
