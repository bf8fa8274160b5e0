"""Evaluation metrics (XGBoost's names) for training history and early stopping.

Every metric takes the encoded labels (``0/1``, ``0..K-1`` or real values)
and the model's transformed output (probability of class 1, class
probabilities ``(n, K)``, or predictions). ``HIGHER_IS_BETTER`` lists the
metrics to maximise; the others are minimised.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

_EPS = 1e-15
#: rows per step of the exact sums and of the per-row terms: a metric's temporaries stay a few
#: MB whatever the number of rows (a driver evaluates the training rows every round)
_CHUNK = 1 << 16


def _fsum(x) -> float:
    """Exactly rounded sum of ``x``: independent of the row order (which follows the salted id
    hashes). ``math.fsum`` reads the values a chunk at a time (one Python float per value of a
    chunk, never of the whole vector)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    return math.fsum(itertools.chain.from_iterable(x[s:s + _CHUNK].tolist() for s in range(0, x.size, _CHUNK)))


def _terms_fsum(term, *arrays) -> float:
    """Exactly rounded sum of the per-row values ``term(*chunks)``, computed a chunk of rows at a
    time (the terms of the whole vector never exist at once)."""
    n = len(arrays[0])
    parts = (np.asarray(term(*(a[s:s + _CHUNK] for a in arrays)), dtype=np.float64).ravel().tolist()
             for s in range(0, n, _CHUNK))
    return math.fsum(itertools.chain.from_iterable(parts))


def _mean(x) -> float:
    """Exactly rounded mean (see :func:`_fsum`)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    return _fsum(x) / x.size if x.size else float("nan")


def _terms_mean(term, *arrays) -> float:
    """Exactly rounded mean of ``term``'s per-row values (see :func:`_terms_fsum`)."""
    n = len(arrays[0])
    return _terms_fsum(term, *arrays) / n if n else float("nan")


HIGHER_IS_BETTER = {"auc"}


def _logloss_terms(y, p):
    p = np.clip(p, _EPS, 1 - _EPS)
    return y * np.log(p) + (1 - y) * np.log(1 - p)


def logloss(y, p) -> float:
    return -_terms_mean(_logloss_terms, np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64))


def auc(y, p) -> float:
    """Area under the ROC curve as the Mann-Whitney statistic (tied scores share their mean rank).

    Computed here rather than with scikit-learn so that the boosting loop never
    pays sklearn's import time; tests check it against ``roc_auc_score``.
    """
    y = np.asarray(y, dtype=np.float64).ravel() > 0.5
    p = np.asarray(p, dtype=np.float64).ravel()
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(p, kind="mergesort")
    sorted_p, sorted_y = p[order], y[order]
    order = None

    def positive_ranks(v, pos):
        """1-based ranks of the positives among the sorted scores ``v``, ties replaced by the mean
        rank of their group (a multiple of 1/2: every sum here is exact)."""
        v = v[pos]
        return (np.searchsorted(sorted_p, v, "left") + np.searchsorted(sorted_p, v, "right") + 1) / 2.0
    u = _terms_fsum(positive_ranks, sorted_p, sorted_y) - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def error(y, p) -> float:
    return _terms_mean(lambda yc, pc: (pc > 0.5) != (yc > 0.5), np.asarray(y), np.asarray(p))


def mlogloss(y, proba) -> float:
    def terms(yc, pc):
        return np.log(np.clip(pc[np.arange(len(yc)), yc], _EPS, 1.0))
    return -_terms_mean(terms, np.asarray(y, dtype=np.int64), np.asarray(proba, dtype=np.float64))


def merror(y, proba) -> float:
    return _terms_mean(lambda yc, pc: np.argmax(pc, axis=1) != yc, np.asarray(y, dtype=np.int64), np.asarray(proba))


def _float_pair(y, pred):
    return np.asarray(y, dtype=np.float64).ravel(), np.asarray(pred, dtype=np.float64).ravel()


def rmse(y, pred) -> float:
    return math.sqrt(_terms_mean(lambda yc, pc: (pc - yc) * (pc - yc), *_float_pair(y, pred)))


def mae(y, pred) -> float:
    return _terms_mean(lambda yc, pc: np.abs(pc - yc), *_float_pair(y, pred))


