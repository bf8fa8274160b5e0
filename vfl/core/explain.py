"""Grouped path-dependent TreeSHAP: exact Shapley values of a federated ensemble, computed by the
active party from what one-round prediction already gives it.

Players: each of the active party's features is one player; each passive party is one player
(all its features grouped). The value function is the ``tree_path_dependent`` one of Lundberg et
al. (2020): for a coalition ``S`` and a row, walk every tree from its root; at a node whose
player is in ``S`` follow the row, at any other node average the two children weighted by their
training cover (the number of training rows that reached them). ``v(S)`` is the sum over trees
of these expectations; ``v(all players)`` is the row's raw margin (less the model's base score) and
``v(empty)`` the expected margin, so ``base + sum(attributions) = margin`` exactly.

Why the active party can compute it alone: in one leaf's term of the value function, a player ``j``
on the leaf's path enters only through two numbers, its *zero fraction* ``z_j`` (the product of
the cover fractions of its nodes on the path: a model constant) and its *one fraction* ``o_j`` (1 when
the row takes the path's direction at every one of ``j``'s nodes on it, else 0). For a passive
party, ``o_j`` over all leaves is exactly the leaf mask it sends for one-round prediction
(:mod:`vfl.core.leafmask`: a leaf is in the mask iff the row agrees with the party at every one of
its nodes above the leaf). So explanations need no message beyond prediction's.

The Shapley value of player ``i`` in a leaf's term with ``m`` players on its path is
``v_leaf * (o_i - z_i) * sum_k c_k * k! (m-k-1)! / m!`` where ``c_k`` is the ``t^k`` coefficient of
``prod_{j != i} (z_j + o_j t)``. Since each ``o_j`` is 0 or 1, a leaf with ``m`` players has only
``2^m`` row patterns: the values of every pattern are tabulated once per model (:class:`ShapPlan`), and
explaining rows is a table look-up per (row, leaf): vectorised over rows with numpy.
:func:`naive_shapley` is the brute-force twin (every coalition of the same value function).
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from datasets.errors import InputError
from vfl.core.files import write_bytes_atomic
from vfl.core.flat_trees import FlatTrees
from vfl.core.model import BoostedModel, OneRound
from vfl.core.tree import Tree

#: leaves with at most this many players on their path use the pattern table (2^m rows)
TABLE_PLAYERS = 8
#: rows explained per block (bounds the working memory: rows x path entries of the ensemble)
BLOCK_ROWS = 256


# --------------------------------------------------------------------------- the result
@dataclass
class Explanation:
    """Attributions of ``n`` rows: ``values[row, target, player]``; ``base[target]`` the expected
    margin; ``margin[row, target]`` the raw margin prediction computed (``base + values.sum(-1)``
    equals it up to float rounding)."""
    players: list[str]
    base: np.ndarray          # (n_targets,)
    values: np.ndarray        # (n, n_targets, n_players)
    margin: np.ndarray        # (n, n_targets)
    active_players: int = 0   # the first this many players are the active party's features
    active_values: np.ndarray | None = None     # (n, active_players): the rows' own feature values (plots)
    feature_splits: dict | None = None          # {passive party: rows whose value it split among its features}

    @property
    def n_rows(self) -> int:
        return self.values.shape[0]

    def additivity_error(self) -> float:
        """``max |base + sum(values) - margin|`` over rows and targets."""
        if not self.values.size:
            return 0.0
        return float(np.max(np.abs(self.base[None, :] + self.values.sum(axis=2) - self.margin)))

    def mean_abs(self, target: int = 0) -> dict[str, float]:
        """The global view: mean |attribution| per player (one target), largest first."""
        m = np.abs(self.values[:, target, :]).mean(axis=0) if self.n_rows else np.zeros(len(self.players))
        order = np.argsort(-m, kind="stable")
        return {self.players[i]: float(m[i]) for i in order}

    def concat(self, other: "Explanation") -> "Explanation":
        if other.players != self.players or not np.array_equal(other.base, self.base):
            raise InputError("cannot join explanations of different models")
        both = self.active_values is not None and other.active_values is not None
        splits = None
        if self.feature_splits is not None or other.feature_splits is not None:
            splits = dict(self.feature_splits or {})
            for p, k in (other.feature_splits or {}).items():
                splits[p] = splits.get(p, 0) + k
        return Explanation(self.players, self.base, np.concatenate([self.values, other.values]),
                           np.concatenate([self.margin, other.margin]), self.active_players,
                           np.concatenate([self.active_values, other.active_values]) if both else None, splits)

    def summary(self, classes=None) -> dict:
        """The global view, JSON-ready: ``{"n_rows", "base", "mean_abs": {target: {player: mean
        |value|}}}`` (targets named by ``classes`` for a multiclass model, else "margin")."""
        K = self.values.shape[1]
        names = [str(classes[k]) if classes is not None else str(k) for k in range(K)] if K > 1 else ["margin"]
        return {"n_rows": int(self.n_rows), "base": {names[k]: float(self.base[k]) for k in range(K)},
                "mean_abs": {names[k]: self.mean_abs(k) for k in range(K)}}


def reason_codes(values: np.ndarray, players: list[str], k: int, sign: float = 1.0) -> list[list[tuple[str, float]]]:
    """Per row, the (at most) ``k`` players that pushed the score most towards the adverse side,
    with their signed values, strongest first.

    ``values``: ``(n, n_players)`` attributions of one target; ``sign``: +1 when a larger margin
    is adverse (the positive class of a binary model: default, fraud), -1 when a smaller one is.
    Players with no push that way (``sign * value <= 0``) are never reasons, so a row may have
    fewer than ``k``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"the number of reason codes must be a positive integer, got {k!r}")
    if sign not in (1, -1, 1.0, -1.0):
        raise InputError(f"sign must be +1 or -1, got {sign!r}")
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] != len(players):
        raise InputError(f"reason codes need (rows, {len(players)} players) attributions, got shape {v.shape}")
    push = v * sign
    k = min(int(k), len(players))
    order = np.argsort(-push, axis=1, kind="stable")[:, :k]
    out = []
    for r in range(v.shape[0]):
        out.append([(players[j], float(v[r, j])) for j in order[r] if push[r, j] > 0])
    return out


