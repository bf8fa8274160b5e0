"""A model's trees as flat arrays, to score a few rows fast (online scoring, ``vfl serve``).

Given every party's decision (goes left) at each of its own internal nodes, every row follows its
one path through every tree, all trees at once, one tree level per step; the raw score adds the
leaf values tree by tree in the model's order (a sequential sum), so the result is bit for bit
:meth:`vfl.core.model.BoostedModel.predict_raw_one_round`'s (the same decisions reach the same
leaves, and leaf masks are only another encoding of those decisions).
"""
from __future__ import annotations

import numpy as np

from datasets.errors import InputError
from vfl.core.split import goes_left


class FlatTrees:
    """The trees of ``model`` used by prediction (``model.default_rounds`` rounds)."""

    def __init__(self, model):
        self.active_party = model.active_party
        rounds = model.rounds[:model.default_rounds]
        trees = [(k, t) for rnd in rounds for k, t in enumerate(rnd)]
        self.n_trees, self.n_targets = len(trees), int(model.n_targets)
        self.base = np.asarray(model.base_score, dtype=np.float64).reshape(-1)
        sizes = [len(t.nodes) for _, t in trees]
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])[:-1].astype(np.int64)
        self.target = np.array([k for k, _ in trees], dtype=np.int64)
        left, right, value, owners = [], [], [], []
        self.depth = 0
        for _, tree in trees:
            self.depth = max(self.depth, int(tree.max_depth))
            for node in tree.nodes:
                left.append(-1 if node.is_leaf else node.left)
                right.append(-1 if node.is_leaf else node.right)
                value.append(node.value if node.is_leaf else 0.0)
                owners.append(None if node.is_leaf else node.owner)
        self.left, self.right = np.array(left, dtype=np.int64), np.array(right, dtype=np.int64)
        self.value = np.array(value, dtype=np.float64)
        self.is_leaf = self.left < 0
        self.n_nodes = len(left)
        #: party -> flat indices of its internal nodes, in node order (the order of a skeleton's own nodes)
        self.nodes: dict[str, np.ndarray] = {}
        for p in dict.fromkeys(o for o in owners if o is not None):
            self.nodes[p] = np.array([i for i, o in enumerate(owners) if o == p], dtype=np.int64)
        flat = [node for _, tree in trees for node in tree.nodes]
        act = self.nodes.get(self.active_party, np.zeros(0, dtype=np.int64))
        self._act_feature = np.array([flat[i].feature_idx for i in act], dtype=np.int64)
        self._act_threshold = np.array([flat[i].threshold if flat[i].categories is None else np.nan for i in act],
                                       dtype=np.float64)
        self._act_default = np.array([bool(flat[i].default_left) for i in act], dtype=bool)
        self._act_categorical = [(j, flat[i].categories) for j, i in enumerate(act) if flat[i].categories is not None]
        self.default_left = {p: np.array([bool(flat[i].default_left) for i in idx], dtype=bool)
                             for p, idx in self.nodes.items()}

    def active_decisions(self, X: np.ndarray) -> np.ndarray:
        """``(n_rows, own nodes)``: the active party's decisions on its features ``X``."""
        X = np.asarray(X, dtype=np.float64)
        x = X[:, self._act_feature]
        go = goes_left(x, self._act_threshold, self._act_default)
        for j, cats in self._act_categorical:
            go[:, j] = goes_left(x[:, j], None, self._act_default[j], categories=cats)
        return go

    def raw(self, decisions: dict) -> np.ndarray:
        """Raw scores ``(n_rows, n_targets)`` from ``{party: (n_rows, its nodes) bool}``."""
        n = len(next(iter(decisions.values()))) if decisions else 0
        D = np.zeros((n, self.n_nodes), dtype=bool)
        for p, idx in self.nodes.items():
            D[:, idx] = decisions[p]
        pos = np.zeros((n, self.n_trees), dtype=np.int64)
        rows = np.arange(n)[:, None]
        for _ in range(self.depth + 1):
            g = self.offsets + pos
            leaf = self.is_leaf[g]
            if leaf.all():
                break
            child = np.where(D[rows, g], self.left[g], self.right[g])
            pos = np.where(leaf, pos, child)
        values = self.value[self.offsets + pos]
        raw = np.empty((n, self.n_targets))
        for k in range(self.n_targets):
            cols = values[:, self.target == k]
            raw[:, k] = np.add.accumulate(np.concatenate([np.full((n, 1), self.base[k]), cols], axis=1),
                                          axis=1)[:, -1]
        return raw

    def leaf_masks(self, party: str, decisions: np.ndarray) -> np.ndarray:
        """A party's leaf masks ``(n_rows, total leaves)`` bool from its decisions ``(n_rows, its
        nodes)``: a leaf is in the mask iff the row goes the leaf path's way at every one of the
        party's nodes on that path (what :mod:`vfl.core.leafmask` encodes for one-round
        prediction). Leaves in flat order: trees concatenated, each tree's leaves by node id."""
        cols, wanted = self._leaf_literals(party)
        D = np.asarray(decisions, dtype=bool)
        n = D.shape[0]
        if D.shape != (n, len(self.nodes.get(party, ()))):
            raise InputError(f"expected {party!r}'s decisions at {len(self.nodes.get(party, ()))} nodes, "
                             f"got shape {D.shape}")
        if cols.shape[1] == 0:
            return np.ones((n, cols.shape[0]), dtype=bool)
        ext = np.concatenate([D, np.ones((n, 1), dtype=bool)], axis=1)      # last column: padding, agrees
        return (ext[:, cols] == wanted[None]).all(axis=2)

    def _leaf_literals(self, party: str) -> tuple[np.ndarray, np.ndarray]:
        """Per leaf (flat order), the party's nodes on its path as columns of its decisions and the
        path's direction there (go left), padded to the longest such path with a column that
        always agrees. Computed once per party."""
        cache = self.__dict__.setdefault("_literals", {})
        if party in cache:
            return cache[party]
        own = self.nodes.get(party, np.zeros(0, dtype=np.int64))
        col_of = {int(g): j for j, g in enumerate(own.tolist())}
        pad = len(own)
        parent: dict[int, tuple[int, bool]] = {}
        for g in np.flatnonzero(~self.is_leaf).tolist():
            t0 = int(self.offsets[np.searchsorted(self.offsets, g, side="right") - 1])
            parent[t0 + int(self.left[g])] = (g, True)
            parent[t0 + int(self.right[g])] = (g, False)
        paths = []
        for leaf in np.flatnonzero(self.is_leaf).tolist():
            lits, node = [], leaf
            while node in parent:
                node, went_left = parent[node]
                if node in col_of:
                    lits.append((col_of[node], went_left))
            paths.append(lits[::-1])
        width = max((len(p) for p in paths), default=0)
        cols = np.full((len(paths), width), pad, dtype=np.int64)
        wanted = np.ones((len(paths), width), dtype=bool)
        for i, p in enumerate(paths):
            for k, (c, w) in enumerate(p):
                cols[i, k], wanted[i, k] = c, w
        cache[party] = (cols, wanted)
        return cols, wanted
