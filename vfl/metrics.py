"""Evaluation metrics (XGBoost's names) for training history and early stopping.

Every metric takes the encoded labels (``0/1``, ``0..K-1`` or real values)
and the model's transformed output (probability of class 1, class
probabilities ``(n, K)``, or predictions). ``HIGHER_IS_BETTER`` lists the
metrics to maximise; the others are minimised.
"""
from __future__ import annotations

import math

import numpy as np

_EPS = 1e-15


def _mean(x) -> float:
    """Exactly rounded mean: independent of the row order (which follows the salted id hashes)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    return math.fsum(x.tolist()) / x.size if x.size else float("nan")


HIGHER_IS_BETTER = {"auc"}


def logloss(y, p) -> float:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1 - _EPS)
    y = np.asarray(y, dtype=np.float64)
    return -_mean(y * np.log(p) + (1 - y) * np.log(1 - p))


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
    sorted_p = p[order]
    # 1-based ranks, ties replaced by the mean rank of their group
    starts = np.flatnonzero(np.r_[True, sorted_p[1:] != sorted_p[:-1]])
    ends = np.r_[starts[1:], sorted_p.size]
    mean_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(p.size)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    u = math.fsum(ranks[y].tolist()) - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def error(y, p) -> float:
    return _mean((np.asarray(p) > 0.5) != (np.asarray(y) > 0.5))


def mlogloss(y, proba) -> float:
    proba = np.clip(np.asarray(proba, dtype=np.float64), _EPS, 1.0)
    y = np.asarray(y, dtype=np.int64)
    return -_mean(np.log(proba[np.arange(len(y)), y]))


def merror(y, proba) -> float:
    return _mean(np.argmax(proba, axis=1) != np.asarray(y, dtype=np.int64))


def rmse(y, pred) -> float:
    d = np.asarray(pred, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    return math.sqrt(_mean(d * d))


def mae(y, pred) -> float:
    return _mean(np.abs(np.asarray(pred, dtype=np.float64) - np.asarray(y, dtype=np.float64)))


def mphe(y, pred, huber_slope: float = 1.0) -> float:
    """Mean pseudo-Huber error (XGBoost's ``mphe``)."""
    r = (np.asarray(pred, dtype=np.float64) - np.asarray(y, dtype=np.float64)) / huber_slope
    return _mean(huber_slope ** 2 * (np.sqrt(1 + r * r) - 1))


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
def _wmean(x, weight) -> float:
    x = np.asarray(x, dtype=np.float64).ravel()
    w = np.asarray(weight, dtype=np.float64).ravel()
    return math.fsum((x * w).tolist()) / math.fsum(w.tolist())


def weighted_auc(y, p, weight) -> float:
    """AUC with sample weights: the weighted share of (positive, negative) pairs ranked right,
    ties counting one half (for integer weights, the AUC of the repeated rows)."""
    y = np.asarray(y, dtype=np.float64).ravel() > 0.5
    p = np.asarray(p, dtype=np.float64).ravel()
    w = np.asarray(weight, dtype=np.float64).ravel()
    w_pos, w_neg = math.fsum(w[y].tolist()), math.fsum(w[~y].tolist())
    if w_pos == 0 or w_neg == 0:
        return float("nan")
    order = np.argsort(p, kind="mergesort")
    sp, sy, sw = p[order], y[order], w[order]
    starts = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1]])
    group = np.cumsum(np.r_[True, sp[1:] != sp[:-1]]) - 1
    neg_in_group = np.bincount(group, weights=np.where(sy, 0.0, sw), minlength=len(starts))
    neg_below = np.concatenate([[0.0], np.cumsum(neg_in_group)[:-1]])
    pairs = sw[sy] * (neg_below[group[sy]] + 0.5 * neg_in_group[group[sy]])
    return float(math.fsum(pairs.tolist()) / (w_pos * w_neg))


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