ADVERSE = ("high", "low")
_RESERVED = ("id", "class", "base", "margin")


def player_columns(players: list[str], n_active: int, id_col: str = "id") -> list[str]:
    """Column names of the players in a table: the names themselves, except that a passive
    party whose name is also a feature's (or a reserved column's) becomes ``party:NAME`` and a
    feature named like a reserved column ``feature:NAME``."""
    reserved = set(_RESERVED) | {id_col}
    active = set(players[:n_active])
    cols = []
    for i, p in enumerate(players):
        if i < n_active:
            cols.append(f"feature:{p}" if p in reserved or p.startswith("reason_") else p)
        else:
            cols.append(f"party:{p}" if p in reserved or p in active or p.startswith("reason_") else p)
    return cols


def explanation_table(ex: Explanation, ids, id_col: str = "id", classes=None, top: int | None = None,
                      adverse: str = "high") -> pd.DataFrame:
    """The explanation as a table, one line per row (multiclass: per row and class, with a
    ``class`` column): ``id``, ``base``, one column per player, ``margin`` (the raw score:
    ``base`` + the players' values), and with ``top`` K the reason codes ``reason_1`` ..
    ``reason_K`` and their signed values ``reason_1_value`` ..: the players that pushed the
    margin most towards the adverse side (``adverse="high"``: a larger margin is adverse, as for
    the positive class of a default model; "low": a smaller one; multiclass: towards the line's class)."""
    if adverse not in ADVERSE:
        raise InputError(f"adverse must be one of {ADVERSE}, got {adverse!r}")
    cols = player_columns(ex.players, ex.active_players, id_col)
    n, K = ex.n_rows, ex.values.shape[1]
    ids = np.asarray(ids)
    if len(ids) != n:
        raise InputError(f"{len(ids)} ids for {n} explained rows")
    parts = []
    for k in range(K):
        d = {id_col: ids}
        if K > 1:
            label = (classes[k] if classes is not None else k)
            d["class"] = [label] * n
        d["base"] = np.full(n, ex.base[k])
        for j, c in enumerate(cols):
            d[c] = ex.values[:, k, j]
        d["margin"] = ex.margin[:, k]
        frame = pd.DataFrame(d)
        if top is not None:
            sign = 1.0 if (adverse == "high" or K > 1) else -1.0
            codes = reason_codes(ex.values[:, k, :], cols, top, sign)
            for r in range(min(int(top), len(cols))):
                frame[f"reason_{r + 1}"] = [c[r][0] if r < len(c) else None for c in codes]
                frame[f"reason_{r + 1}_value"] = [c[r][1] if r < len(c) else np.nan for c in codes]
        parts.append(frame)
    if K == 1:
        return parts[0]
    order = np.argsort(np.tile(np.arange(n), K), kind="stable")     # row by row, classes in order
    return pd.concat(parts, ignore_index=True).iloc[order].reset_index(drop=True)


# --------------------------------------------------------------------------- cover fractions
def _fractions(tree: Tree) -> np.ndarray:
    """Per node, the share of its parent's training cover it got (root: 1). Cover: training rows
    (``n_samples``); where a split's children record none, their hessian sums; else halves."""
    frac = np.ones(len(tree.nodes))
    for nd in tree.nodes:
        if nd.is_leaf:
            continue
        a, b = tree.nodes[nd.left], tree.nodes[nd.right]
        for ca, cb in ((a.n_samples, b.n_samples), (a.sum_hessians, b.sum_hessians), (1.0, 1.0)):
            ca, cb = float(ca), float(cb)
            if ca >= 0 and cb >= 0 and ca + cb > 0 and math.isfinite(ca + cb):
                frac[nd.left], frac[nd.right] = ca / (ca + cb), cb / (ca + cb)
                break
    return frac


def _paths(tree: Tree):
    """``(leaf id, [(node id, went left), ...] root first)`` for every leaf, in node-id order."""
    out = {}
    stack = [(0, [])]
    while stack:
        nid, path = stack.pop()
        nd = tree.nodes[nid]
        if nd.is_leaf:
            out[nid] = path
            continue
        stack.append((nd.right, path + [(nid, False)]))
        stack.append((nd.left, path + [(nid, True)]))
    return [(nid, out[nid]) for nid in sorted(out)]


def _shapley_weights(m: int) -> np.ndarray:
    """``k! (m-k-1)! / m!`` for k = 0..m-1."""
    return np.array([math.factorial(k) * math.factorial(m - k - 1) / math.factorial(m) for k in range(m)])