def mphe(y, pred, huber_slope: float = 1.0) -> float:
    """Mean pseudo-Huber error (XGBoost's ``mphe``)."""
    def terms(yc, pc):
        r = (pc - yc) / huber_slope
        return huber_slope ** 2 * (np.sqrt(1 + r * r) - 1)
    return _terms_mean(terms, *_float_pair(y, pred))


METRICS = {"logloss": logloss, "auc": auc, "error": error, "mlogloss": mlogloss, "merror": merror,
           "rmse": rmse, "mae": mae, "mphe": mphe}


def evaluate(names, y, output, huber_slope: float = 1.0) -> dict[str, float]:
    """``{name: value}`` for each metric name."""
    out = {}
    for name in names:
        if name == "mphe":
            out[name] = mphe(y, output, huber_slope)
        else:
            out[name] = METRICS[name](y, output)
    return out


def is_better(metric: str, new: float, best: float | None) -> bool:
    """Strict improvement (ties keep the earlier round, like XGBoost)."""
    if best is None or np.isnan(best):
        return not np.isnan(new)
    return new > best if metric in HIGHER_IS_BETTER else new < best


# -- weighted metrics (sample weights, issue 15) -------------------------------------------
def _unit_weights(weight) -> np.ndarray:
    """``weight`` scaled by a power of two (exactly) so that the largest is in [0.5, 1): weighted
    metrics are scale-free, and tiny weights (all 1e-300) must not underflow their products and
    sums to zero (a ZeroDivisionError)."""
    w = np.asarray(weight, dtype=np.float64).ravel()
    top = float(np.max(w)) if w.size else 0.0
    if not (math.isfinite(top) and top > 0):
        return w
    return np.ldexp(w, -math.frexp(top)[1])


def _wmean(x, weight) -> float:
    x = np.asarray(x, dtype=np.float64).ravel()
    w = _unit_weights(weight)
    return _terms_fsum(np.multiply, x, w) / _fsum(w)


def weighted_auc(y, p, weight) -> float:
    """AUC with sample weights: the weighted share of (positive, negative) pairs ranked right,
    ties counting one half (for integer weights, the AUC of the repeated rows)."""
    y = np.asarray(y, dtype=np.float64).ravel() > 0.5
    p = np.asarray(p, dtype=np.float64).ravel()
    w = _unit_weights(weight)
    w_pos, w_neg = _fsum(w[y]), _fsum(w[~y])
    if w_pos == 0 or w_neg == 0:
        return float("nan")
    order = np.argsort(p, kind="mergesort")
    sp, sy, sw = p[order], y[order], w[order]
    starts = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1]])
    group = np.cumsum(np.r_[True, sp[1:] != sp[:-1]]) - 1
    neg_in_group = np.bincount(group, weights=np.where(sy, 0.0, sw), minlength=len(starts))
    neg_below = np.concatenate([[0.0], np.cumsum(neg_in_group)[:-1]])
    pairs = sw[sy] * (neg_below[group[sy]] + 0.5 * neg_in_group[group[sy]])
    return float(_fsum(pairs) / (w_pos * w_neg))


def weighted_metrics(names, y, output, weight) -> dict[str, float]:
    """``{name: value}`` of the binary and regression metrics with sample weights."""
    y = np.asarray(y, dtype=np.float64)
    out = {}
    for name in names:
        if name == "auc":
            out[name] = weighted_auc(y, output, weight)
        elif name == "logloss":
            pc = np.clip(np.asarray(output, dtype=np.float64), _EPS, 1 - _EPS)
            out[name] = -_wmean(y * np.log(pc) + (1 - y) * np.log(1 - pc), weight)
        elif name == "error":
            out[name] = _wmean((np.asarray(output) > 0.5) != (y > 0.5), weight)
        elif name == "rmse":
            out[name] = math.sqrt(_wmean((np.asarray(output, dtype=np.float64) - y) ** 2, weight))
        elif name == "mae":
            out[name] = _wmean(np.abs(np.asarray(output, dtype=np.float64) - y), weight)
        else:
            raise KeyError(f"no weighted form of metric {name!r}")
    return out
