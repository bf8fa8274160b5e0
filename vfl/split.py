"""Split finding over one party's histograms with XGBoost's second-order gain.

For a node with gradient sum ``G`` and hessian sum ``H``::

    gain = GL^2/(HL+lambda) + GR^2/(HR+lambda) - G^2/(H+lambda)

(XGBoost's ``loss_chg``, compared with ``gamma``). A candidate is valid when
both children have hessian sum >= ``min_child_weight``. For every ordinary bin
``bin_idx`` both directions for missing values are tried: missing right
(``default_left=False``) and missing left. Candidates are ranked by gain, ties
broken by (feature_idx, bin_idx, missing-right first), so identical
histograms always give the identical split.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_GAIN = 1e-6   # XGBoost's kRtEps: smaller improvements are noise


def goes_left(values: np.ndarray, threshold, default_left: bool, missing: np.ndarray | None = None) -> np.ndarray:
    """The split rule, the one place it is written: a value goes left when ``value <= threshold``;
    a missing value goes to the learned side ``default_left``.

    Used on raw values (``missing`` defaults to NaN) by prediction and by the passive party's
    routing, and on bin indices (``threshold`` a bin index, ``missing`` the rows in the missing
    bin, see :meth:`vfl.binning.Binner.missing_bin`) by training. ``threshold`` and
    ``default_left`` may be arrays (broadcast against ``values``), as for a passive party's records."""
    values = np.asarray(values)
    if missing is None:
        missing = np.isnan(values)
    return np.where(missing, np.asarray(default_left, dtype=bool), values <= threshold)


@dataclass
class SplitInfo:
    gain: float
    source_idx: int
    feature_idx: int
    bin_idx: int
    default_left: bool
    sum_gradients_left: float
    sum_hessians_left: float


def _score(g, h, reg_lambda):
    return g * g / (h + reg_lambda)


def find_best_split(sum_gradients: np.ndarray, sum_hessians: np.ndarray, bin_offsets: np.ndarray,
                    G: float, H: float, reg_lambda: float, min_child_weight: float,
                    source_idx: int = 0) -> SplitInfo | None:
    """Best split of one node over one party's flat histogram (None if no valid candidate)."""
    offsets = np.asarray(bin_offsets, dtype=np.int64)
    n_flat = int(offsets[-1])
    if n_flat == 0:
        return None
    nb = np.diff(offsets)
    n_features, width = len(nb), int(nb.max())
    present = np.arange(width)[None, :] < nb[:, None]
    mg = np.zeros((n_features, width))
    mh = np.zeros((n_features, width))
    mg[present] = np.asarray(sum_gradients, dtype=np.float64)
    mh[present] = np.asarray(sum_hessians, dtype=np.float64)
    rows = np.arange(n_features)
    gm, hm = mg[rows, nb - 1][:, None], mh[rows, nb - 1][:, None]
    # per-feature running sums over ordinary bins (the missing bin is last);
    # values are fixed-point multiples, so these sums are exact
    gl, hl = np.cumsum(mg, axis=1), np.cumsum(mh, axis=1)
    j = np.arange(width)[None, :]
    parent = _score(G, H, reg_lambda)
    gains = np.full((n_features, width, 2), -np.inf)
    for d, (GL, HL, ok) in enumerate(((gl, hl, j < nb[:, None] - 1),
                                      (gl + gm, hl + hm, j < nb[:, None] - 2))):
        GR, HR = G - GL, H - HL
        valid = ok & (HL >= min_child_weight) & (HR >= min_child_weight)
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = _score(GL, HL, reg_lambda) + _score(GR, HR, reg_lambda) - parent
        gains[:, :, d] = np.where(valid & np.isfinite(gain), gain, -np.inf)   # 0/0 when lambda = 0
    flat = gains.ravel()
    best = int(np.argmax(flat))
    best_gain = float(flat[best])
    if not best_gain > MIN_GAIN:
        return None
    f, rest = divmod(best, width * 2)
    b, d = divmod(rest, 2)
    GL = float(gl[f, b] + (gm[f, 0] if d else 0.0))
    HL = float(hl[f, b] + (hm[f, 0] if d else 0.0))
    return SplitInfo(best_gain, source_idx, int(f), int(b), bool(d), GL, HL)