def _leaf_phi(value: float, z: np.ndarray, o: np.ndarray) -> np.ndarray:
    """Shapley values ``(n_patterns, m)`` of one leaf's term for one-fraction patterns ``o``
    ``(n_patterns, m)`` (0/1) and zero fractions ``z`` ``(m,)``."""
    n, m = o.shape
    w = _shapley_weights(m)
    out = np.empty((n, m))
    for i in range(m):
        c = np.zeros((n, m))
        c[:, 0] = 1.0
        deg = 0
        for j in range(m):
            if j == i:
                continue
            deg += 1
            c[:, 1:deg + 1] = c[:, 1:deg + 1] * z[j] + c[:, 0:deg] * o[:, j:j + 1]
            c[:, 0] = c[:, 0] * z[j]
        out[:, i] = value * (o[:, i] - z[i]) * (c @ w)
    return out


def _outer(z: np.ndarray, o: np.ndarray) -> np.ndarray:
    """``sum_k c_k k! (M-k)! / (M+1)!`` per row, ``c_k`` the ``t^k`` coefficient of
    ``prod_j (z_j + o_j t)`` over ``M`` players (``z`` ``(M,)``, ``o`` ``(n, M)``): the Shapley
    weight of a player joining the other ``M`` players of a product game."""
    n, M = o.shape
    c = np.zeros((n, M + 1))
    c[:, 0] = 1.0
    for j in range(M):
        c[:, 1:j + 2] = c[:, 1:j + 2] * z[j] + c[:, 0:j + 1] * o[:, j:j + 1]
        c[:, 0] = c[:, 0] * z[j]
    return c @ _shapley_weights(M + 1)


def own_feature_values(weights: np.ndarray, leaf_target: np.ndarray, path_start: np.ndarray,
                       path_feature: np.ndarray, path_agree: np.ndarray, path_z: np.ndarray, n_targets: int,
                       n_features: int) -> np.ndarray:
    """A passive party's split of its grouped value among its own features (an Owen value of the
    path-dependent TreeSHAP game, features grouped by party), computed by the party itself.

    Per leaf ``l`` (of :meth:`ShapPlan.party_leaves`): ``weights[:, l]`` its group weight
    (:meth:`ShapPlan.group_weights`, from the active party), ``leaf_target[l]`` its target, and
    the party's own nodes on its path, ``path_start[l]:path_start[l + 1]`` of the path arrays:
    the feature of each node (the party's column index), whether the row takes the path's
    direction there (``path_agree`` ``(n, P)``, decided by the party on its own data) and the
    node's cover fraction ``path_z`` (the share of the node's training rows that went the path's
    way). A feature with several nodes on the path is one player (one fraction: all agree; zero
    fraction: their product). Returns ``(n, n_targets, n_features)``; over the features it adds
    up to the party's grouped value (``sum_l weights * (o_G - z_G)``)."""
    weights = np.asarray(weights, dtype=np.float64)
    n, L = weights.shape
    agree = np.asarray(path_agree, dtype=bool)
    out = np.zeros((n, int(n_targets), int(n_features)))
    for li in range(L):
        s, e = int(path_start[li]), int(path_start[li + 1])
        feats, inv = np.unique(path_feature[s:e], return_inverse=True)
        k = len(feats)
        o = np.ones((n, k), dtype=bool)
        z = np.ones(k)
        for p, f in enumerate(inv.tolist()):
            o[:, f] &= agree[:, s + p]
            z[f] *= float(path_z[s + p])
        if k <= TABLE_PLAYERS:          # the within-group Shapley split at each of the 2^k patterns
            codes = np.arange(1 << k)
            table = _leaf_phi(1.0, z, ((codes[:, None] >> np.arange(k)[None, :]) & 1).astype(np.float64))
            phi = table[(o.astype(np.int64) << np.arange(k)[None, :]).sum(axis=1)]
        else:
            phi = _leaf_phi(1.0, z, o.astype(np.float64))      # (n, k)
        out[:, int(leaf_target[li]), feats] += weights[:, li:li + 1] * phi
    return out


