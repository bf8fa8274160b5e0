"""vfl.core.metrics evaluates a chunk of rows at a time (a driver's temporaries stay a few MB whatever
the number of rows) and equals its naive twins: the same per-row terms over the whole vectors,
summed exactly at once."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from support import examples

from vfl.core import metrics


def naive_mean(x):
    x = np.asarray(x, dtype=np.float64).ravel()
    return math.fsum(x.tolist()) / x.size


def naive_auc(y, p):
    y, p = np.asarray(y, dtype=np.float64) > 0.5, np.asarray(p, dtype=np.float64)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    order = np.argsort(p, kind="mergesort")
    sp = p[order]
    starts = np.flatnonzero(np.r_[True, sp[1:] != sp[:-1]])
    ends = np.r_[starts[1:], sp.size]
    ranks = np.empty(p.size)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return (math.fsum(ranks[y].tolist()) - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def naive(name, y, out, slope=1.0):
    y = np.asarray(y, dtype=np.float64)
    if name == "logloss":
        p = np.clip(out, 1e-15, 1 - 1e-15)
        return -naive_mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    if name == "auc":
        return naive_auc(y, out)
    if name == "error":
        return naive_mean((out > 0.5) != (y > 0.5))
    if name == "rmse":
        return math.sqrt(naive_mean((out - y) * (out - y)))
    if name == "mae":
        return naive_mean(np.abs(out - y))
    if name == "mphe":
        r = (out - y) / slope
        return naive_mean(slope ** 2 * (np.sqrt(1 + r * r) - 1))
    raise KeyError(name)


@settings(max_examples=examples(60), deadline=None)
@given(n=st.integers(2, 200), distinct=st.integers(1, 40), c=st.integers(1, 9), seed=st.integers(0, 2**31 - 1))
def test_every_metric_equals_its_whole_vector_twin(n, distinct, c, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n).astype(float)
    y[:2] = [0.0, 1.0]                                 # both classes
    p = rng.integers(0, distinct, n) / max(distinct - 1, 1)     # ties
    p = np.clip(p + rng.normal(scale=1e-3, size=n) * (rng.random(n) < 0.5), 0, 1)
    saved = metrics._CHUNK
    metrics._CHUNK = c
    try:
        for name in ("logloss", "auc", "error", "rmse", "mae"):
            assert metrics.METRICS[name](y, p) == naive(name, y, p), name
        assert metrics.mphe(y, 3 * p, 0.7) == naive("mphe", y, 3 * p, 0.7)
        k = 3
        proba = rng.dirichlet(np.ones(k), n)
        yk = rng.integers(0, k, n)
        assert metrics.mlogloss(yk, proba) == -naive_mean(np.log(np.clip(proba[np.arange(n), yk], 1e-15, 1.0)))
        assert metrics.merror(yk, proba) == naive_mean(np.argmax(proba, axis=1) != yk)
        w = rng.random(n) + 0.1
        got = metrics.weighted_metrics(["logloss", "error", "rmse", "mae"], y, p, w)
        pc = np.clip(p, 1e-15, 1 - 1e-15)
        assert got["logloss"] == -math.fsum((w * (y * np.log(pc) + (1 - y) * np.log(1 - pc))).tolist()) / \
            math.fsum(w.tolist())
        assert got["mae"] == math.fsum((w * np.abs(p - y)).tolist()) / math.fsum(w.tolist())
    finally:
        metrics._CHUNK = saved


def test_auc_with_one_class_is_nan_and_ties_share_their_rank():
    assert math.isnan(metrics.auc(np.ones(5), np.linspace(0, 1, 5)))
    assert metrics.auc(np.array([0, 1, 0, 1]), np.array([0.5, 0.5, 0.5, 0.5])) == 0.5
    assert metrics.auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
