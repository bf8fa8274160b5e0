"""The boosting loop: rounds of trees over histograms from any number of sources.

One round (see :mod:`vfl.core.rounds` for the records it hands around):

1. :meth:`Booster._gradients`: the objective's gradients and hessians of the
   current raw scores, the round's row sample (:mod:`vfl.core.sampling`), and their
   fixed-point integers with a precision planned from the bounds
   (:mod:`vfl.core.objectives`, :mod:`vfl.core.fixedpoint`);
2. observers hear that the round started (the active party encrypts here),
   then every source receives the round's gradients;
3. :class:`vfl.core.grower.TreeGrower` grows the round's trees;
4. the raw scores move by the new trees' leaf values, and the observers
   receive the :class:`vfl.core.rounds.RoundRecord`; any of them may stop training.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from datasets.errors import InputError
from vfl.core.fixedpoint import encode_fixed
from vfl.core.grower import TreeGrower
from vfl.core.objectives import plan_precision, pow2_ceil, weight_bound
from vfl.core.rounds import RoundGradients, RoundObserver, RoundRecord, RoundTiming
from vfl.core.sampling import RowSampler
from vfl.core.sources import HistogramSource
from vfl.core.tree import Tree


def sequential_map(fn: Callable, items: list) -> list:
    return [fn(item) for item in items]


class Booster:
    """Grows ``n_estimators`` rounds of ``n_targets`` trees over histogram sources."""

    def __init__(self, sources: list[HistogramSource], objective, params,
                 observers: list[RoundObserver] | None = None,
                 map_sources: Callable[[Callable, list], list] | None = None, dp=None):
        """``observers`` follow the rounds in order (see :class:`vfl.core.rounds.RoundObserver`);
        ``map_sources(fn, sources)`` runs a level's per-source call (``start_round``, ``build``)
        for every source, e.g. in threads when the parties are remote (default: in turn).
        ``dp``: a private :class:`vfl.core.dp_model.DPModelPlan` (bounded gradients, Poisson row sampling
        from secret randomness, the grower's DP mechanisms); None trains the exact model."""
        self.sources = sources
        self.objective = objective
        self.params = params
        self.observers = list(observers or [])
        self._map = map_sources or sequential_map
        self.timings: list[RoundTiming] = []
        self.dp = dp if dp is not None and dp.private else None
        self.sampler = RowSampler(params) if self.dp is None else self.dp.sampler()
        self._mechanisms = None if self.dp is None else self.dp.tree_mechanisms(params)
        self.sample_weight: np.ndarray | None = None
        self.round_sources = list(sources)      # the sources of the round being grown

    def fit(self, y: np.ndarray, raw: np.ndarray | None = None, start_round: int = 0,
            rounds: list[list[Tree]] | None = None, row_keys: np.ndarray | None = None,
            sample_weight: np.ndarray | None = None):
        """``(base_score, rounds, raw)``. ``raw``/``start_round``/``rounds`` continue an earlier
        training; ``row_keys``: a stable identity of each training row (e.g. the active party's
        own row position) on which row sampling is keyed (see :class:`vfl.core.sampling.RowSampler`);
        ``sample_weight``: per row (checked, see :func:`vfl.core.objectives.check_sample_weight`), the
        gradients and hessians are multiplied by it before encoding and the base score is the
        weighted one (not with a DP released model: its sensitivities assume unweighted rows)."""
        if row_keys is not None and self.dp is None:
            self.sampler = RowSampler(self.params, row_keys)
        self.sample_weight = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if self.dp is not None and self.sample_weight is not None:
            raise InputError("dp_model cannot be combined with sample weights: the DP mechanisms' sensitivities "
                             "assume every row counts once")
        if self.dp is not None:
            base = self.dp.base_score(self.objective, y)
        else:
            base = self.objective.base_score(y) if self.sample_weight is None else \
                self.objective.base_score(y, self.sample_weight)
        raw = np.tile(base, (len(y), 1)).astype(np.float64) if raw is None else raw
        rounds = [] if rounds is None else rounds
        for r in range(start_round, self.params.n_estimators):
            record = self._round(r, y, raw)
            rounds.append(record.trees)
            if self._finished(record):
                break
        return base, rounds, raw

    def _round(self, r: int, y: np.ndarray, raw: np.ndarray) -> RoundRecord:
        timing = RoundTiming()
        t0 = time.perf_counter()
        gradients, in_sample = self._gradients(r, y, raw, timing)
        for observer in self.observers:
            observer.round_started(gradients)
        # the first active_only_rounds rounds grow on the active party's own features only: the other
        # parties receive nothing of them (no gradients, no instance space)
        only_own = r < int(getattr(self.params, "active_only_rounds", 0) or 0)
        self.round_sources = [s for s in self.sources if s.own_features] if only_own else list(self.sources)
        self._map(lambda s: s.start_round(gradients), self.round_sources)
        timing.add("gradients", time.perf_counter() - t0)
        gq, hq = gradients.as_float()
        grower = self._grower(timing)
        trees, leaf_pos = grower.grow(r, gq, hq, in_sample)
        self._update_scores(grower, trees, leaf_pos, raw)
        timing.add("total", time.perf_counter() - t0)
        self.timings.append(timing)
        return RoundRecord(r, trees, raw, timing)

    def _grower(self, timing: RoundTiming) -> TreeGrower:
        """The round's tree grower (subclasses grow differently, e.g. over debiased sources)."""
        return TreeGrower(self.round_sources, self.params, self._map, timing, dp=self._mechanisms)

    def _update_scores(self, grower: TreeGrower, trees: list[Tree], leaf_pos: np.ndarray, raw: np.ndarray) -> None:
        """Move every row's training score by its leaf value in each new tree."""
        for k, tree in enumerate(trees):
            values = np.array([nd.value for nd in tree.nodes])
            raw[:, k] += values[leaf_pos[k]]

    def _gradients(self, r: int, y: np.ndarray, raw: np.ndarray,
                   timing: RoundTiming) -> tuple[RoundGradients, np.ndarray | None]:
        """The round's fixed-point gradients, and which rows each tree samples (None: all)."""
        g, h = self.objective.gradients(y, raw)
        g_bound, h_bound = self.objective.gradient_bounds(g, h)
        if self.dp is not None:     # public bounds: g clipped to g*, every hessian h*
            g, h = self.dp.bound_gradients(g, h)
            g_bound, h_bound = pow2_ceil(self.dp.g_star), pow2_ceil(self.dp.h_star)
        wb = 1.0
        if self.sample_weight is not None:   # weighted: bounds scaled by the largest weight
            w = self.sample_weight[:, None]
            g, h = g * w, h * w
            wb = weight_bound(self.sample_weight)
            g_bound, h_bound = g_bound * wb, h_bound * wb
        in_sample, weight, amp = self.sampler.draw(r, g, h)
        if weight is not None:      # GOSS amplification of the drawn small-gradient rows
            g, h = g * weight[:, None], h * weight[:, None]
            g_bound, h_bound = pow2_ceil(g_bound * amp), pow2_ceil(h_bound * amp)
        precision = plan_precision(g_bound, h_bound, len(y), self.params.precision_bits, weight_bound=wb)
        in_any = None if in_sample is None else in_sample.any(axis=0)
        gradients = RoundGradients(r, encode_fixed(g, precision), encode_fixed(h, precision),
                                   float(g_bound), float(h_bound), precision, in_any, timing)
        return gradients, in_sample

    def _finished(self, record: RoundRecord) -> bool:
        """Every observer sees the round (in order); True when any of them stops training."""
        stop = False
        for observer in self.observers:
            if observer.round_finished(record):
                stop = True
        return stop