# --------------------------------------------------------------------------- the plan
class ShapPlan:
    """What explaining needs of an ensemble, computed once: every leaf's players, their zero
    fractions, the literals that decide their one fractions, and the pattern tables.

    ``trees``: ``[(target, Tree)]`` in prediction order; ``active_party`` and its ``n_features``
    (feature index = player index); ``passives``: the passive parties in player order (player
    ``n_features + i``). A row's *bits* are its decision at each of the active party's nodes
    (``active_nodes``: flat node indices, as one-round prediction lists them) and, per passive
    party, its leaf mask over all trees' leaves.
    """

    def __init__(self, trees: list[tuple[int, Tree]], active_party: str, n_features: int, passives: list[str],
                 n_targets: int, base_score):
        self.n_targets = int(n_targets)
        self.n_players = n_features + len(passives)
        self.n_features = n_features
        self.passives = list(passives)
        party_player = {p: n_features + i for i, p in enumerate(passives)}
        self.trees = trees
        # bit columns: [active node decisions] + per passive party [its leaf bits over all trees]
        active_cols: dict[int, int] = {}
        leaf_index: list[dict[int, int]] = []       # per tree: leaf node id -> global leaf index
        n_leaves = 0
        start = 0
        for _, tree in trees:
            for nd in tree.nodes:
                if not nd.is_leaf and nd.owner == active_party:
                    active_cols[start + nd.node_id] = len(active_cols)
            leaves = [nd.node_id for nd in tree.nodes if nd.is_leaf]
            leaf_index.append({lid: n_leaves + i for i, lid in enumerate(leaves)})
            n_leaves += len(leaves)
            start += len(tree.nodes)
        self.active_nodes = np.array(sorted(active_cols), dtype=np.int64)
        self.n_active_bits = len(active_cols)
        self.n_leaves_total = n_leaves
        passive_base = {p: self.n_active_bits + i * n_leaves for i, p in enumerate(passives)}

        base = np.asarray(base_score, dtype=np.float64).copy()
        lit_col, lit_pol, entry_start = [], [], []
        entry_leaf, entry_pos, entry_out = [], [], []
        leaves_m, leaves_value, leaves_z = [], [], []
        start = 0
        for t, (target, tree) in enumerate(trees):
            frac = _fractions(tree)
            for lid, path in _paths(tree):
                value = float(tree.nodes[lid].value)
                players: dict[int, list] = {}
                for nid, left in path:
                    nd = tree.nodes[nid]
                    child = nd.left if left else nd.right
                    if nd.owner == active_party:
                        player = int(nd.feature_idx)
                        lit = (active_cols[start + nid], left)
                    else:
                        if nd.owner not in party_player:
                            raise InputError(f"the model has a split of party {nd.owner!r}, not one of its "
                                             f"passive parties {passives}")
                        player = party_player[nd.owner]
                        lit = (passive_base[nd.owner] + leaf_index[t][lid], True)
                    z, lits = players.setdefault(player, [1.0, []])
                    players[player][0] = z * frac[child]
                    if lit not in lits:
                        lits.append(lit)
                zs = np.array([players[p][0] for p in players])
                base[target] += value * float(np.prod(zs)) if zs.size else value
                if not players:
                    continue
                li = len(leaves_m)
                leaves_m.append(len(players))
                leaves_value.append(value)
                leaves_z.append(zs)
                for j, (player, (_, lits)) in enumerate(players.items()):
                    entry_start.append(len(lit_col))
                    for col, pol in lits:
                        lit_col.append(col)
                        lit_pol.append(pol)
                    entry_leaf.append(li)
                    entry_pos.append(j)
                    entry_out.append(target * self.n_players + player)
            start += len(tree.nodes)
        self.base = base
        self.lit_col = np.array(lit_col, dtype=np.int64)
        self.lit_pol = np.array(lit_pol, dtype=bool)
        self.entry_start = np.array(entry_start, dtype=np.int64)
        self.entry_leaf = np.array(entry_leaf, dtype=np.int64)
        self.entry_pos = np.array(entry_pos, dtype=np.int64)
        self.leaf_m = np.array(leaves_m, dtype=np.int64)
        self.leaf_value = np.array(leaves_value, dtype=np.float64)
        self.leaf_z = leaves_z
        self.leaf_entry_start = np.concatenate([[0], np.cumsum(self.leaf_m)[:-1]]).astype(np.int64) \
            if leaves_m else np.zeros(0, dtype=np.int64)
        # accumulation: entries sorted by output column, summed with reduceat
        entry_out = np.array(entry_out, dtype=np.int64)
        self.entry_out = entry_out
        self.out_order = np.argsort(entry_out, kind="stable")
        sorted_out = entry_out[self.out_order]
        cuts = np.flatnonzero(np.r_[True, sorted_out[1:] != sorted_out[:-1]]) if sorted_out.size else np.zeros(0, int)
        self.out_starts = cuts.astype(np.int64)
        self.out_cols = sorted_out[cuts] if sorted_out.size else np.zeros(0, dtype=np.int64)
        # pattern tables of the small leaves: per entry, its value at each of the leaf's 2^m
        # patterns, contiguous from ent_base[entry]
        small = self.leaf_m <= TABLE_PLAYERS
        self.small = small
        self.entry_small = small[self.entry_leaf] if len(leaves_m) else np.zeros(0, dtype=bool)
        ent_base = np.zeros(len(self.entry_start), dtype=np.int64)
        blocks, pos = [], 0
        for li in np.flatnonzero(small):
            m = int(self.leaf_m[li])
            codes = np.arange(1 << m)
            o = ((codes[:, None] >> np.arange(m)[None, :]) & 1).astype(np.float64)
            phi = _leaf_phi(float(self.leaf_value[li]), self.leaf_z[li], o)        # (2^m, m)
            first = int(self.leaf_entry_start[li])
            for j in range(m):
                ent_base[first + j] = pos
                blocks.append(phi[:, j])
                pos += phi.shape[0]
        # (a big leaf gathers a placeholder at index 0 or 1 before its values are computed)
        self.table = np.concatenate(blocks) if blocks else np.zeros(2)
        index_type = np.int32 if pos < 2 ** 31 - 256 else np.int64
        self.entry_shift = np.where(self.entry_small, self.entry_pos, 0).astype(np.uint8)[:, None]
        # literal columns of the transposed bit matrix: [go left; go right; passive leaf bits]
        nA = self.n_active_bits
        col = self.lit_col
        self.lit_ext = np.where(col < nA, np.where(self.lit_pol, col, col + nA), col + nA).astype(np.int64)
        # the value stage runs over the entries sorted by output column
        self.v_leaf = self.entry_leaf[self.out_order]
        self.v_base = ent_base[self.out_order].astype(index_type)[:, None]
        where = np.empty(len(self.out_order), dtype=np.int64)
        where[self.out_order] = np.arange(len(self.out_order))
        # the gathers of _block: per k >= 1, the entries with a k-th literal and that literal's
        # column; per j >= 1, the small leaves with a j-th entry, that entry and its bit
        n_lits = np.diff(np.r_[self.entry_start, len(self.lit_ext)])
        self.more_literals = [(sel, self.lit_ext[self.entry_start[sel] + k])
                              for k in range(1, int(n_lits.max(initial=1)))
                              for sel in [np.flatnonzero(n_lits > k)]]
        m_small = np.where(small, self.leaf_m, 1)
        self.more_entries = [(sel, self.leaf_entry_start[sel] + j, np.uint8(j))
                             for j in range(1, int(m_small.max(initial=1)))
                             for sel in [np.flatnonzero(m_small > j)]]
        self.big_leaves = [(int(li), where[int(self.leaf_entry_start[li]):int(self.leaf_entry_start[li])
                                              + int(self.leaf_m[li])]) for li in np.flatnonzero(~small)]

    # ------------------------------------------------------------------ rows
    def values(self, go_left: np.ndarray, leaf_bits: dict[str, np.ndarray]) -> np.ndarray:
        """Attributions ``(n, n_targets, n_players)`` of rows given the active party's decisions at
        its nodes ``go_left`` ``(n, len(active_nodes))`` and each passive party's unpacked leaf
        bits ``(n, total leaves)`` (a party that owns no split may be left out)."""
        go_left = np.asarray(go_left, dtype=bool)
        n = go_left.shape[0]
        if go_left.shape != (n, self.n_active_bits):
            raise InputError(f"expected the decisions at {self.n_active_bits} nodes, got shape {go_left.shape}")
        out = np.zeros((n, self.n_targets * self.n_players))
        if not self.entry_start.size:
            return out.reshape(n, self.n_targets, self.n_players)
        for s in range(0, n, BLOCK_ROWS):
            e = min(n, s + BLOCK_ROWS)
            out[s:e] = self._block(self._bits(go_left, leaf_bits, s, e))
        return out.reshape(n, self.n_targets, self.n_players)

    def _bits(self, go_left: np.ndarray, leaf_bits: dict[str, np.ndarray], s: int, e: int) -> np.ndarray:
        """The transposed bit matrix ``(bits, e - s)`` of rows ``s:e``."""
        g = go_left[s:e].T
        parts = [g, ~g]
        for p in self.passives:
            b = leaf_bits.get(p)
            parts.append(np.ones((self.n_leaves_total, e - s), dtype=bool) if b is None
                         else np.asarray(b[s:e], dtype=bool).T)
        return np.ascontiguousarray(np.concatenate(parts, axis=0))

    def _one_fractions(self, bits_t: np.ndarray) -> np.ndarray:
        """Each entry's one fraction ``(entries, n)``: the AND of its literals (gathers of whole
        rows; numpy's reduceat over axis 0 is an order of magnitude slower here)."""
        o = bits_t[self.lit_ext[self.entry_start]]
        for sel, lit in self.more_literals:
            o[sel] &= bits_t[lit]
        return o

    # ------------------------------------------------------------------ a passive party's own features
    def party_leaves(self, party: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(entries, leaves, targets)`` of the leaves on whose path passive party ``party`` has a
        node: its entry in each, the leaf's global index (trees concatenated, leaves in node-id
        order: the leaf masks' order) and the leaf's target."""
        if party not in self.passives:
            raise InputError(f"{party!r} is not a passive party of the model ({self.passives})")
        i = self.passives.index(party)
        player = self.n_features + i
        ent = np.flatnonzero(self.entry_out % self.n_players == player)
        leaves = self.lit_col[self.entry_start[ent]] - (self.n_active_bits + i * self.n_leaves_total)
        return ent, leaves.astype(np.int64), (self.entry_out[ent] // self.n_players).astype(np.int64)

    def group_weights(self, go_left: np.ndarray, leaf_bits: dict[str, np.ndarray], party: str) -> np.ndarray:
        """What passive party ``party`` needs to split its grouped value among its own features:
        per row and per leaf of :meth:`party_leaves`, the leaf's *group weight*
        ``w = v_leaf * sum_k c_k k! (m-k-1)! / m!`` (``c_k``: the ``t^k`` coefficient of the
        product over the leaf's *other* players of ``z_j + o_j t``). The party's grouped value in
        the leaf's term is ``w * (o_G - z_G)``; within the group the term is the product game
        ``prod_f (f present ? o_f : z_f)`` of its features, whose Shapley split is
        :func:`own_feature_values` (an Owen value: the features' values add up to the group's).
        Returns ``(n, len(leaves))``."""
        go_left = np.asarray(go_left, dtype=bool)
        n = go_left.shape[0]
        ent, _, _ = self.party_leaves(party)
        out = np.zeros((n, len(ent)))
        if not len(ent):
            return out
        step = BLOCK_ROWS * 16           # a Python step per leaf: larger blocks (entries x rows bools)
        for s in range(0, n, step):
            e = min(n, s + step)
            o = self._one_fractions(self._bits(go_left, leaf_bits, s, e))
            for c, en in enumerate(ent.tolist()):
                li = int(self.entry_leaf[en])
                first, m = int(self.leaf_entry_start[li]), int(self.leaf_m[li])
                others = [first + j for j in range(m) if first + j != en]
                z = self.leaf_z[li][[j - first for j in others]]
                if len(others) <= TABLE_PLAYERS:          # the 2^(m-1) patterns, then a look-up per row
                    table = self._outer_table(li, en, z)
                    code = np.zeros(e - s, dtype=np.int64)
                    for b, j in enumerate(others):
                        code |= o[j].astype(np.int64) << b
                    out[s:e, c] = table[code]
                else:
                    out[s:e, c] = self.leaf_value[li] * _outer(z, o[others].T.astype(np.float64))
        return out

    def _outer_table(self, li: int, en: int, z: np.ndarray) -> np.ndarray:
        """Leaf ``li``'s group weight for entry ``en`` at every pattern of the other players."""
        cache = self.__dict__.setdefault("_outer_tables", {})
        table = cache.get(en)
        if table is None:
            M = len(z)
            codes = np.arange(1 << M)
            pats = ((codes[:, None] >> np.arange(M)[None, :]) & 1).astype(np.float64)
            table = cache[en] = self.leaf_value[li] * _outer(z, pats)
        return table

    def _block(self, bits_t: np.ndarray) -> np.ndarray:
        """Values ``(n, targets * players)`` from the transposed bit matrix ``(bits, n)``: every
        step works on contiguous rows of the block's rows."""
        n = bits_t.shape[1]
        o = self._one_fractions(bits_t)                                     # (entries, n)
        # each small leaf's pattern code: its entries' one fractions as bits
        codes = o[self.leaf_entry_start].view(np.uint8).copy()              # (leaves, n)
        for sel, ent, shift in self.more_entries:
            codes[sel] |= o[ent].view(np.uint8) << shift
        vals = self.table[self.v_base + codes[self.v_leaf]]                 # (entries by output, n)
        for li, rows in self.big_leaves:
            s, m = int(self.leaf_entry_start[li]), int(self.leaf_m[li])
            vals[rows] = _leaf_phi(float(self.leaf_value[li]), self.leaf_z[li], o[s:s + m].T.astype(np.float64)).T
        out = np.zeros((n, self.n_targets * self.n_players))
        bounds = np.r_[self.out_starts, len(vals)]
        for c, col in enumerate(self.out_cols.tolist()):
            out[:, col] = vals[bounds[c]:bounds[c + 1]].sum(axis=0)
        return out


def unpack_leaf_bits(masks: np.ndarray, skeleton) -> np.ndarray:
    """A party's packed leaf masks as ``(n, total leaves)`` bools, trees concatenated."""
    nl, nb = skeleton.n_leaves(), skeleton.mask_bytes()
    parts, start = [], 0
    for t in range(skeleton.n_trees):
        parts.append(np.unpackbits(masks[:, start:start + int(nb[t])], axis=1, count=int(nl[t])).astype(bool))
        start += int(nb[t])
    return np.concatenate(parts, axis=1) if parts else np.zeros((masks.shape[0], 0), dtype=bool)


# --------------------------------------------------------------------------- a model's explanations
def players_of(model: BoostedModel) -> list[str]:
    """The players' names: the active party's features, then the passive parties."""
    return list(model.active_features) + list(model.passives)


def plan_for(model: BoostedModel, n_rounds: int | None = None) -> ShapPlan:
    """The model's :class:`ShapPlan` for its first ``n_rounds`` rounds (default: the prediction
    default), kept on the model object for the next batch."""
    n = model.default_rounds if n_rounds is None else n_rounds
    key = (n, model.n_rounds, id(model.rounds))
    cache = model.__dict__.setdefault("_shap_plans", {})
    plan = cache.get(key)
    if plan is None:
        cache.clear()
        plan = cache[key] = ShapPlan(model._flat_trees(n), model.active_party, len(model.active_features),
                                     list(model.passives), model.n_targets, model.base_score)
    return plan


def explain_one_round(model: BoostedModel, one: OneRound, n_rounds: int | None = None) -> Explanation:
    """The explanation of the rows one-round prediction gathered ``one`` for (same ``n_rounds``)."""
    plan = plan_for(model, n_rounds)
    if not np.array_equal(plan.active_nodes, one.own_nodes):
        raise InputError("the prediction and the explanation do not use the same trees")
    leaf_bits = {p: unpack_leaf_bits(masks, one.skeleton) for p, masks in one.masks.items()}
    values = plan.values(one.go_left, leaf_bits)
    return Explanation(players_of(model), plan.base.copy(), values, one.raw, len(model.active_features))


@dataclass
class FeatureSplitInput:
    """What the active party sends passive party ``party`` so that it can split its grouped value
    among its own features (opt-in, :func:`own_feature_values`): per leaf under one of its nodes,
    the leaf's target and the party's own nodes on the leaf's path (its record ids, the path's
    direction there, the node's cover fraction), and per explained row the leaf's group weight.
    No leaf value, no threshold, no node of another party appears as such; the weights are the
    leaves' values times a factor set by the other players (see docs/threat-model.md)."""
    party: str
    leaf_target: np.ndarray     # int64 (L,)
    path_start: np.ndarray      # int64 (L + 1,)
    path_record: np.ndarray     # int64 (P,): the party's record ids
    path_left: np.ndarray       # bool (P,): the path goes left there
    path_z: np.ndarray          # float64 (P,): cover fraction of the path's child
    weights: np.ndarray         # float64 (n, L)


def _party_paths(plan: ShapPlan, party: str):
    """Per global leaf index, the party's nodes on its path: ``[(record id, left, z)]``."""
    cache = plan.__dict__.setdefault("_party_paths", {})
    if party not in cache:
        paths, g = {}, 0
        for _, tree in plan.trees:
            frac = _fractions(tree)
            for lid, path in _paths(tree):
                own = []
                for nid, left in path:
                    nd = tree.nodes[nid]
                    if nd.owner == party:
                        own.append((int(nd.record_id), bool(left), float(frac[nd.left if left else nd.right])))
                paths[g] = own
                g += 1
        cache[party] = paths
    return cache[party]


def feature_split_input(model: BoostedModel, one: OneRound, party: str,
                        n_rounds: int | None = None) -> FeatureSplitInput:
    """The :class:`FeatureSplitInput` for passive party ``party`` of the rows one-round
    prediction gathered ``one`` for (same ``n_rounds``)."""
    plan = plan_for(model, n_rounds)
    if not np.array_equal(plan.active_nodes, one.own_nodes):
        raise InputError("the prediction and the explanation do not use the same trees")
    _, leaves, targets = plan.party_leaves(party)
    leaf_bits = {p: unpack_leaf_bits(masks, one.skeleton) for p, masks in one.masks.items()}
    paths = _party_paths(plan, party)
    rec, left, z, start = [], [], [], [0]
    for g in leaves.tolist():
        for r, lf, zz in paths[g]:
            rec.append(r)
            left.append(lf)
            z.append(zz)
        start.append(len(rec))
    return FeatureSplitInput(party, targets, np.array(start, dtype=np.int64), np.array(rec, dtype=np.int64),
                             np.array(left, dtype=bool), np.array(z, dtype=np.float64),
                             plan.group_weights(one.go_left, leaf_bits, party))


def summary_plot(ex: Explanation, path, target: int = 0, max_players: int = 20, title: str | None = None,
                 target_name: str | None = None, mode: int | None = None) -> None:
    """A beeswarm-style summary: one line per player (largest mean |attribution| on top), one dot
    per row at its attribution, jittered by density; an active feature's dots coloured by the
    row's value of it (low blue, high red; missing grey), a passive party's grey (its values
    stay with it). Written to ``path`` (PNG, SVG or PDF by extension; file permissions ``mode``,
    the writer's private default when None). Needs matplotlib (extra ``plot``)."""
    try:
        import matplotlib  # noqa: PLC0415 (optional extra [plot])
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise InputError("the summary plot needs matplotlib: pip install 'vfl-boost[plot]'") from None
    vals = ex.values[:, target, :]
    order = list(ex.mean_abs(target))[:max_players]
    index = {p: i for i, p in enumerate(ex.players)}
    rng = np.random.default_rng(0)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(order) + 1.6))
    cmap = plt.get_cmap("coolwarm")
    for row, name in enumerate(reversed(order)):
        j = index[name]
        v = vals[:, j]
        if v.size:
            hist, edges = np.histogram(v, bins=50)
            dens = hist[np.clip(np.searchsorted(edges, v, side="right") - 1, 0, len(hist) - 1)]
            jitter = (rng.random(v.size) - 0.5) * 0.8 * dens / max(hist.max(), 1)
        else:
            jitter = v
        colour = np.full((v.size, 4), (0.6, 0.6, 0.6, 0.7))
        if j < ex.active_players and ex.active_values is not None:
            x = ex.active_values[:, j]
            ok = ~np.isnan(x)
            if ok.any():
                ranks = np.argsort(np.argsort(x[ok], kind="stable"), kind="stable")
                colour[ok] = cmap(ranks / max(ok.sum() - 1, 1))
        ax.scatter(v, row + jitter, c=colour, s=6, linewidths=0, rasterized=True)
    ax.axvline(0.0, color="black", lw=0.6)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([f"{p} (party)" if index[p] >= ex.active_players else p for p in reversed(order)])
    what = f" ({target_name})" if target_name else ""
    ax.set_xlabel(f"attribution to the raw score{what}: TreeSHAP, path-dependent")
    ax.set_title(title or f"Explanations of {ex.n_rows} rows: players by mean |attribution|")
    sm = plt.cm.ScalarMappable(cmap=cmap)
    bar = fig.colorbar(sm, ax=ax, ticks=[0, 1], pad=0.01)
    bar.ax.set_yticklabels(["low", "high"])
    bar.set_label("active feature value (passive parties: grey)")
    fig.tight_layout()
    buf = io.BytesIO()              # rendered in memory, written by the one atomic writer
    fig.savefig(buf, dpi=110, format=Path(path).suffix.lstrip(".").lower() or "png")
    plt.close(fig)
    if mode is None:
        write_bytes_atomic(path, buf.getvalue())
    else:
        write_bytes_atomic(path, buf.getvalue(), mode)


