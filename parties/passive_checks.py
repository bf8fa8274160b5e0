"""The passive party holds every training request to the protocol (issue 22, Build 3).

A passive party answers histogram requests over its own bins; an active party free to name any
node assignment could read every row's bin (one row per node). :class:`TrainingProtocol` tracks
the trees the passive party is helping grow and refuses, naming the rule, a request that an
honest active party (:class:`vfl.core.grower.TreeGrower`) never sends:

* ``round bound``: rounds are numbered upwards, below the ``n_rounds`` agreed at setup;
* ``requests per round``: at most ``max_depth`` histogram requests per round (one per level), so
  at most trees x depth in a training;
* ``fixed sample``: within a round, the trees, the rows outside every node and the rows in each
  tree's sample stay as the round's first request gave them; the first request puts every row at
  the root;
* ``refinement``: each request's node assignment refines the previous one: the rows of a node
  either all stay there or are split between at most two new nodes (ids not used before in the
  tree), and only a node that could be split (one created by the previous level's splits) is
  split, never deeper than ``max_depth``;
* ``own split``: a node this party split is divided exactly as it answered (the rows it sent
  left at one child, the others at the other);
* ``splittable nodes``: a histogram is asked only for nodes of the level being grown, each at
  most once, at most one per sibling pair (the other is the parent's minus this one);
* ``min_node_rows``: no histogram of a node holding fewer (sampled) rows than agreed at setup
  (a node without rows tells nothing and is allowed: a DP released model grows them); and every
  split this party answers, and every division of a node by the active party's own splits, leaves
  both children with at least that many (sampled) rows (issue 31: "parent minus a one-row child");
  in a training of shuffled candidates a child without rows is refused too;
* ``active-only rounds``: no gradients before the round the setup agreed the passive parties join at
  (``TrainSetup.active_only_rounds``);
* split requests name only nodes of the level being grown.

With shuffled candidates (:mod:`parties.passive_splits`) both children of a node may be asked for:
this party derives one from the parent itself, and the active party sees no per-bin sums.

A refusal ends the training: every later training request is refused too (the server drops the
session). The protocol does not stop what an honest-looking sequence reveals (see
docs/security.md: the difference of a parent's and a child's histogram, the splits the active
party chooses on its own features).
"""
from __future__ import annotations

import numpy as np

from datasets.errors import ProtocolError
from vfl.core.sampling import leaf_positions


class _Tree:
    """One tree of the round: every row's node, the nodes used, their depth, the level's nodes."""

    def __init__(self, pos: np.ndarray, sampled: np.ndarray):
        self.pos = pos                        # node of every row (-1: outside every node)
        self.sampled = sampled                # rows in the tree's sample (assignment >= 0)
        self.depth = {0: 0}
        self.used = {0}
        self.level = {0}                      # nodes the next splits may divide
        self.parent: dict[int, int] = {}      # node -> parent (nodes with rows)
        self.asked: set[int] = set()
        self.own: dict[int, np.ndarray] = {}  # node -> bool go-left of its rows, for this party's splits


