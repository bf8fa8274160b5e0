"""Row sampling per tree: ``subsample`` (uniform) and GOSS (gradient-based one-side sampling).

A round's trees are grown on the sampled rows only: histograms (the
expensive, encrypted part) sum only them. The other rows still have to reach
a leaf of every tree, since their raw scores are updated by it. So the
node assignment ``assignment[tree, sample]`` sent to the parties uses three
kinds of codes:

* ``node_id >= 0``: the sample is in this tree's sample and at node ``node_id``;
* ``-1``: outside every node;
* ``-2 - node_id`` (:func:`riding`): the sample is *not* in the sample but sits
  at node ``node_id``; it is routed by every split like the others but never
  enters a histogram.

Histograms select ``assignment == node_id``, so they ignore riding rows
without any change; a split returns ``go_left`` for all rows at the node
(:func:`node_members`), sampled and riding, in increasing sample order.

Leakage: the passive parties learn which rows are in each tree's sample. With
GOSS these are the ``top_rate`` share of rows with the largest
``sum_k |g_k h_k|`` (the worst-fitted rows), i.e. label-dependent information
they would not see without sampling; uniform ``subsample`` reveals only
random draws.

GOSS follows LightGBM: per round (shared by all class trees) the rows with the
largest ``sum_k |g_k h_k|`` are kept (``top_rate``), a uniform draw of
``other_rate`` of the rest is added, and the gradients and hessians of the
drawn rows are multiplied by ``(n - n_top) / n_other`` (``(1 - a) / b`` with
the actual counts). No sampling happens in the first ``1 / learning_rate``
rounds, as in LightGBM.
"""
from __future__ import annotations

import math

import numpy as np


def riding(node_id):
    """Code of a not-sampled row sitting at ``node_id``."""
    return -2 - np.asarray(node_id)


def node_members(assignment_row: np.ndarray, node_id: int) -> np.ndarray:
    """Indices (increasing) of every row at ``node_id``: sampled and riding."""
    a = np.asarray(assignment_row)
    return np.flatnonzero((a == node_id) | (a == -2 - int(node_id)))


def leaf_positions(assignment: np.ndarray) -> np.ndarray:
    """Node of every row, whatever its sampling code."""
    a = np.asarray(assignment, dtype=np.int64)
    return np.where(a >= 0, a, -2 - a)


class RowSampler:
    """Draws each round's samples, reproducibly from ``params.seed``.

    The training rows are ordered by salted id hash, a fresh order every
    training; so the draws are keyed on ``row_keys`` (the active party's own row
    position of each training row): the same seed and data give the same
    samples, whatever the salt, and ``he`` and ``plain`` grow the same trees.
    Ties of GOSS scores are broken by the same random keys.
    """

    def __init__(self, params, row_keys=None):
        self.params = params
        self.row_keys = None if row_keys is None else np.asarray(row_keys, dtype=np.int64)

    def _uniform(self, round_idx: int, stream: int, n: int) -> np.ndarray:
        """One uniform number per training row, a function of (seed, round, stream, row key)."""
        keys = np.arange(n) if self.row_keys is None else self.row_keys
        rng = np.random.default_rng([int(self.params.seed), 0x5A4D, int(round_idx), int(stream)])
        return rng.random(int(keys.max()) + 1 if keys.size else 0)[keys]

    def draw(self, round_idx: int, g: np.ndarray, h: np.ndarray):
        """``(in_sample (K, n) bool or None, weight (n,) float or None, amplification float)``.

        ``weight`` multiplies g and h of each row (GOSS); ``amplification`` is
        its maximum (1 when no row is amplified), used to widen the packing.
        """
        p = self.params
        n, K = g.shape
        if p.goss:
            if round_idx < int(1.0 / p.learning_rate) or n < 3:
                return None, None, 1.0
            n_top = max(1, int(math.floor(n * p.top_rate)))
            n_other = max(1, int(math.floor(n * p.other_rate)))
            if n_top + n_other >= n:
                return None, None, 1.0
            score = np.abs(g * h).sum(axis=1)
            u = self._uniform(round_idx, 0, n)
            order = np.lexsort((u, -score))            # largest scores first, ties by random key
            top, rest = order[:n_top], order[n_top:]
            other = rest[np.argsort(self._uniform(round_idx, 1, n)[rest], kind="stable")[:n_other]]
            mask = np.zeros(n, dtype=bool)
            mask[top] = True
            mask[other] = True
            amp = (n - n_top) / n_other
            weight = np.ones(n)
            weight[other] = amp
            return np.tile(mask, (K, 1)), weight, float(amp)
        if p.subsample < 1.0:
            m = max(1, int(round(p.subsample * n)))
            mask = np.zeros((K, n), dtype=bool)
            for k in range(K):
                mask[k, np.argsort(self._uniform(round_idx, 2 + k, n), kind="stable")[:m]] = True
            return mask, None, 1.0
        return None, None, 1.0