def explain_margins(model: BoostedModel, X_active: np.ndarray, fetch_masks, n_rounds: int | None = None) -> Explanation:
    """Explain rows: one-round prediction (``fetch_masks(owner, skeleton)`` as in
    :meth:`BoostedModel.one_round`: the passive parties answer exactly a prediction request), then
    the grouped TreeSHAP values from the masks it gathered."""
    return explain_one_round(model, model.one_round(X_active, fetch_masks, n_rounds), n_rounds)


def explain_decisions(model: BoostedModel, trees: FlatTrees, decisions: dict, raw: np.ndarray) -> Explanation:
    """The explanation of rows scored online (``vfl serve``) from what scoring gathered: every
    party's decisions at its own nodes ``{party: (n, its nodes) bool}`` (:class:`FlatTrees`
    order; a passive party's as it answered them, or its default directions where it could not)
    and the raw scores ``raw`` computed from them. A passive party's leaf masks are derived from
    its decisions (:meth:`FlatTrees.leaf_masks`), so nothing beyond scoring's messages is needed
    and the values are those of :func:`explain_one_round` for the same decisions."""
    plan = plan_for(model)
    act = trees.nodes.get(model.active_party, np.zeros(0, dtype=np.int64))
    if not np.array_equal(plan.active_nodes, act):
        raise InputError("the scoring and the explanation do not use the same trees")
    raw = np.asarray(raw, dtype=np.float64)
    n = raw.shape[0]
    go_left = decisions.get(model.active_party, np.zeros((n, 0), dtype=bool)) if act.size else np.zeros((n, 0), bool)
    leaf_bits = {p: trees.leaf_masks(p, decisions[p]) for p in model.passives if p in trees.nodes}
    values = plan.values(go_left, leaf_bits)
    return Explanation(players_of(model), plan.base.copy(), values, raw, len(model.active_features))


