"""The boosting loop: level-wise growth over histograms from any number of sources.

A *histogram source* is one party's features as the active party sees them:
its own features (:class:`LocalSource`, plaintext) or a passive party behind a
transport (``parties.active.RemoteSource``, encrypted in ``he`` mode). The
loop below is the same for both, which is what makes ``he`` and ``plain``
grow identical trees: both see the same fixed-point sums.

Per level, the smaller child of every split is built and its sibling is
derived as parent minus child (in plaintext, after decryption: the cheapest
place, since it costs the passive party no ciphertext work at all).
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from crypto.packing import PackingLayout
from vfl.binning import Binner
from vfl.fixedpoint import encode_fixed
from vfl.objectives import plan_precision, pow2_ceil
from vfl.sampling import RowSampler, leaf_positions, node_members, riding
from vfl.split import MIN_GAIN, find_best_split, goes_left
from vfl.tree import Node, Tree


@dataclass
class SplitRef:
    """What the active party keeps about a split held by ``owner``."""
    owner: str
    record_id: int = -1
    feature_idx: int = -1
    feature: str | None = None
    threshold: float | None = None
    default_left: bool | None = None


class HistogramSource(ABC):
    """One party's features, seen through histograms."""

    party: str
    bin_offsets: np.ndarray

    @abstractmethod
    def start_round(self, round_idx: int, g_int: np.ndarray, h_int: np.ndarray,
                    layout: PackingLayout) -> None:
        """New gradients (fixed-point ints, shape (n_samples, n_targets))."""

    @abstractmethod
    def build(self, round_idx: int, depth: int, tree_idx: np.ndarray, node_ids: np.ndarray,
              assignment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(sum_gradients, sum_hessians)``, each ``(len(node_ids), n_flat_bins)`` float64,
        for each node's own target (``tree_idx``)."""

    @abstractmethod
    def split(self, round_idx: int, tree_idx: np.ndarray, node_ids: np.ndarray,
              feature_idx: np.ndarray, bin_idx: np.ndarray, default_left: np.ndarray,
              assignment: np.ndarray) -> list[tuple[SplitRef, np.ndarray]]:
        """Apply splits; per split the ref to keep and ``go_left`` over the node's samples
        in increasing sample order."""

    def set_sample(self, round_idx: int, in_any_sample: np.ndarray) -> None:
        """Called before :meth:`start_round` when rows are sampled: ``in_any_sample[i]`` is False
        for rows that no tree of the round uses (their gradients need not be sent)."""


class LocalSource(HistogramSource):
    """The active party's own features, in plaintext."""

    def __init__(self, party: str, X: np.ndarray, feature_names: list[str], max_bin: int):
        self.party = party
        self.feature_names = list(feature_names)
        self.binner = Binner(max_bin).fit(X)
        self._set_bins(self.binner.transform(X), self.binner.n_bins)

    def _set_bins(self, bin_idx: np.ndarray, n_bins: np.ndarray) -> None:
        """``bin_idx`` of every sample; ``n_bins[f]`` slots of feature f, the last for missing."""
        self.n_bins = np.asarray(n_bins, dtype=np.int64)
        self.bin_idx = np.asarray(bin_idx).astype(np.uint16)
        self.bin_offsets = np.concatenate([[0], np.cumsum(self.n_bins)]).astype(np.int64)
        self._flat = self.bin_idx.astype(np.int64) + self.bin_offsets[:-1][None, :]
        self._g = self._h = None

    def start_round(self, round_idx, g_int, h_int, layout):
        scale = float(2 ** layout.precision_bits)
        self._g = g_int / scale
        self._h = h_int / scale

    def build(self, round_idx, depth, tree_idx, node_ids, assignment):
        n_flat = int(self.bin_offsets[-1])
        F = self.bin_idx.shape[1]
        sg = np.zeros((len(node_ids), n_flat))
        sh = np.zeros((len(node_ids), n_flat))
        for i, (t, nid) in enumerate(zip(tree_idx, node_ids)):
            rows = np.flatnonzero(assignment[t] == nid)
            idx = self._flat[rows].ravel()
            sg[i] = np.bincount(idx, np.repeat(self._g[rows, t], F), minlength=n_flat)
            sh[i] = np.bincount(idx, np.repeat(self._h[rows, t], F), minlength=n_flat)
        return sg, sh

    def _refs(self, feature_idx, bin_idx, default_left) -> list[SplitRef]:
        """What the tree keeps of each split: here the feature and its raw threshold."""
        return [SplitRef(self.party, feature_idx=int(f), feature=self.feature_names[f],
                         threshold=self.binner.threshold(f, b), default_left=bool(dl))
                for f, b, dl in zip(feature_idx, bin_idx, default_left)]

    def split(self, round_idx, tree_idx, node_ids, feature_idx, bin_idx, default_left, assignment):
        out = []
        refs = self._refs(feature_idx, bin_idx, default_left)
        for ref, t, nid, f, b, dl in zip(refs, tree_idx, node_ids, feature_idx, bin_idx, default_left):
            rows = node_members(assignment[t], nid)        # sampled and riding rows (vfl.sampling)
            bins = self.bin_idx[rows, f].astype(np.int64)
            go_left = goes_left(bins, b, dl, missing=bins == self.n_bins[f] - 1)
            out.append((ref, go_left))
        return out


@dataclass
class RoundTiming:
    """Wall-clock seconds of one boosting round, by stage."""
    seconds: dict = field(default_factory=lambda: defaultdict(float))

    def add(self, stage: str, dt: float) -> None:
        self.seconds[stage] += dt


class Booster:
    """Grows ``n_estimators`` rounds of ``n_targets`` trees over histogram sources."""

    def __init__(self, sources: list[HistogramSource], loss, params,
                 on_round: Callable[[int, dict], bool | None] | None = None,
                 map_sources: Callable[[Callable, list], list] | None = None):
        """``map_sources(fn, sources)`` runs a level's per-source call (``start_round``,
        ``build``) for every source, e.g. in threads when the parties are remote;
        default: one after the other."""
        self.sources = sources
        self._map = map_sources or (lambda fn, items: [fn(item) for item in items])
        self.loss = loss
        self.params = params
        self.on_round = on_round
        self.timings: list[dict] = []
        self.sampler = RowSampler(params)

    def fit(self, y: np.ndarray, raw: np.ndarray | None = None, start_round: int = 0,
            rounds: list[list[Tree]] | None = None, row_keys: np.ndarray | None = None):
        """``row_keys``: a stable identity of each training row (e.g. the active party's own row
        position) on which row sampling is keyed (see :class:`vfl.sampling.RowSampler`)."""
        p, loss = self.params, self.loss
        if row_keys is not None:
            self.sampler = RowSampler(p, row_keys)
        n = len(y)
        K = loss.n_targets
        base = loss.base_score(y)
        raw = np.tile(base, (n, 1)).astype(np.float64) if raw is None else raw
        rounds = [] if rounds is None else rounds
        for r in range(start_round, p.n_estimators):
            timing = RoundTiming()
            t0 = time.perf_counter()
            g, h = loss.gradients(y, raw)
            g_bound, h_bound = loss.gradient_bounds(g, h)
            in_sample, weight, amp = self.sampler.draw(r, g, h)
            if weight is not None:      # GOSS amplification of the drawn small-gradient rows
                g, h = g * weight[:, None], h * weight[:, None]
                g_bound, h_bound = pow2_ceil(g_bound * amp), pow2_ceil(h_bound * amp)
            precision = plan_precision(g_bound, h_bound, n, p.precision_bits)
            g_int = encode_fixed(g, precision)
            h_int = encode_fixed(h, precision)
            layout = PackingLayout.for_bounds(g_bound, h_bound, max_rows=n, n_targets=K,
                                              precision_bits=precision)
            if in_sample is not None:
                in_any = in_sample.any(axis=0)
                for s in self.sources:
                    s.set_sample(r, in_any)
            self._map(lambda s: s.start_round(r, g_int, h_int, layout), self.sources)
            timing.add("gradients", time.perf_counter() - t0)
            scale = float(2 ** precision)
            trees, leaf_pos = self._grow_round(r, g_int / scale, h_int / scale, timing, in_sample)
            for k, tree in enumerate(trees):
                values = np.array([nd.value for nd in tree.nodes])
                raw[:, k] += values[leaf_pos[k]]
            rounds.append(trees)
            timing.add("total", time.perf_counter() - t0)
            self.timings.append(dict(timing.seconds))
            if self.on_round is not None and self.on_round(r, {"raw": raw, "timing": self.timings[-1],
                                                               "trees": trees}):
                break
        return base, rounds, raw

    def _grow_round(self, r, gq, hq, timing, in_sample=None):
        p = self.params
        K = gq.shape[1]
        n = gq.shape[0]
        assignment = np.zeros((K, n), dtype=np.int32)
        if in_sample is not None:       # rows outside the sample ride along (vfl.sampling)
            assignment[~in_sample] = riding(0)
        trees = []
        for k in range(K):
            tree = Tree()
            rows = np.flatnonzero(assignment[k] == 0)
            tree.add(Node(0, 0, sum_gradients=float(gq[rows, k].sum()),
                          sum_hessians=float(hq[rows, k].sum()), n_samples=int(rows.size)))
            trees.append(tree)
        frontier = [(k, 0) for k in range(K)]
        parent_hist: dict[tuple[int, int], list] = {}
        for depth in range(p.max_depth):
            can = [(k, nid) for k, nid in frontier
                   if trees[k].nodes[nid].sum_hessians >= 2 * p.min_child_weight
                   and trees[k].nodes[nid].n_samples >= 2]
            if not can:
                break
            canset = set(can)
            build, derive = [], []
            seen = set()
            for k, nid in can:
                node = trees[k].nodes[nid]
                if node.parent < 0:
                    build.append((k, nid))
                    continue
                par = trees[k].nodes[node.parent]
                if (k, par.node_id) in seen:
                    continue
                seen.add((k, par.node_id))
                a, b = trees[k].nodes[par.left], trees[k].nodes[par.right]
                small, large = (a, b) if a.n_samples <= b.n_samples else (b, a)
                build.append((k, small.node_id))
                if (k, large.node_id) in canset:
                    derive.append((k, large.node_id, small.node_id, par.node_id))
            hist: dict[tuple[int, int], list] = {(k, nid): [] for k, nid in build}
            t_idx = np.array([k for k, _ in build], dtype=np.int32)
            n_ids = np.array([nid for _, nid in build], dtype=np.int32)
            t0 = time.perf_counter()
            for sg, sh in self._map(lambda s: s.build(r, depth, t_idx, n_ids, assignment), self.sources):
                for i, key in enumerate(build):
                    hist[key].append((sg[i], sh[i]))
            timing.add("histograms", time.perf_counter() - t0)
            for k, nid, small, par in derive:
                hist[(k, nid)] = [(pg - cg, ph - ch) for (pg, ph), (cg, ch)
                                  in zip(parent_hist[(k, par)], hist[(k, small)])]
            t0 = time.perf_counter()
            chosen = []
            for k, nid in can:
                node = trees[k].nodes[nid]
                best = None
                for si, (sg, sh) in enumerate(hist[(k, nid)]):
                    info = find_best_split(sg, sh, self.sources[si].bin_offsets, node.sum_gradients,
                                           node.sum_hessians, p.reg_lambda, p.min_child_weight, si)
                    if info is not None and (best is None or info.gain > best.gain):
                        best = info
                if best is not None and best.gain > max(p.gamma, MIN_GAIN):
                    chosen.append((k, nid, best))
            timing.add("split_search", time.perf_counter() - t0)
            parent_hist = {(k, nid): hist[(k, nid)] for k, nid, _ in chosen}
            t0 = time.perf_counter()
            results = {}
            for si, s in enumerate(self.sources):
                mine = [(k, nid, b) for k, nid, b in chosen if b.source_idx == si]
                if not mine:
                    continue
                out = s.split(r, np.array([k for k, _, _ in mine], dtype=np.int32),
                              np.array([nid for _, nid, _ in mine], dtype=np.int32),
                              np.array([b.feature_idx for _, _, b in mine], dtype=np.int32),
                              np.array([b.bin_idx for _, _, b in mine], dtype=np.int32),
                              np.array([b.default_left for _, _, b in mine], dtype=bool),
                              assignment)
                results.update({(k, nid): res for (k, nid, _), res in zip(mine, out)})
            new_frontier = []
            for k, nid, best in chosen:       # children numbered breadth-first, whoever owns the split
                ref, go_left = results[(k, nid)]
                new_frontier.extend(self._apply(trees[k], k, nid, best, ref, go_left, assignment, gq, hq))
            timing.add("apply_splits", time.perf_counter() - t0)
            frontier = sorted(new_frontier)
        leaf_pos = leaf_positions(assignment)
        for k, tree in enumerate(trees):
            for node in tree.nodes:
                if node.is_leaf:
                    node.value = float(-node.sum_gradients / (node.sum_hessians + p.reg_lambda)
                                       * p.learning_rate)
        return trees, leaf_pos

    @staticmethod
    def _apply(tree, k, nid, best, ref: SplitRef, go_left, assignment, gq, hq):
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
        node.gain = best.gain
        children = []
        for child_rows in (left_rows, right_rows):
            child_rows = child_rows[assignment[k, child_rows] >= 0]     # sampled rows only
            child = tree.add(Node(len(tree.nodes), node.depth + 1, parent=nid,
                                  sum_gradients=float(gq[child_rows, k].sum()),
                                  sum_hessians=float(hq[child_rows, k].sum()),
                                  n_samples=int(child_rows.size)))
            children.append(child)
        node.left, node.right = children[0].node_id, children[1].node_id
        for child_id, child_rows in ((node.right, right_rows), (node.left, left_rows)):
            sampled = assignment[k, child_rows] >= 0
            assignment[k, child_rows] = np.where(sampled, child_id, riding(child_id))
        return [(k, node.left), (k, node.right)]
