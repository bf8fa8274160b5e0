"""Split finding over one party's histograms with XGBoost's second-order gain.

For a node with gradient sum ``G`` and hessian sum ``H``::

    gain = GL^2/(HL+lambda) + GR^2/(HR+lambda) - G^2/(H+lambda)

(XGBoost's ``loss_chg``, compared with ``gamma``). A candidate is valid when
both children have hessian sum >= ``min_child_weight``. For every ordinary bin
``bin_idx`` both directions for missing values are tried: missing right
(``default_left=False``) and missing left. Candidates are ranked by gain, ties
broken by (feature_idx, bin_idx, missing-right first), so identical
histograms always give the identical split.

Categorical features (LightGBM's method): the non-empty bins of a node -- categories, the
pooled "other" bin and the missing bin alike -- are ordered by ``G / (H + cat_smooth)`` and
the best prefix of that order, from either end, goes left; at most ``max_cat_threshold``
bins go left, and a prefix is evaluated only once every group of bins added since the last
evaluated one holds ``min_data_per_group`` samples (estimated from the hessians, as LightGBM
does) and the right side holds that many too. The split is the set of bins that go left
(``SplitInfo.categories``); the missing bin's side is ``default_left``.

Monotone constraints (XGBoost's method): every node carries bounds ``[lower, upper]`` on its
weight; child weights are clipped to them, a split on a feature constrained increasing
(``+1``) with left weight above right weight (or the reverse for ``-1``) is rejected, and
with any constraint in the model the gain is computed from the clipped weights
(``-(2 G w + (H + lambda) w^2)`` per side). The children's bounds are set by the grower
(:mod:`vfl.core.grower`) at the midpoint of the two weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MIN_GAIN = 1e-6   # XGBoost's kRtEps: smaller improvements are noise


def goes_left(values: np.ndarray, threshold, default_left: bool, missing: np.ndarray | None = None,
              categories=None) -> np.ndarray:
    """The split rule, the one place it is written: a value goes left when ``value <= threshold``
    (numeric split) or when it is one of ``categories`` (categorical split: ``categories`` the
    category codes, or on bins the bin indices, that go left; ``threshold`` is then ignored);
    a missing value goes to the learned side ``default_left``. A category code that is not in
    ``categories`` -- including -1, a category never seen in training -- goes right.

    Used on raw values (``missing`` defaults to NaN) by prediction and by the passive party's
    routing, and on bin indices (``threshold`` a bin index, ``missing`` the rows in the missing
    bin, see :meth:`vfl.core.binning.Binner.missing_bin`) by training. ``threshold`` and
    ``default_left`` may be arrays (broadcast against ``values``), as for a passive party's records."""
    values = np.asarray(values)
    if missing is None:
        missing = np.isnan(values)
    if categories is not None:
        with np.errstate(invalid="ignore"):
            left = np.isin(values, np.asarray(list(categories), dtype=np.float64))
        return np.where(missing, np.asarray(default_left, dtype=bool), left)
    return np.where(missing, np.asarray(default_left, dtype=bool), values <= threshold)


@dataclass(frozen=True)
class CategoricalParams:
    """LightGBM-style regularisation of categorical splits (names as in LightGBM)."""
    cat_smooth: float = 10.0
    min_data_per_group: int = 100
    max_cat_threshold: int = 32


@dataclass(frozen=True)
class Constraints:
    """A node's weight bounds and whether the model has any monotone constraint at all."""
    lower: float = -np.inf
    upper: float = np.inf
    active: bool = False        # any constraint in the model: gains from clipped weights


@dataclass
class SplitInfo:
    gain: float
    source_idx: int
    feature_idx: int
    bin_idx: int
    default_left: bool
    sum_gradients_left: float
    sum_hessians_left: float
    categories: tuple | None = None     # categorical split: the bins that go left (missing: default_left)
    # derived from the above (not part of the split's identity): the feature's constraint and the
    # children's (clipped) weights, for the bounds of monotone constraints
    monotone: int = field(default=0, compare=False)
    weight_left: float = field(default=0.0, compare=False)
    weight_right: float = field(default=0.0, compare=False)
    # a passive party's shuffled candidates (:func:`find_best_candidate`): the opaque positions of every
    # candidate with the best gain (the owner picks its canonical one), None otherwise
    positions: tuple | None = field(default=None, compare=False)
    # the categorical split above ties with ``positions``: the owner picks
    tie_with_categorical: bool = field(default=False, compare=False)


