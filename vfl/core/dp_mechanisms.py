"""The DP model's mechanisms (:mod:`vfl.core.dp_model`): the exponential mechanism and Laplace,
candidate gains and halving splits, :class:`TreeMechanisms` (one tree's private choices and
leaves), Poisson row sampling and the DP base score.
"""
from __future__ import annotations

import math

import numpy as np

from vfl.core.dp_bins import dp_bounds
from vfl.core.dp_bins_file import _symexp, _symlog
from vfl.core.dp_noise import NoiseSource, SecureNoise
from vfl.core.split import SplitInfo


# --------------------------------------------------------------------------- mechanisms
def exponential_mechanism(utilities: np.ndarray, epsilon: float, sensitivity: float, noise: NoiseSource) -> int:
    """An ``epsilon``-DP choice among candidates of ``sensitivity``-bounded utilities: OpenDP's
    report-noisy-max (exponential noise of scale ``2 sensitivity / epsilon``: the exponential
    mechanism's guarantee, exact arithmetic, no float sampling gaps). ``epsilon = 0``: uniform;
    ``inf``: the argmax (first on ties)."""
    u = np.asarray(utilities, dtype=np.float64)
    if u.size == 0:
        raise ValueError("the exponential mechanism needs at least one candidate")
    if math.isinf(epsilon):
        return int(np.argmax(u))
    if epsilon <= 0:
        return int(noise.randbelow(u.size, 1)[0])
    return noise.noisy_max(u, 2.0 * sensitivity / epsilon)


def laplace(value, sensitivity: float, epsilon: float, noise: NoiseSource):
    """``value`` plus Laplace noise of scale ``sensitivity / epsilon`` (OpenDP's float-safe sampler)."""
    return noise.laplace(value, sensitivity / epsilon)


def _score(G, H, reg_lambda):
    d = H + reg_lambda
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, G * G / np.where(d > 0, d, 1.0), 0.0)


def candidate_gains(sum_gradients: np.ndarray, sum_hessians: np.ndarray, bin_offsets: np.ndarray,
                    G: float, H: float, reg_lambda: float):
    """Every split candidate of one party's flat histogram, without data-dependent filtering:
    ``(gains, feature_idx, bin_idx, default_left, GL, HL)`` (flat arrays), in the candidate order of
    :func:`vfl.core.split.find_best_split` (ordinary bins, missing right then left)."""
    offsets = np.asarray(bin_offsets, dtype=np.int64)
    nb = np.diff(offsets)
    out = [[] for _ in range(6)]
    sg = np.asarray(sum_gradients, dtype=np.float64)
    sh = np.asarray(sum_hessians, dtype=np.float64)
    parent = float(_score(np.float64(G), np.float64(H), reg_lambda))
    for f, (start, n) in enumerate(zip(offsets[:-1], nb)):
        if n < 2:
            continue
        g, h = sg[start:start + n], sh[start:start + n]
        gl, hl = np.cumsum(g[:-1]), np.cumsum(h[:-1])
        for d, (GL, HL) in enumerate(((gl[:n - 1], hl[:n - 1]), (gl[:n - 2] + g[-1], hl[:n - 2] + h[-1]))):
            gains = _score(GL, HL, reg_lambda) + _score(G - GL, H - HL, reg_lambda) - parent
            k = len(GL)
            for lst, vals in zip(out, (gains, np.full(k, f), np.arange(k), np.full(k, bool(d)), GL, HL)):
                lst.append(vals)
    if not out[0]:
        return tuple(np.empty(0) for _ in range(6))
    return tuple(np.concatenate(lst) for lst in out)


def halving_leaves(n_ordinary: int, depth: int) -> list[tuple[int, int]]:
    """The leaves of the halving tree over ``n_ordinary`` ordinary bins (what
    :meth:`TreeMechanisms._halve` grows): each node of bin range ``[lo, hi]`` splits at
    ``b = (lo + hi) // 2`` (bins ``<= b`` go left). Returns, left to right, the bins each leaf
    holds as ``(first, last)`` (``first > last``: an empty leaf); missing values go right at every
    node, so they end in the last leaf."""
    nodes = [((0, n_ordinary - 1), (0, n_ordinary - 1))]       # (nominal range, bins actually held)
    for _ in range(depth):
        nxt = []
        for (lo, hi), (a, z) in nodes:
            b = (lo + hi) // 2
            nxt.append(((lo, b), (a, min(z, b))))
            nxt.append((((b + 1, hi) if b < hi else (hi, hi)), (max(a, b + 1), z)))
        nodes = nxt
    return [held for _, held in nodes]


