"""Fitting a :class:`~vfl.core.binning.Binner` over row shards: the exact refinement of approximate
edges (:class:`ExactEdges`, :func:`answer_edge_query`, :func:`merge_edge_answers`) and
:func:`fit_sharded_binner`, which drives summaries and refinement through ``map_shards``.
"""
from __future__ import annotations

import numpy as np

from datasets.errors import InputError
from vfl.core.bin_summaries import (
    DEFAULT_SUMMARY_POINTS,
    ColumnSummary,
    _at_ranks,
    _compress,
    _midpoint_lerp,
    _midpoint_ranks,
    _sorted_unique,
    binner_from_summaries,
    merge_shard_summaries,
    summarize_shard,
    thresholds_from_summary,
)
from vfl.core.binning import Binner, check_max_bin

# When a merged summary is approximate, the edges can still be made exact in a few more rounds over
# the shards (a distributed selection): the edges need only the values at ~2 * (max_bin - 1) known
# ranks. For each such rank the driver brackets the value between two values of the summary; every
# shard answers, per bracket, how many of its values lie below it and a summary (at most
# ``bracket_points`` points) of those inside it; the merged answers either pin the rank's value
# (an exact inside summary) or give a bracket about ``bracket_points / 4`` times narrower for the
# next round. The result is Binner's edges, equal values, whatever the data and the shard layout.
# Each round's query and answers are small: per column at most 2 * (max_bin - 1) brackets, and
# per bracket one count and ``bracket_points`` points.

DEFAULT_BRACKET_POINTS = 32


class ExactEdges:
    """Driver side of the exact refinement: ``query()`` -> every shard ``answer_edge_query`` ->
    ``merge_edge_answers`` -> ``update()``, until ``done``; then ``binner()``.

    ``summaries``: the merged per-feature summaries of every shard (:func:`merge_shard_summaries`);
    columns whose summary is exact are final at once (no query)."""

    def __init__(self, summaries, max_bin: int = 32, bracket_points: int = DEFAULT_BRACKET_POINTS):
        self.max_bin = check_max_bin(max_bin)
        self.bracket_points = _check_bracket_points(bracket_points)
        self.summaries = list(summaries)
        self.rounds = 0
        self.thresholds: list[np.ndarray | None] = []
        self.known: dict[int, dict[int, float]] = {}                   # column -> rank -> value
        self.pending: dict[int, dict[int, tuple[float, float]]] = {}   # column -> rank -> bracket
        for j, s in enumerate(self.summaries):
            if s.exact or s.n == 0:
                self.thresholds.append(thresholds_from_summary(s, self.max_bin))
                continue
            self.thresholds.append(None)
            prev, nxt, _ = _midpoint_ranks(s.n, self.max_bin)
            self.known[j] = {}
            low, high = float(s.values[0]), float(s.values[-1])
            self.pending[j] = {int(r): (*_bracket(s.values, s.counts, int(r)), low, high)
                               for r in np.unique(np.concatenate([prev, nxt]))}

    @property
    def done(self) -> bool:
        return not any(self.pending.values())

    def query(self) -> dict[int, np.ndarray]:
        """``{column: brackets (m x 2: low and high value, both inclusive)}`` for the shards."""
        return {j: np.array(sorted({p[:2] for p in pend.values()}), dtype=np.float64).reshape(-1, 2)
                for j, pend in self.pending.items() if pend}

    def update(self, query: dict[int, np.ndarray], answers: dict) -> None:
        """Take the merged answers (:func:`merge_edge_answers`) to ``query``.

        Every answer resolves a rank or leaves it a bracket holding strictly fewer distinct values
        of the column (so the rounds end): ``[lo, hi]`` known to hold it is cut to the summary
        points around it; a miss (the value lies outside) cuts the known range ``[low, high]`` at
        the bracket's end."""
        self.rounds += 1
        for j, brackets in query.items():
            got = answers.get(j)
            if got is None or len(got) != len(brackets):
                raise InputError(f"the answers miss feature {j} or some of its brackets")
            index = {(lo, hi): a for (lo, hi), a in zip(brackets.tolist(), got)}
            s = self.summaries[j]
            for r, (lo, hi, low, high) in list(self.pending[j].items()):
                below, inside = index[(lo, hi)]
                k = r - int(below)
                if 0 <= k < inside.n:
                    if inside.exact:
                        self.known[j][r] = float(_at_ranks(inside.values, inside.counts, k))
                        del self.pending[j][r]
                    else:
                        self.pending[j][r] = (*_bracket(inside.values, inside.counts, k), lo, hi)
                elif k < 0:         # below the bracket (a sketch misjudged the rank): [low, lo)
                    self.pending[j][r] = (low, lo, low, lo)
                else:               # above it: (hi, high]
                    self.pending[j][r] = (hi, high, hi, high)
            if not self.pending[j]:
                prev, nxt, gamma = _midpoint_ranks(s.n, self.max_bin)
                at = self.known[j]
                cuts = np.unique(_midpoint_lerp(np.array([at[int(r)] for r in prev]),
                                                np.array([at[int(r)] for r in nxt]), gamma))
                self.thresholds[j] = cuts[cuts < s.values[-1]]

    def binner(self) -> Binner:
        if not self.done:
            raise InputError("the exact edges are not known yet: answer the pending queries first")
        binner = Binner(self.max_bin)
        binner.thresholds_ = [np.asarray(t, dtype=np.float64) for t in self.thresholds]
        return binner