def reason_records(ex: Explanation, top: int, adverse: str = "high", classes=None, id_col: str = "id") -> list:
    """Per row, JSON-ready reason codes (``vfl serve``'s ``reasons``): the ``top`` players that
    pushed the margin most towards the adverse side, strongest first, each ``{"player": column
    name as in :func:`explanation_table`, "kind": "feature" | "party", "value": signed value}``.
    Binary and regression: a list per row; multiclass: ``{class: list}`` per row (towards each
    class). The same players and values as :func:`explanation_table`'s ``reason_*`` columns."""
    if adverse not in ADVERSE:
        raise InputError(f"adverse must be one of {ADVERSE}, got {adverse!r}")
    cols = player_columns(ex.players, ex.active_players, id_col)
    kind = {c: ("feature" if j < ex.active_players else "party") for j, c in enumerate(cols)}
    K = ex.values.shape[1]
    per_target = []
    for k in range(K):
        sign = 1.0 if (adverse == "high" or K > 1) else -1.0
        codes = reason_codes(ex.values[:, k, :], cols, top, sign)
        per_target.append([[{"player": c, "kind": kind[c], "value": v} for c, v in row] for row in codes])
    if K == 1:
        return per_target[0]
    names = [str(classes[k]) if classes is not None else str(k) for k in range(K)]
    return [{names[k]: per_target[k][r] for k in range(K)} for r in range(ex.n_rows)]