def halving_sums(sum_gradients: np.ndarray, sum_hessians: np.ndarray, bin_offsets: np.ndarray,
                 depth: int) -> list:
    """Per feature of one party's flat histogram, the gradient and hessian sums of the leaves of its
    halving tree of ``depth`` levels (:func:`halving_leaves`; missing values in the last leaf) as
    ``(G_leaves, H_leaves)``; None for a feature without ordinary bins."""
    offsets = np.asarray(bin_offsets, dtype=np.int64)
    sg = np.asarray(sum_gradients, dtype=np.float64)
    sh = np.asarray(sum_hessians, dtype=np.float64)
    out = []
    for start, end in zip(offsets[:-1], offsets[1:]):
        n_ordinary = int(end - start) - 1
        if n_ordinary < 1:
            out.append(None)
            continue
        g, h = sg[start:end], sh[start:end]
        cg, ch = np.concatenate([[0.0], np.cumsum(g[:-1])]), np.concatenate([[0.0], np.cumsum(h[:-1])])
        leaves = halving_leaves(n_ordinary, depth)
        GL = np.array([cg[z + 1] - cg[a] if a <= z else 0.0 for a, z in leaves])
        HL = np.array([ch[z + 1] - ch[a] if a <= z else 0.0 for a, z in leaves])
        GL[-1] += g[-1]
        HL[-1] += h[-1]
        out.append((GL, HL))
    return out


def halving_abs_gradients(sum_gradients: np.ndarray, sum_hessians: np.ndarray, bin_offsets: np.ndarray,
                          depth: int) -> np.ndarray:
    """Per feature: ``sum over the leaves of its halving tree of |G_l|`` (NaN: no ordinary bins), the
    utility of the feature choice of ``dp_trees = "selected"``: how far the feature's partition
    separates the gradients (the first-order loss decrease of a step of fixed size against each
    leaf's gradient sign). A row with ``|g| <= g*`` moves one ``|G_l|`` by at most ``g*``: sensitivity
    ``g*``, against ``4 g*^2 / h*`` for the gain (16 for binary), whose size over its sensitivity is
    ``n m^2 / 4`` against ``n |m|`` here (``m``: a leaf's mean gradient, well below 1)."""
    return np.array([np.nan if s is None else float(np.abs(s[0]).sum())
                     for s in halving_sums(sum_gradients, sum_hessians, bin_offsets, depth)])