def _weight(g, h, reg_lambda, c: Constraints):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.clip(-g / (h + reg_lambda), c.lower, c.upper)


def _gain_given_weight(g, h, reg_lambda, w):
    return -(2.0 * g * w + (h + reg_lambda) * w * w)


def _constrained_gains(GL, HL, G, H, reg_lambda, c: Constraints, monotone):
    """Gains from the clipped weights; splits against a feature's direction get -inf.
    ``monotone`` broadcasts against GL (per feature)."""
    GR, HR = G - GL, H - HL
    wl, wr = _weight(GL, HL, reg_lambda, c), _weight(GR, HR, reg_lambda, c)
    wp = _weight(np.float64(G), np.float64(H), reg_lambda, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = (_gain_given_weight(GL, HL, reg_lambda, wl) + _gain_given_weight(GR, HR, reg_lambda, wr)
                - _gain_given_weight(G, H, reg_lambda, wp))
    bad = ((monotone > 0) & (wl > wr)) | ((monotone < 0) & (wl < wr))
    return np.where(bad, -np.inf, gain), wl, wr


def _score(g, h, reg_lambda):
    return g * g / (h + reg_lambda)


def find_best_split(sum_gradients: np.ndarray, sum_hessians: np.ndarray, bin_offsets: np.ndarray,
                    G: float, H: float, reg_lambda: float, min_child_weight: float,
                    source_idx: int = 0, categorical: np.ndarray | None = None,
                    monotone: np.ndarray | None = None, constraints: Constraints | None = None,
                    n_samples: int | None = None,
                    cat_params: CategoricalParams | None = None, counts: np.ndarray | None = None,
                    min_rows: int = 1) -> SplitInfo | None:
    """Best split of one node over one party's flat histogram (None if no valid candidate).

    ``categorical``: bool per feature (those are searched as category partitions);
    ``monotone``: -1/0/+1 per feature; ``constraints``: the node's weight bounds;
    ``n_samples``: the node's rows (to estimate bin counts for ``min_data_per_group``);
    ``counts``: the node's rows per bin (flat, like the sums): with them a candidate is valid only
    when both children hold at least ``min_rows`` rows (what a passive party enforces on every
    split it answers, :mod:`parties.passive_checks`)."""
    c = constraints or Constraints()
    numeric = _numeric_split(sum_gradients, sum_hessians, bin_offsets, G, H, reg_lambda, min_child_weight,
                             source_idx, categorical, monotone, c, counts, min_rows)
    if categorical is None or not np.any(categorical):
        return numeric
    best = numeric
    offsets = np.asarray(bin_offsets, dtype=np.int64)
    sg, sh = np.asarray(sum_gradients, dtype=np.float64), np.asarray(sum_hessians, dtype=np.float64)
    for f in np.flatnonzero(categorical).tolist():
        a, b = int(offsets[f]), int(offsets[f + 1])
        info = _categorical_split(sg[a:b], sh[a:b], G, H, reg_lambda, min_child_weight, c,
                                  n_samples, cat_params or CategoricalParams(),
                                  None if counts is None else np.asarray(counts)[a:b], min_rows)
        if info is None:
            continue
        gain, left, wl, wr, GL, HL = info
        missing = b - a - 1
        cand = SplitInfo(gain, source_idx, f, -1, missing in left, GL, HL,
                         tuple(sorted(x for x in left if x != missing)), 0, wl, wr)
        if best is None or cand.gain > best.gain or (cand.gain == best.gain and f < best.feature_idx):
            best = cand
    return best


def _categorical_split(g: np.ndarray, h: np.ndarray, G, H, reg_lambda, min_child_weight, c: Constraints,
                       n_samples, p: CategoricalParams, counts: np.ndarray | None = None, min_rows: int = 1):
    """``(gain, left bins, w_left, w_right, G_left, H_left)`` of the best category partition of one
    feature's bins (the missing bin included, as the last one), or None."""
    cnt_factor = (n_samples / H) if n_samples and H > 0 else 1.0
    used = np.flatnonzero(((h > 0) | (g != 0)) & (np.rint(h * cnt_factor) >= p.cat_smooth))
    if used.size < 2:
        return None
    ctr = g[used] / (h[used] + p.cat_smooth)
    order = used[np.argsort(ctr, kind="stable")]
    max_num_cat = min(p.max_cat_threshold, (used.size + 1) // 2)
    parent = _score(G, H, reg_lambda)
    best = None
    n_rows = None if counts is None else int(np.sum(counts))
    for direction in (order, order[::-1]):
        GL = HL = 0.0
        group = 0.0
        left_cnt = 0.0
        left_rows = 0
        for i in range(min(used.size - 1, max_num_cat)):
            bin_ = direction[i]
            GL += g[bin_]
            HL += h[bin_]
            left_rows += 0 if counts is None else int(counts[bin_])
            cnt = h[bin_] * cnt_factor
            left_cnt += cnt
            group += cnt
            if HL < min_child_weight:
                continue
            GR, HR = G - GL, H - HL
            right_cnt = H * cnt_factor - left_cnt
            if HR < min_child_weight or right_cnt < p.min_data_per_group:
                break
            if group < p.min_data_per_group:
                continue
            group = 0.0
            if c.active:
                gain, wl, wr = _constrained_gains(np.float64(GL), np.float64(HL), G, H, reg_lambda, c, 0)
                gain, wl, wr = float(gain), float(wl), float(wr)
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    gain = float(_score(GL, HL, reg_lambda) + _score(GR, HR, reg_lambda) - parent)
                wl, wr = float(_weight(GL, HL, reg_lambda, c)), float(_weight(GR, HR, reg_lambda, c))
            if n_rows is not None and min(left_rows, n_rows - left_rows) < min_rows:
                continue
            if np.isfinite(gain) and gain > MIN_GAIN and (best is None or gain > best[0]):
                best = (gain, set(direction[:i + 1].tolist()), wl, wr, GL, HL)
    return best


def best_cell(scores: np.ndarray, gl, hl, gm, hm) -> tuple[float, int, int, bool, float, float] | None:
    """The best cell of ``scores[feature, bin, d]`` (``d = 1``: missing values go left) if it beats
    :data:`MIN_GAIN`: ``(score, feature, bin, missing_left, GL, HL)`` with the left child's sums
    (``gl``/``hl``: running sums over the ordinary bins; ``gm``/``hm``: the missing bin's)."""
    flat = scores.ravel()
    best = int(np.argmax(flat))
    score = float(flat[best])
    if not score > MIN_GAIN:
        return None
    f, rest = divmod(best, scores.shape[1] * 2)
    b, d = divmod(rest, 2)
    return (score, int(f), int(b), bool(d), float(gl[f, b] + (gm[f, 0] if d else 0.0)),
            float(hl[f, b] + (hm[f, 0] if d else 0.0)))


def _numeric_split(sum_gradients, sum_hessians, bin_offsets, G, H, reg_lambda, min_child_weight,
                   source_idx, categorical, monotone, c: Constraints, counts=None,
                   min_rows: int = 1) -> SplitInfo | None:
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
    rows_ok = (True, True)
    if counts is not None:      # both children hold at least min_rows rows
        mc = np.zeros((n_features, width), dtype=np.int64)
        mc[present] = np.asarray(counts, dtype=np.int64)
        cl, cm = np.cumsum(mc, axis=1), mc[rows, nb - 1][:, None]
        n_node = cl[:, -1:]
        rows_ok = tuple(np.minimum(left, n_node - left) >= max(1, min_rows) for left in (cl, cl + cm))
    j = np.arange(width)[None, :]
    parent = _score(G, H, reg_lambda)
    gains = np.full((n_features, width, 2), -np.inf)
    skip = np.zeros((n_features, 1), dtype=bool) if categorical is None else \
        np.asarray(categorical, dtype=bool)[:, None]
    mono = np.zeros((n_features, 1)) if monotone is None else np.asarray(monotone, dtype=np.float64)[:, None]
    for d, (GL, HL, ok) in enumerate(((gl, hl, j < nb[:, None] - 1),
                                      (gl + gm, hl + hm, j < nb[:, None] - 2))):
        GR, HR = G - GL, H - HL
        valid = ok & ~skip & (HL >= min_child_weight) & (HR >= min_child_weight) & rows_ok[d]
        if c.active:
            gain = _constrained_gains(GL, HL, G, H, reg_lambda, c, mono)[0]
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                gain = _score(GL, HL, reg_lambda) + _score(GR, HR, reg_lambda) - parent
        gains[:, :, d] = np.where(valid & np.isfinite(gain), gain, -np.inf)   # 0/0 when lambda = 0
    cell = best_cell(gains, gl, hl, gm, hm)
    if cell is None:
        return None
    best_gain, f, b, d, GL, HL = cell
    wl, wr = float(_weight(GL, HL, reg_lambda, c)), float(_weight(G - GL, H - HL, reg_lambda, c))
    return SplitInfo(best_gain, source_idx, f, b, d, GL, HL, None, int(mono[f, 0]), wl, wr)


def candidate_gains(GL: np.ndarray, HL: np.ndarray, G: float, H: float, reg_lambda: float, min_child_weight: float,
                    monotone: np.ndarray | None, c: Constraints) -> np.ndarray:
    """The gain of every candidate whose left child sums are ``GL``/``HL`` (one value per candidate,
    the same formula, element by element, as :func:`_numeric_split`); -inf where invalid."""
    GL, HL = np.asarray(GL, dtype=np.float64), np.asarray(HL, dtype=np.float64)
    GR, HR = G - GL, H - HL
    valid = (HL >= min_child_weight) & (HR >= min_child_weight)
    if c.active:
        mono = np.zeros(len(GL)) if monotone is None else np.asarray(monotone, dtype=np.float64)
        gain = _constrained_gains(GL, HL, G, H, reg_lambda, c, mono)[0]
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = _score(GL, HL, reg_lambda) + _score(GR, HR, reg_lambda) - _score(G, H, reg_lambda)
    return np.where(valid & np.isfinite(gain), gain, -np.inf)


def find_best_candidate(GL: np.ndarray, HL: np.ndarray, G: float, H: float, reg_lambda: float,
                        min_child_weight: float, source_idx: int, monotone: np.ndarray | None = None,
                        constraints: Constraints | None = None) -> SplitInfo | None:
    """Best of a passive party's shuffled candidates (their left child sums ``GL``/``HL``, in the
    party's random order): a :class:`SplitInfo` naming *every* position with the best gain
    (``positions``), so that the owner, which alone knows what each position is, breaks the tie
    canonically (lowest feature, bin, missing-right first: the order :func:`_numeric_split` uses)
    and the shuffle never changes the model. None if no candidate beats :data:`MIN_GAIN`."""
    c = constraints or Constraints()
    if len(GL) == 0:
        return None
    gains = candidate_gains(GL, HL, G, H, reg_lambda, min_child_weight, monotone, c)
    best = float(np.max(gains))
    if not best > MIN_GAIN:
        return None
    tied = np.flatnonzero(gains == best)
    p = int(tied[0])
    gl, hl = float(GL[p]), float(HL[p])
    mono = 0 if monotone is None else int(monotone[p])
    wl, wr = float(_weight(gl, hl, reg_lambda, c)), float(_weight(G - gl, H - hl, reg_lambda, c))
    return SplitInfo(best, source_idx, -1, -1, False, gl, hl, None, mono, wl, wr,
                     positions=tuple(int(x) for x in tied))


def best_categorical(sum_gradients: np.ndarray, sum_hessians: np.ndarray, bin_offsets: np.ndarray,
                     categorical_features, G: float, H: float, reg_lambda: float, min_child_weight: float,
                     source_idx: int, constraints: Constraints | None, n_samples: int | None,
                     cat_params: CategoricalParams | None) -> SplitInfo | None:
    """The best categorical split over the per-category sums of ``categorical_features`` (flat, those
    features' bins one after another, ``bin_offsets`` over them): ties go to the lowest feature."""
    c = constraints or Constraints()
    best = None
    offsets = np.asarray(bin_offsets, dtype=np.int64)
    sg, sh = np.asarray(sum_gradients, dtype=np.float64), np.asarray(sum_hessians, dtype=np.float64)
    for i, f in enumerate(categorical_features):
        a, b = int(offsets[i]), int(offsets[i + 1])
        info = _categorical_split(sg[a:b], sh[a:b], G, H, reg_lambda, min_child_weight, c, n_samples,
                                  cat_params or CategoricalParams())
        if info is None:
            continue
        gain, left, wl, wr, GL, HL = info
        missing = b - a - 1
        cand = SplitInfo(gain, source_idx, int(f), -1, missing in left, GL, HL,
                         tuple(sorted(x for x in left if x != missing)), 0, wl, wr)
        if best is None or cand.gain > best.gain:
            best = cand
    return best
