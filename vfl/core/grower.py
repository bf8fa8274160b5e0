"""Growing one round's trees, level by level, over histogram sources.

In the style of scikit-learn's ``TreeGrower``: :meth:`TreeGrower.grow` is a
short list of named steps, one per level:

1. :meth:`~TreeGrower._splittable`: the frontier nodes that may still split;
2. :meth:`~TreeGrower._plan_histograms`: per sibling pair, build the smaller
   child and derive the larger one as parent minus child (in plaintext, after
   decryption: the cheapest place, since it costs a passive party no
   ciphertext work at all);
3. :meth:`~TreeGrower._build_histograms`: every source builds its histograms
   of the planned nodes (concurrently, through ``map_sources``);
4. :meth:`~TreeGrower._derive_siblings`;
5. :meth:`~TreeGrower._find_splits`: the best split of every node over all
   sources (:func:`vfl.core.split.find_best_split`);
6. :meth:`~TreeGrower._apply_at_owners`: each chosen split goes to the source
   that owns it, which answers which rows go left;
7. :meth:`~TreeGrower._add_children`: children numbered breadth-first,
   whoever owns the split, and the node assignment updated.

Leaf values come last (:meth:`~TreeGrower._set_leaf_values`).

Monotone constraints (:mod:`vfl.core.split`): every node has weight bounds (:meth:`_node_constraints`);
after a split on a constrained feature the children's bounds meet at the midpoint of their
weights (:meth:`_child_bounds`), and leaf values are clipped to their node's bounds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from datasets.errors import InputError
from vfl.core.rounds import RoundTiming
from vfl.core.sampling import leaf_positions, node_members, riding
from vfl.core.sources import HistogramSource, NodeCandidates, SplitRef
from vfl.core.split import (
    MIN_GAIN,
    CategoricalParams,
    Constraints,
    SplitInfo,
    best_categorical,
    find_best_candidate,
    find_best_split,
)
from vfl.core.tree import Node, Tree

Key = tuple[int, int]      # (tree index within the round, node id)


@dataclass
class _Plan:
    build: list[Key]                            # nodes whose histograms the sources build
    derive: list[tuple[int, int, int, int]]     # (tree, node, built sibling, parent): parent - sibling


class TreeGrower:
    """Grows the ``n_targets`` trees of one round (one per target) over ``sources``."""

    def __init__(self, sources: list[HistogramSource], params, map_sources: Callable[[Callable, list], list],
                 timing: RoundTiming, dp=None):
        """``dp``: the DP seam (:class:`vfl.core.dp_mechanisms.TreeMechanisms`); None grows the exact trees."""
        self.sources = sources
        self.params = params
        self._map = map_sources
        self.timing = timing
        self.dp = dp
        self.constrained = any(getattr(s, "monotone", None) is not None and np.any(np.asarray(s.monotone) != 0)
                               for s in sources)
        self.cat_params = CategoricalParams(getattr(params, "cat_smooth", 10.0),
                                            getattr(params, "min_data_per_group", 100),
                                            getattr(params, "max_cat_threshold", 32))
        self.bounds: dict[Key, tuple[float, float]] = {}
        # the passive parties serve no histogram of a node with 0 < rows < this (a DP released model
        # grows every node whatever its rows: it agrees 1, see parties.active)
        self._floor = 1 if dp is not None else int(getattr(params, "min_node_rows", 1))
        # a passive party that answers shuffled candidates sees every partition of the instance space and
        # refuses one with a child of fewer than min_node_rows rows (parties.passive_checks): the own
        # sources' splits keep both children at the floor too
        self._both_children = self._floor if any(s.shuffled for s in sources) else 1
        self._counts: dict[Key, list] = {}
        if dp is not None and (self.constrained or any(getattr(s, "categorical", None) is not None
                                                       for s in sources)):
            raise InputError("dp_model does not support categorical features or monotone constraints (its split "
                             "mechanism treats every feature's bins as ordered thresholds, unconstrained)")

    def grow(self, round_idx: int, gq: np.ndarray, hq: np.ndarray,
             in_sample: np.ndarray | None = None) -> tuple[list[Tree], np.ndarray]:
        """The round's trees and every row's leaf per tree; ``gq``/``hq`` (n_rows, n_targets) are
        the quantised gradients as floats, ``in_sample`` (n_targets, n_rows) the sampled rows."""
        self.round_idx, self.gq, self.hq = round_idx, gq, hq
        n_rows, n_targets = gq.shape
        self.assignment = np.zeros((n_targets, n_rows), dtype=np.int32)
        if in_sample is not None:       # rows outside the sample ride along (vfl.core.sampling)
            self.assignment[~in_sample] = riding(0)
        self.trees = [self._root(k) for k in range(n_targets)]
        frontier: list[Key] = [(k, 0) for k in range(n_targets)]
        parent_hist: dict[Key, list] = {}
        for _ in range(self.params.max_depth):
            nodes = self._splittable(frontier)
            if not nodes:
                break
            plan = self._plan_histograms(nodes)
            hist = self._build_histograms(plan.build, nodes)
            self._derive_siblings(hist, plan.derive, parent_hist)
            self._count_rows(nodes)
            chosen = self._find_splits(nodes, hist)
            parent_hist = {(k, nid): hist[(k, nid)] for k, nid, _ in chosen}
            frontier = self._split_chosen(chosen)
        self._set_leaf_values()
        return self.trees, leaf_positions(self.assignment)

    # -- the steps --------------------------------------------------------------
    def _root(self, k: int) -> Tree:
        tree = Tree()
        rows = np.flatnonzero(self.assignment[k] == 0)
        tree.add(Node(0, 0, sum_gradients=float(self.gq[rows, k].sum()),
                      sum_hessians=float(self.hq[rows, k].sum()), n_samples=int(rows.size)))
        return tree

    def _splittable(self, frontier: list[Key]) -> list[Key]:
        p = self.params
        if self.dp is not None:     # DP: every node splits to max_depth (stopping on counts would leak)
            return list(frontier)
        least = max(2, int(getattr(p, "min_node_rows", 2)))     # no histogram of a node below the floor
        return [(k, nid) for k, nid in frontier
                if self.trees[k].nodes[nid].sum_hessians >= 2 * p.min_child_weight
                and self.trees[k].nodes[nid].n_samples >= least]

    def _plan_histograms(self, nodes: list[Key]) -> _Plan:
        wanted = set(nodes)
        plan, seen = _Plan([], []), set()
        for k, nid in nodes:
            tree = self.trees[k]
            node = tree.nodes[nid]
            if node.parent < 0:
                plan.build.append((k, nid))
                continue
            if (k, node.parent) in seen:
                continue
            seen.add((k, node.parent))
            parent = tree.nodes[node.parent]
            a, b = tree.nodes[parent.left], tree.nodes[parent.right]
            small, large = (a, b) if a.n_samples <= b.n_samples else (b, a)
            if 0 < small.n_samples < self._floor:     # below the histogram floor: build the other, derive this
                small, large = large, small
            plan.build.append((k, small.node_id))
            if (k, large.node_id) in wanted:
                plan.derive.append((k, large.node_id, small.node_id, parent.node_id))
        return plan

    def _build_histograms(self, build: list[Key], nodes: list[Key] | None = None) -> dict[Key, list]:
        """``{node: [(sum_gradients, sum_hessians) of every source]}``; a source of shuffled candidates
        (``shuffled``) is asked for every node of the level (``nodes``) and gives a
        :class:`vfl.core.sources.NodeCandidates` per node (it derives siblings itself)."""
        nodes = list(build) if nodes is None else list(nodes)
        keys = list(dict.fromkeys(build + nodes))
        hist: dict[Key, list] = {key: [None] * len(self.sources) for key in keys}
        t0 = time.perf_counter()
        r = self.round_idx

        def one(s):
            asked = nodes if s.shuffled else build
            tree_idx = np.array([k for k, _ in asked], dtype=np.int32)
            node_ids = np.array([nid for _, nid in asked], dtype=np.int32)
            return asked, s.build(r, tree_idx, node_ids, self.assignment)

        for si, (asked, out) in enumerate(self._map(one, self.sources)):
            if self.sources[si].shuffled:
                for key, cands in zip(asked, out):
                    hist[key][si] = cands
            else:
                sg, sh = out
                for i, key in enumerate(asked):
                    hist[key][si] = (sg[i], sh[i])
        self.timing.add("histograms", time.perf_counter() - t0)
        return hist

    def _derive_siblings(self, hist: dict[Key, list], derive, parent_hist: dict[Key, list]) -> None:
        """Parent minus the built sibling, for the sources of per-bin sums (a source of shuffled
        candidates derives its own siblings: it was asked for every node)."""
        for k, nid, small, parent in derive:
            own = hist.get((k, nid), [None] * len(self.sources))
            hist[(k, nid)] = [own[si] if src.shuffled else (p[0] - c[0], p[1] - c[1])
                              for si, (src, p, c) in enumerate(zip(self.sources, parent_hist[(k, parent)],
                                                                   hist[(k, small)]))]

    def _count_rows(self, nodes: list[Key]) -> None:
        """Rows per bin of each node for the sources that keep both children at the floor."""
        self._counts = {}
        if self._both_children <= 1 or self.dp is not None:
            return
        tree_idx = np.array([k for k, _ in nodes], dtype=np.int32)
        node_ids = np.array([nid for _, nid in nodes], dtype=np.int32)
        for si, src in enumerate(self.sources):
            if src.counts_rows:
                for key, cnt in zip(nodes, src.counts(tree_idx, node_ids, self.assignment)):
                    self._counts.setdefault(key, [None] * len(self.sources))[si] = cnt

    def _node_constraints(self, k: int, nid: int) -> Constraints:
        lower, upper = self.bounds.get((k, nid), (-np.inf, np.inf))
        return Constraints(lower, upper, self.constrained)

    def _find_splits(self, nodes: list[Key], hist: dict[Key, list]) -> list[tuple[int, int, SplitInfo]]:
        p = self.params
        t0 = time.perf_counter()
        chosen = []
        for k, nid in nodes:
            node = self.trees[k].nodes[nid]
            if self.dp is not None:     # the exponential mechanism over every party's candidates
                best = self.dp.choose_split(node, hist[(k, nid)], [s.bin_offsets for s in self.sources],
                                            (self.round_idx, k), self.trees[k].nodes)
                chosen += [(k, nid, best)] if best is not None else []
                continue
            best = None
            cons = self._node_constraints(k, nid)
            for si, entry in enumerate(hist[(k, nid)]):
                if isinstance(entry, NodeCandidates):
                    info = self._candidate_split(node, si, entry, cons)
                else:
                    info = self._source_split(k, nid, node, si, entry[0], entry[1], cons)
                if info is not None and (best is None or info.gain > best.gain):
                    best = info
            if best is not None and best.gain > max(p.gamma, MIN_GAIN):
                chosen.append((k, nid, best))
        self.timing.add("split_search", time.perf_counter() - t0)
        return chosen

    def _source_split(self, k: int, nid: int, node, si: int, sg, sh, cons: Constraints) -> SplitInfo | None:
        """The best split of node ``(k, nid)`` among source ``si``'s bins (histogram ``sg``/``sh``)."""
        p, src = self.params, self.sources[si]
        counts = self._counts.get((k, nid), [None] * len(self.sources))[si]
        return find_best_split(sg, sh, src.bin_offsets, node.sum_gradients, node.sum_hessians, p.reg_lambda,
                               p.min_child_weight, si, categorical=getattr(src, "categorical", None),
                               monotone=getattr(src, "monotone", None), constraints=cons,
                               n_samples=node.n_samples, cat_params=self.cat_params, counts=counts,
                               min_rows=self._both_children)

    def _candidate_split(self, node, si: int, c: NodeCandidates, cons: Constraints) -> SplitInfo | None:
        """The best of a passive party's shuffled candidates (all positions of the best gain: the party
        breaks the tie) and of its categorical features' partitions; on an exact tie between the two
        the party decides (``tie_with_categorical``), as :func:`vfl.core.split.find_best_split` would
        by feature order."""
        p = self.params
        G, H = node.sum_gradients, node.sum_hessians
        best = find_best_candidate(c.gl, c.hl, G, H, p.reg_lambda, p.min_child_weight, si, c.monotone, cons)
        if c.cat_features:
            cat = best_categorical(c.cat_g, c.cat_h, c.cat_offsets, c.cat_features, G, H, p.reg_lambda,
                                   p.min_child_weight, si, cons, node.n_samples, self.cat_params)
            if cat is not None and (best is None or cat.gain > best.gain):
                return cat
            if cat is not None and cat.gain == best.gain:
                cat.positions, cat.tie_with_categorical = best.positions, True
                return cat
        return best

    def _split_chosen(self, chosen: list[tuple[int, int, SplitInfo]]) -> list[Key]:
        """Apply the chosen splits at their owners and add the children; the next frontier."""
        t0 = time.perf_counter()
        results = self._apply_at_owners(chosen)
        frontier: list[Key] = []
        for k, nid, best in chosen:       # children numbered breadth-first, whoever owns the split
            ref, go_left = results[(k, nid)]
            frontier.extend(self._add_children(k, nid, best, ref, go_left))
        self.timing.add("apply_splits", time.perf_counter() - t0)
        return sorted(frontier)

    def _apply_at_owners(self, chosen) -> dict[Key, tuple[SplitRef, np.ndarray]]:
        results = {}
        for si, source in enumerate(self.sources):
            mine = [(k, nid, b) for k, nid, b in chosen if b.source_idx == si]
            if not mine:
                continue
            extra = {"picks": [b for _, _, b in mine]} if source.shuffled else {}
            out = source.split(self.round_idx, np.array([k for k, _, _ in mine], dtype=np.int32),
                               np.array([nid for _, nid, _ in mine], dtype=np.int32),
                               np.array([b.feature_idx for _, _, b in mine], dtype=np.int32),
                               np.array([b.bin_idx for _, _, b in mine], dtype=np.int32),
                               np.array([b.default_left for _, _, b in mine], dtype=bool),
                               self.assignment, categories=[b.categories for _, _, b in mine], **extra)
            results.update({(k, nid): res for (k, nid, _), res in zip(mine, out)})
        return results

    def _add_children(self, k: int, nid: int, best: SplitInfo, ref: SplitRef, go_left) -> list[Key]:
        tree, assignment = self.trees[k], self.assignment
        node = tree.nodes[nid]
        rows = node_members(assignment[k], nid)
        go_left = np.asarray(go_left, dtype=bool)
        if go_left.shape != rows.shape:
            raise ValueError(f"party {ref.owner!r} returned {go_left.size} split decisions "
                             f"for a node of {rows.size} samples")
        left_rows, right_rows = rows[go_left], rows[~go_left]
        node.is_leaf = False
        node.owner, node.record_id = ref.owner, ref.record_id
        node.feature_idx, node.feature = ref.feature_idx, ref.feature
        node.threshold, node.default_left = ref.threshold, ref.default_left
        node.categories = ref.categories
        node.gain = best.gain
        children = []
        for child_rows in (left_rows, right_rows):
            child_rows = child_rows[assignment[k, child_rows] >= 0]     # sampled rows only
            children.append(tree.add(Node(len(tree.nodes), node.depth + 1, parent=nid,
                                          sum_gradients=float(self.gq[child_rows, k].sum()),
                                          sum_hessians=float(self.hq[child_rows, k].sum()),
                                          n_samples=int(child_rows.size))))
        node.left, node.right = children[0].node_id, children[1].node_id
        self._child_bounds(k, nid, best, node.left, node.right)
        for child_id, child_rows in ((node.right, right_rows), (node.left, left_rows)):
            sampled = assignment[k, child_rows] >= 0
            assignment[k, child_rows] = np.where(sampled, child_id, riding(child_id))
        return [(k, node.left), (k, node.right)]

    def _child_bounds(self, k: int, nid: int, best: SplitInfo, left: int, right: int) -> None:
        """XGBoost's bound propagation: children inherit the node's bounds; a split on a constrained
        feature puts the midpoint of the two weights between them."""
        if not self.constrained:
            return
        lower, upper = self.bounds.get((k, nid), (-np.inf, np.inf))
        lb, rb = (lower, upper), (lower, upper)
        if best.monotone:
            mid = (best.weight_left + best.weight_right) / 2.0
            lb, rb = ((lower, mid), (mid, upper)) if best.monotone > 0 else ((mid, upper), (lower, mid))
        self.bounds[(k, left)], self.bounds[(k, right)] = lb, rb

    def _set_leaf_values(self) -> None:
        p = self.params
        for k, tree in enumerate(self.trees):
            if self.dp is not None:     # noisy leaves; the released tree keeps no exact statistics
                for node in tree.leaves():
                    node.value = float(self.dp.leaf_weight(node) * p.learning_rate)
                self.dp.release(tree)
                continue
            for node in tree.nodes:
                if node.is_leaf:
                    if self.constrained:
                        lower, upper = self.bounds.get((k, node.node_id), (-np.inf, np.inf))
                        w = float(np.clip(-node.sum_gradients / (node.sum_hessians + p.reg_lambda),
                                          lower, upper))
                        node.value = float(w * p.learning_rate)
                        continue
                    node.value = float(-node.sum_gradients / (node.sum_hessians + p.reg_lambda)
                                       * p.learning_rate)