class TreeMechanisms:
    """The grower's DP seam (:class:`vfl.core.grower.TreeGrower` ``dp=``): which nodes split (all, to
    ``max_depth``), each node's split (exponential mechanism), each leaf's weight (noisy sums),
    and what the released tree keeps (no exact statistics). ``plan``: the training's
    :class:`vfl.core.dp_model.DPModelPlan`."""

    def __init__(self, plan, reg_lambda: float, noise: NoiseSource | None = None,
                 min_child_weight: float = 0.0):
        self.plan = plan
        self.reg_lambda = float(reg_lambda)
        self.min_child_weight = float(min_child_weight)
        self._ranges: dict = {}          # cyclic halving: (round, target, node, side) -> bin range
        self._features: dict = {}        # selected trees: (round, target) -> (source, feature)
        self.noise = plan.noise if noise is None else noise       # never seeded (SecureNoise)
        self.count = {"select": 0, "split": 0, "leaf_gradient": 0, "leaf_hessian": 0}   # mechanisms run

    def tree_feature(self, bin_offsets: list, tree: tuple[int, int]) -> tuple[int, int]:
        """``dp_trees = "cyclic"``: the one ``(source, feature)`` tree ``(round, target)`` splits on,
        in turn over every party's features (a public, data-independent choice); ``"selected"``:
        the feature the exponential mechanism chose at the tree's root (:meth:`select_feature`)."""
        if self.plan.trees == "selected":
            return self._features[tuple(tree)]
        features = [(si, f) for si, off in enumerate(bin_offsets) for f in range(len(off) - 1)]
        round_idx, k = tree
        return features[(round_idx * self.plan.n_targets + k) % len(features)]

    def select_feature(self, histograms: list, bin_offsets: list) -> tuple[int, int] | None:
        """``dp_trees = "selected"``: one tree's feature, by the exponential mechanism
        (``select_epsilon``) over every party's features with utility the absolute gradient sums of
        the leaves of the feature's halving tree (:func:`halving_abs_gradients`, sensitivity ``g*``).
        None: no feature has an ordinary bin."""
        feats, gains = [], []
        for si, ((sg, sh), offsets) in enumerate(zip(histograms, bin_offsets)):
            u = halving_abs_gradients(sg, sh, offsets, self.plan.depth)
            for f, g in enumerate(u):
                if np.isfinite(g):
                    feats.append((si, f))
                    gains.append(g)
        if not feats:
            return None
        self.count["select"] += 1
        return feats[exponential_mechanism(np.array(gains), self.plan.select_epsilon, self.plan.g_star, self.noise)]

    def choose_split(self, node, histograms: list, bin_offsets: list,
                     tree: tuple[int, int] = (0, 0), nodes: list | None = None) -> SplitInfo | None:
        """One node's split over every party's candidates (None: no party has a candidate);
        ``tree``: ``(round, target)`` of the node's tree, ``nodes`` its nodes so far.

        ``dp_trees = "cyclic"`` with no split budget: no data at all, the node's range of bins of
        the tree's feature is halved (a balanced partition into equal-width bins on the symmetric
        log scale; missing values go right). ``"selected"``: the root chooses the tree's feature
        (:meth:`select_feature`), then every node halves as in cyclic trees."""
        if self.plan.trees == "selected":
            if node.parent < 0 or nodes is None:
                chosen = self.select_feature(histograms, bin_offsets)
                if chosen is None:
                    return None
                self._features[tuple(tree)] = chosen
            return self._halve(node, self._features[tuple(tree)], bin_offsets, tree, nodes)
        only = self.tree_feature(bin_offsets, tree) if self.plan.trees == "cyclic" else None
        if only is not None and self.plan.level_epsilon == 0:
            return self._halve(node, only, bin_offsets, tree, nodes)
        parts = []
        for si, ((sg, sh), offsets) in enumerate(zip(histograms, bin_offsets)):
            if only is not None and si != only[0]:
                continue
            c = candidate_gains(sg, sh, offsets, node.sum_gradients, node.sum_hessians, self.reg_lambda)
            if only is not None:
                keep = c[1] == only[1]
                c = tuple(a[keep] for a in c)
            if c[0].size:
                parts.append((si, c))
        if not parts:
            return None
        gains = np.concatenate([c[0] for _, c in parts])
        self.count["split"] += 1
        i = exponential_mechanism(gains, self.plan.level_epsilon, self.plan.gain_sensitivity, self.noise)
        for si, c in parts:
            if i < c[0].size:
                return SplitInfo(float(c[0][i]), si, int(c[1][i]), int(c[2][i]), bool(c[3][i]),
                                 float(c[4][i]), float(c[5][i]))
            i -= c[0].size
        raise AssertionError("unreachable")

    def _halve(self, node, feature: tuple[int, int], bin_offsets: list, tree: tuple[int, int],
               nodes: list | None) -> SplitInfo | None:
        si, f = feature
        n_ordinary = int(bin_offsets[si][f + 1] - bin_offsets[si][f]) - 1
        if n_ordinary < 1:
            return None
        key = (*tree, node.node_id)
        if node.parent < 0 or nodes is None:
            lo, hi = 0, n_ordinary - 1
        else:
            side = "L" if nodes[node.parent].left == node.node_id else "R"
            lo, hi = self._ranges[(*tree, node.parent, side)]
        b = (lo + hi) // 2
        self._ranges[(*key, "L")] = (lo, b)
        self._ranges[(*key, "R")] = (b + 1, hi) if b < hi else (hi, hi)
        return SplitInfo(0.0, si, f, b, False, 0.0, 0.0)

    def noisy_sums(self, G: float, H: float) -> tuple[float, float]:
        p = self.plan
        self.count["leaf_gradient"] += 1
        self.count["leaf_hessian"] += 1
        if p.mechanism == "laplace":
            return (float(laplace(G, p.g_star, p.leaf_gradients, self.noise)),
                    float(laplace(H, p.h_star, p.leaf_hessians, self.noise)))
        return (float(self.noise.gaussian(G, p.leaf_gradients)), float(self.noise.gaussian(H, p.leaf_hessians)))

    def hessian_floor(self) -> float:
        """The smallest denominator of a leaf weight: ``min_child_weight``, and the hessian of the
        rows whose gradient sum would not exceed twice the noise scale (``2 h* b / g*``, ``b`` the
        Laplace scale or the Gaussian sigma of the gradient sums): leaves that are mostly noise
        shrink towards 0. Data-independent, so post-processing."""
        p = self.plan
        b = p.g_star / p.leaf_gradients if p.mechanism == "laplace" else p.leaf_gradients
        return max(p.h_star, self.min_child_weight, 2.0 * p.h_star * b / p.g_star)

    def leaf_weight(self, node) -> float:
        """``-G~ / (max(H~, floor) + lambda)`` clipped to ``[-g*/h*, g*/h*]`` (learning rate not
        included; ``floor``: :meth:`hessian_floor`)."""
        p = self.plan
        G, H = self.noisy_sums(node.sum_gradients, node.sum_hessians)
        w = -G / (max(H, self.hessian_floor()) + self.reg_lambda)
        bound = p.g_star / p.h_star
        node.sum_gradients = node.sum_hessians = 0.0       # the model keeps the leaf value only
        return float(np.clip(w, -bound, bound))

    @staticmethod
    def release(tree) -> None:
        """Keep only what prediction needs (splits, leaf values): no gain, count or sum, exact or
        noisy (a noisy sum at full float precision is more than the leaf value releases)."""
        for node in tree.nodes:
            node.gain = 0.0
            node.n_samples = 0
            node.sum_gradients = node.sum_hessians = 0.0