class TrainingProtocol:
    """What a passive party allows in one training (see the module docstring)."""

    def __init__(self, party: str, n_rounds: int, max_depth: int, min_node_rows: int, candidates: bool = False,
                 first_round: int = 0):
        self.party = party
        self.candidates = bool(candidates)
        self.first_round = int(first_round)
        self.n_rounds, self.max_depth, self.min_node_rows = int(n_rounds), int(max_depth), int(min_node_rows)
        self.round: int | None = None
        self.requests = 0            # histogram requests of the current round
        self.total_requests = 0
        self.trees: list[_Tree] = []
        self.refused: str | None = None

    # -- refusals -------------------------------------------------------------
    def _refuse(self, what: str, rule: str, detail: str):
        self.refused = f"rule {rule!r}: {detail}"
        raise ProtocolError(f"party {self.party!r} refuses {what}: {self.refused}; the training ends")

    def refuse(self, what: str, rule: str, detail: str):
        """Refuse a request under another module's rule (e.g. ``shuffled candidates``): the training ends."""
        self._refuse(what, rule, detail)

    def check_open(self, what: str) -> None:
        if self.refused is not None:
            raise ProtocolError(f"party {self.party!r} refuses {what}: the training ended after a refused "
                                f"request ({self.refused})")

    def check_round_open(self, what: str, round_idx: int) -> None:
        """Rounds before ``first_round`` are the active party's own (``active-only rounds``)."""
        if round_idx < self.first_round:
            self._refuse(f"{what} of round {round_idx}", "active-only rounds",
                         f"the first {self.first_round} round(s) were agreed at setup to use the active party's "
                         "features only")

    def check_children(self, what: str, tree: int, node: int, n_left: int, n_right: int, strict: bool) -> None:
        """A split this party answers leaves both children at ``min_node_rows`` (``strict``: an empty
        child too is refused)."""
        small = min(n_left, n_right)
        if small < self.min_node_rows and (strict or small > 0):
            self._refuse(what, "min_node_rows", f"tree {tree}: the split of node {node} leaves a child of {small} "
                                                f"rows, fewer than the {self.min_node_rows} agreed at setup")

    # -- histogram requests ---------------------------------------------------
    def histogram_request(self, round_idx: int, assignment: np.ndarray, tree_idx: np.ndarray,
                          node_ids: np.ndarray) -> None:
        what = f"HistogramRequest of round {round_idx}"
        self.check_open(what)
        self.check_round_open("HistogramRequest", round_idx)
        a = np.asarray(assignment)
        if self.round != round_idx:
            if self.round is not None and round_idx <= self.round:
                self._refuse(what, "round bound", f"round {round_idx} after round {self.round}")
            if round_idx >= self.n_rounds:
                self._refuse(what, "round bound", f"round {round_idx} but {self.n_rounds} rounds were agreed at "
                                                  "setup")
            self._start_round(what, round_idx, a)
        else:
            if self.requests >= self.max_depth:
                self._refuse(what, "requests per round", f"more than {self.max_depth} histogram requests in a "
                                                         f"round (max_depth {self.max_depth} agreed at setup: at "
                                                         "most trees x depth in a training)")
            self._refine(what, a)
        self.requests += 1
        self.total_requests += 1
        self._check_nodes(what, a, np.asarray(tree_idx, dtype=np.int64), np.asarray(node_ids, dtype=np.int64))

    def _start_round(self, what: str, round_idx: int, a: np.ndarray) -> None:
        pos = leaf_positions(a)
        if np.any((pos != 0) & (pos != -1)):
            self._refuse(what, "fixed sample", "the first request of a round must put every row at the root")
        self.round, self.requests = int(round_idx), 0
        self.trees = [_Tree(pos[t].copy(), a[t] >= 0) for t in range(a.shape[0])]

    def _refine(self, what: str, a: np.ndarray) -> None:
        if a.shape[0] != len(self.trees):
            self._refuse(what, "fixed sample", f"{a.shape[0]} trees, the round's first request had {len(self.trees)}")
        for t, tree in enumerate(self.trees):
            new, old = leaf_positions(a[t]), tree.pos
            if not np.array_equal(a[t] >= 0, tree.sampled) or not np.array_equal(new == -1, old == -1):
                self._refuse(what, "fixed sample", f"tree {t}: the rows in the tree's sample (or outside every "
                                                   "node) changed within the round")
            inside = old >= 0        # (then new >= 0 too): the (old, new) node pairs, as one int64 key each
            keys = np.unique((old[inside].astype(np.int64) << 32) | new[inside].astype(np.int64))
            pairs = np.stack([keys >> 32, keys & 0xFFFFFFFF], axis=1)
            level: set[int] = set()
            fresh_parent: dict[int, int] = {}
            for v in np.unique(pairs[:, 0]).tolist():
                image = pairs[pairs[:, 0] == v, 1].tolist()
                own = tree.own.get(v)
                if image == [v]:
                    if own is not None:
                        self._refuse(what, "own split", f"tree {t}: node {v} was split by this party but its rows "
                                                        "were not divided")
                    continue
                if v not in tree.level:
                    self._refuse(what, "refinement", f"tree {t}: node {v} is divided but it is not a node of the "
                                                     "level being grown")
                if tree.depth[v] + 1 > self.max_depth:
                    self._refuse(what, "refinement", f"tree {t}: node {v} divided below max_depth "
                                                     f"{self.max_depth} agreed at setup")
                if len(image) > 2 or v in image:
                    self._refuse(what, "refinement", f"tree {t}: the rows of node {v} are spread over "
                                                     f"{len(image)} nodes (a split makes two children)")
                sampled_image = new[(old == v) & tree.sampled]
                for c in image:
                    rows_c = int(np.sum(sampled_image == c))
                    if 0 < rows_c < self.min_node_rows:
                        self._refuse(what, "min_node_rows", f"tree {t}: node {v} is divided leaving child {c} with "
                                                            f"{rows_c} rows, fewer than the {self.min_node_rows} "
                                                            "agreed at setup")
                    if c >= (1 << (self.max_depth + 1)) - 1:
                        self._refuse(what, "refinement", f"tree {t}: node id {c} is beyond a tree of depth "
                                                         f"{self.max_depth}")
                    if c in tree.used or c in fresh_parent:
                        self._refuse(what, "refinement", f"tree {t}: node {c} (from node {v}) is not a new node")
                    fresh_parent[c] = v
                if own is not None:
                    rows = np.flatnonzero(old == v)
                    got = new[rows]
                    left, right = np.unique(got[own]), np.unique(got[~own])
                    if len(left) > 1 or len(right) > 1 or (len(left) and len(right) and left[0] == right[0]):
                        self._refuse(what, "own split", f"tree {t}: node {v} is not divided as this party "
                                                        "answered its split")
            for c, v in fresh_parent.items():
                tree.depth[c] = tree.depth[v] + 1
                tree.parent[c] = v
                tree.used.add(c)
                level.add(c)
            tree.pos, tree.level, tree.own, tree.asked = new.copy(), level, {}, set()

    def _check_nodes(self, what: str, a: np.ndarray, tree_idx: np.ndarray, node_ids: np.ndarray) -> None:
        limit = (1 << (self.max_depth + 1)) - 1      # nodes of a full binary tree of depth max_depth
        sizes = {}
        for t, nid in zip(tree_idx.tolist(), node_ids.tolist()):
            tree = self.trees[t]
            if t not in sizes:      # sampled rows per node of tree t
                row = a[t]
                ids, counts = np.unique(row[row >= 0], return_counts=True)
                sizes[t] = dict(zip(ids.tolist(), counts.tolist()))
            n = int(sizes[t].get(nid, 0))
            if n == 0:       # a node without rows (a DP released model's full levels): nothing to read
                if nid in tree.used and nid not in tree.level or nid >= limit:
                    self._refuse(what, "splittable nodes", f"tree {t}: node {nid} is not a node of the level "
                                                           "being grown")
                continue
            if nid not in tree.level or nid in tree.asked:
                self._refuse(what, "splittable nodes", f"tree {t}: node {nid} is not a node of the level being "
                                                       "grown (or was asked for already)")
            if n < self.min_node_rows:
                self._refuse(what, "min_node_rows", f"tree {t}: node {nid} holds {n} rows, fewer than the "
                                                    f"{self.min_node_rows} agreed at setup")
            parent = tree.parent.get(nid)
            if not self.candidates and parent is not None and any(tree.parent.get(o) == parent for o in tree.asked):
                self._refuse(what, "splittable nodes", f"tree {t}: both children of node {parent} asked for (one "
                                                       "is the parent's histogram minus the other)")
            tree.asked.add(nid)

    # -- a request not answered (e.g. its caller's deadline passed) -------------------
    def snapshot(self) -> tuple:
        """The state before a request: :meth:`restore` it when the request is not answered (a
        retry of the same request must then pass again)."""
        trees = []
        for t in self.trees:
            c = _Tree.__new__(_Tree)
            c.pos, c.sampled, c.depth, c.used, c.level = t.pos, t.sampled, dict(t.depth), set(t.used), set(t.level)
            c.parent, c.asked, c.own = dict(t.parent), set(t.asked), dict(t.own)
            trees.append(c)
        return self.round, self.requests, self.total_requests, trees

    def restore(self, snap: tuple) -> None:
        if self.refused is None:        # a refusal stays: the training is over
            self.round, self.requests, self.total_requests, self.trees = snap

    # -- splits -------------------------------------------------------------------
    def split_request(self, round_idx: int, tree_idx, node_ids, kind: str = "SplitRequest") -> None:
        what = f"{kind} of round {round_idx}"
        self.check_open(what)
        if round_idx != self.round:
            self._refuse(what, "splittable nodes", f"round {round_idx} has no histogram request")
        for t, nid in zip(np.asarray(tree_idx, dtype=np.int64).tolist(), np.asarray(node_ids, dtype=np.int64).tolist()):
            tree = self.trees[t]
            if nid not in tree.level and not (nid not in tree.used and not np.any(tree.pos == nid)):
                self._refuse(what, "splittable nodes", f"tree {t}: node {nid} is not a node of the level being "
                                                       "grown")

    def record_split(self, tree: int, node_id: int, go_left: np.ndarray) -> None:
        """This party split ``node_id``: its rows (increasing order) go left where ``go_left``."""
        self.trees[tree].own[int(node_id)] = np.asarray(go_left, dtype=bool).copy()