# --------------------------------------------------------------------------- the naive twin
def _naive_value(trees, player_of, decide, base_score, n_rows: int, S: frozenset) -> np.ndarray:
    """The path-dependent value function ``v(S)`` ``(n_rows, K)`` (the base score included)."""
    v = np.tile(np.asarray(base_score, dtype=np.float64), (n_rows, 1))
    for t, (k, tree) in enumerate(trees):
        frac = _fractions(tree)
        w = {0: np.ones(n_rows)}
        for nd in tree.nodes:           # children come after parents
            wn = w.pop(nd.node_id)
            if nd.is_leaf:
                v[:, k] += wn * nd.value
                continue
            if player_of(nd) in S:
                g = np.asarray(decide(t, nd), dtype=bool)
                w[nd.left], w[nd.right] = wn * g, wn * ~g
            else:
                w[nd.left], w[nd.right] = wn * frac[nd.left], wn * frac[nd.right]
    return v


def naive_shapley(trees: list[tuple[int, Tree]], player_of, decide, n_players: int, n_targets: int,
                  base_score, n_rows: int):
    """Brute force: the same players' Shapley values by enumerating every coalition of the
    path-dependent value function. ``player_of(node) -> player index``; ``decide(tree index,
    node) -> (n_rows,) bool`` (go left), for every internal node. Returns ``(base (K,), values
    (n, K, P))``. Exponential in the number of players: small models only (tests)."""
    players = list(range(n_players))
    cache = {}
    for size in range(n_players + 1):
        for S in combinations(players, size):
            cache[frozenset(S)] = _naive_value(trees, player_of, decide, base_score, n_rows, frozenset(S))
    phi = np.zeros((n_rows, n_targets, n_players))
    for i in players:
        others = [p for p in players if p != i]
        for size in range(n_players):
            w = math.factorial(size) * math.factorial(n_players - size - 1) / math.factorial(n_players)
            for S in combinations(others, size):
                S = frozenset(S)
                phi[:, :, i] += w * (cache[S | {i}] - cache[S])
    return cache[frozenset()][0], phi