class PoissonSampler:
    """Row subsampling for DP training: every row joins each tree's sample independently with
    probability ``q``, drawn from secret randomness (amplification needs a secret sample)."""

    def __init__(self, q: float, noise: NoiseSource | None = None):
        self.q = float(q)
        self.noise = SecureNoise() if noise is None else noise

    def draw(self, round_idx: int, g: np.ndarray, h: np.ndarray):
        n, K = g.shape
        if self.q >= 1.0:
            return None, None, 1.0
        return self.noise.bernoulli(self.q, (K, n)), None, 1.0


# --------------------------------------------------------------------------- the base score
def dp_base_score(objective, y: np.ndarray, epsilon: float, noise: NoiseSource) -> np.ndarray:
    """An ``epsilon``-DP base score (a row changes one count by one, or one clipped label):

    * binary: the log-odds of noisy (positives, rows) counts, ``epsilon/2`` each;
    * multiclass: the log of the noisy class counts (one histogram, ``epsilon``), as the priors;
    * regression: DP bounds of the label (:func:`dp_bounds`, ``epsilon/2``), then the noisy mean of the
      labels clipped to them (sum and count, ``epsilon/4`` each); pseudo-Huber takes it too.
    """
    y = np.asarray(y, dtype=np.float64)
    name = objective.name
    if name == "binary":
        pos, n = (float(v) for v in noise.laplace_counts([int(round(y.sum())), len(y)], 2.0 / epsilon))
        p = float(np.clip(pos / max(n, 1.0), 1e-3, 1 - 1e-3))
        return np.array([math.log(p / (1 - p))])
    if name == "multiclass":
        k = objective.n_targets
        counts = noise.laplace_counts(np.bincount(y.astype(np.int64), minlength=k)[:k], 1.0 / epsilon).astype(float)
        logp = np.log(np.maximum(counts, 1.0) / np.maximum(counts, 1.0).sum())
        return logp - logp.mean()          # centred, as the exact softmax base score
    lo, hi = (_symexp(np.array(b)) for b in dp_bounds(_symlog(y), epsilon / 2.0, noise))
    lo, hi = float(lo), float(hi)
    total = float(noise.laplace(float(np.clip(y, lo, hi).sum()), max(abs(lo), abs(hi), 1e-12) / (epsilon / 4.0)))
    n = float(noise.laplace_counts([len(y)], 4.0 / epsilon)[0])
    return np.array([float(np.clip(total / max(n, 1.0), lo, hi))])