def _check_bracket_points(bracket_points) -> int:
    if isinstance(bracket_points, bool) or not isinstance(bracket_points, (int, np.integer)) or bracket_points < 8:
        raise InputError(f"bracket_points must be an integer >= 8, got {bracket_points!r}")
    return int(bracket_points)


def _bracket(values, counts, k: int) -> tuple[float, float]:
    """Two points of an approximate multiset (sorted distinct ``values`` with ``counts`` standing
    for blocks of consecutive ranks) that should enclose its rank ``k``: the points either side of
    the block holding ``k``; never all the points (so a bracket holds fewer distinct values each
    round). Every point is a value of the column."""
    cum = np.cumsum(counts)
    m = len(values) - 1
    i = min(int(np.searchsorted(cum, k, side="right")), m)
    a, b = max(i - 1, 0), min(i + 1, m)
    if a == 0 and b == m:           # three points or fewer: one gap, on the side of k in its block
        upper = k >= cum[i] - counts[i] / 2
        a, b = (i, i + 1) if (upper and i < m) or i == 0 else (i - 1, i)
    return float(values[a]), float(values[b])


def answer_edge_query(X, query: dict[int, np.ndarray], bracket_points: int = DEFAULT_BRACKET_POINTS) -> dict:
    """A shard's answer: per column and bracket, ``(how many values lie below it, a summary of those
    in it)`` (runs where the shard lives)."""
    bracket_points = _check_bracket_points(bracket_points)
    X = np.asarray(X, dtype=np.float64)
    out = {}
    for j, brackets in query.items():
        col = X[:, int(j)]
        distinct, counts = _sorted_unique(np.sort(col[~np.isnan(col)]))
        below = np.concatenate([[0], np.cumsum(counts)])
        brackets = np.asarray(brackets, dtype=np.float64).reshape(-1, 2)
        starts = np.searchsorted(distinct, brackets[:, 0], side="left")
        ends = np.searchsorted(distinct, brackets[:, 1], side="right")
        answers = []
        for a, b in zip(starts.tolist(), ends.tolist()):
            values, weights = distinct[a:b], counts[a:b]
            exact = len(values) <= bracket_points
            if not exact:
                values, weights = _compress(values, weights, bracket_points)
            answers.append((int(below[a]), ColumnSummary._trusted(values, weights, exact)))
        out[int(j)] = answers
    return out


def merge_edge_answers(answers, bracket_points: int = DEFAULT_BRACKET_POINTS) -> dict:
    """Several shards' answers to one query as one (counts added, summaries merged); associative."""
    bracket_points = _check_bracket_points(bracket_points)
    answers = list(answers)
    if not answers:
        raise InputError("no answers to merge")
    out = {}
    for j in answers[0]:
        per = [a[j] for a in answers]
        if any(len(p) != len(per[0]) for p in per):
            raise InputError(f"the answers for feature {j} disagree on the number of brackets")
        out[j] = [(sum(p[i][0] for p in per), _merge_points([p[i][1] for p in per], bracket_points))
                  for i in range(len(per[0]))]
    return out


def _merge_points(summaries, max_points: int) -> ColumnSummary:
    values = np.concatenate([s.values for s in summaries])
    counts = np.concatenate([s.counts for s in summaries])
    distinct, inverse = np.unique(values, return_inverse=True)
    counts = np.bincount(inverse, weights=counts, minlength=len(distinct)).astype(np.int64)
    exact = all(s.exact for s in summaries) and len(distinct) <= max_points
    if len(distinct) > max_points:
        distinct, counts = _compress(distinct, counts, max_points)
    return ColumnSummary._trusted(distinct, counts, exact)


def fit_sharded_binner(shards, max_bin: int = 32, map_shards=None, max_points: int = DEFAULT_SUMMARY_POINTS,
                       bracket_points: int = DEFAULT_BRACKET_POINTS, exact: bool = True) -> Binner:
    """Binner's thresholds for rows cut into ``shards`` (feature matrices), computed shard by shard.

    ``map_shards(fn, *args)`` runs ``fn(shard, *args)`` on every shard and returns the results in
    shard order (default: a loop here; an executor runs it where the shards live, ``shards`` then
    being whatever handles it needs). With ``exact`` (the default) approximate summaries are refined
    until the edges are Binner's; without it the approximate edges are kept (one round)."""
    shards = list(shards)
    if map_shards is None:
        def map_shards(fn, *args):
            return [fn(s, *args) for s in shards]
    merged = merge_shard_summaries(map_shards(summarize_shard, max_points), max_points)
    if not exact:
        return binner_from_summaries(merged, max_bin)
    plan = ExactEdges(merged, max_bin, bracket_points)
    while not plan.done:
        query = plan.query()
        plan.update(query, merge_edge_answers(map_shards(answer_edge_query, query, bracket_points), bracket_points))
    return plan.binner()