def naive_owen(trees: list[tuple[int, Tree]], feature_of, groups: list[list[int]], decide, n_targets: int,
               base_score, n_rows: int) -> np.ndarray:
    """Brute force: the Owen value of every feature (``feature_of(node) -> feature index``) under
    the coalition structure ``groups`` (a partition of the features: an active feature alone, a
    passive party's features together) of the same value function, by enumerating every
    coalition of groups and every sub-coalition of the feature's own group. Returns ``(n, K,
    n_features)``. Small models only (tests)."""
    n_features = sum(len(g) for g in groups)
    cache: dict = {}

    def v(S):
        if S not in cache:
            cache[S] = _naive_value(trees, feature_of, decide, base_score, n_rows, S)
        return cache[S]

    phi = np.zeros((n_rows, n_targets, n_features))
    G = len(groups)
    for gi, group in enumerate(groups):
        other_groups = [h for h in range(G) if h != gi]
        for f in group:
            mates = [x for x in group if x != f]
            for r in range(G):
                wr = math.factorial(r) * math.factorial(G - r - 1) / math.factorial(G)
                for R in combinations(other_groups, r):
                    outside = frozenset(x for h in R for x in groups[h])
                    for t in range(len(group)):
                        wt = math.factorial(t) * math.factorial(len(group) - t - 1) / math.factorial(len(group))
                        for T in combinations(mates, t):
                            S = outside | frozenset(T)
                            phi[:, :, f] += wr * wt * (v(S | {f}) - v(S))
    return phi
