"""DP-only mode, the active party's estimator: debiased histograms over a randomized-response release.

Core module (no party wiring). :mod:`vfl.core.dp` is the mechanism (buckets, randomized
response, accounting); this module is what the label holder does with the noisy
bucket indices it receives. All of it is post-processing of the release, so it
costs no privacy.

The channel
-----------
``k``-ary randomized response keeps a bucket with probability
``p = e^eps/(e^eps + k - 1)`` and moves it to each other bucket with probability
``r = 1/(e^eps + k - 1)``; ``lambda = p - r``. For a set ``L`` of buckets, a row
truly in ``L`` is reported in ``L`` with probability ``lambda + r|L|``, a row
outside with probability ``r|L|``. So for any row weights ``a_i`` (gradients,
hessians) the noisy histogram of a node satisfies

    E[G~_j] = lambda * G_j + r * G_node

and ``G^_j = (G~_j - r G_node) / lambda`` is unbiased for the true-bucket sum
``G_j`` (:func:`debias`). For a prefix ``L`` of buckets the debiased sum is
``G^_L = sum_i a_i c_i`` with ``c_i = (1[b~_i in L] - r|L|) / lambda``
(``E[c_i] = 1[b_i in L]``), and since ``c_i`` takes two values,
``E[c_i^2 - c_i] = Var(c_i)``: the noisy histogram of ``a_i^2`` gives an
unbiased estimate of ``Var(G^_L)`` (:func:`prefix_variance`). Split scores use
``G^_L^2 - Var`` for ``G_L^2`` (``E[G^_L^2] = G_L^2 + Var``), hessian sums
clamped at ``min_child_weight``, and rank a noisy candidate by a lower
confidence bound (score minus ``z`` standard deviations, delta method), so a
feature whose signal the noise drowns is not chosen over the active party's
own exact splits.

Each noisy feature is used at most once on any path (:class:`DPGrower`): below
a split on feature ``f`` the rows were selected by their noisy ``f``, the
channel of ``f`` is no longer the unconditional one, and its debiasing would
be wrong. Other features' noise is independent of ``f``'s, so their
debiasing stays exact within any node.

Leaf values and training scores
-------------------------------
Prediction routes a row by its *true* values (the passive party holds the
thresholds), so a leaf's weight should be the optimal weight over the rows
truly in the leaf's region. The grower estimates each training row's
posterior probability of being in each region: at a split on a noisy feature
the probability of the true bucket being on the left given the reported bucket
(Bayes with the feature's debiased bucket frequencies as prior), at an active
party's split the exact side; along a path the probabilities multiply
(independent noise; features treated as independent given the path). Leaf
weights are ``-sum w_i g_i / (sum w_i h_i + lambda)`` and each training row's
score moves by its expected leaf value, which is what the next round's
gradients see.

Buckets from epsilon
--------------------
:func:`auto_buckets` picks ``q`` maximising ``lambda(q) * (1 - 1/q)``: the
debiased signal of a split shrinks with the channel's ``lambda`` and grows with
the bucketing's resolution (``1 - 1/q``: the share of a ranked feature's
between-bucket spread). It gives q = 2 at eps <= 0.6, 3 at 0.7 to 1.5, 4 at 2,
8 at 4, 21 at 6, and never more buckets than the feature has values: a feature
with at most ``q`` values keeps one bucket per value (its natural categories).
"""
from __future__ import annotations

import math

import numpy as np

from datasets.errors import InputError
from vfl.core.boosting import Booster
from vfl.core.dp import INF, BucketSource, check_n_buckets
from vfl.core.grower import TreeGrower
from vfl.core.params import check_epsilon
from vfl.core.rounds import RoundTiming
from vfl.core.sampling import node_members
from vfl.core.sources import LocalSource
from vfl.core.split import SplitInfo, best_cell, find_best_split, goes_left
from vfl.core.tree import Tree

#: lower confidence bound of a noisy candidate's gain: score minus Z standard deviations
Z_LCB = 2.0
#: the debiased bucket frequencies used as a prior never fall below this share
PRIOR_FLOOR = 1e-3


# --- the channel -----------------------------------------------------------------
def rr_channel(epsilon: float, k: int) -> tuple[float, float, float]:
    """``(p, r, lambda)`` of ``k``-ary randomized response at ``epsilon``."""
    eps = check_epsilon(epsilon)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"a randomized-response domain needs k >= 1 buckets, got {k!r}")
    if eps == INF or k == 1:
        return 1.0, 0.0, 1.0
    r = 1.0 / (math.exp(eps) + k - 1) if eps < 700 else 0.0
    p = 1.0 - (k - 1) * r
    return p, r, p - r


def auto_buckets(epsilon: float, n_values: int, max_buckets: int = 256) -> int:
    """Buckets for a feature released at ``epsilon`` with ``n_values`` distinct (non-missing) values.

    ``argmax_q lambda(q) * (1 - 1/q)`` over ``2 <= q <= min(n_values, max_buckets)``; a feature
    with at most that many values keeps one bucket per value. ``epsilon = inf`` has no
    optimum (no noise): it is refused here; the release then keeps the training bins.
    """
    eps = check_epsilon(epsilon)
    if eps == INF:
        raise InputError("automatic buckets need a finite epsilon (with no noise the training bins are kept)")
    if isinstance(n_values, bool) or not isinstance(n_values, (int, np.integer)) or n_values < 1:
        raise InputError(f"a feature needs at least one value to be bucketed, got {n_values!r}")
    top = int(min(n_values, max_buckets))
    if top < 2:
        return max(1, top)
    qs = np.arange(2, top + 1)
    lam = np.array([rr_channel(eps, int(q))[2] for q in qs])
    signal = lam * (1.0 - 1.0 / qs)
    return int(qs[int(np.argmax(signal))])


def split_signal(epsilon: float, n_buckets: int) -> float:
    """``lambda(q) * (1 - 1/q)``: the debiased split signal of a feature released in ``q = n_buckets``
    buckets at ``epsilon`` (the criterion :func:`auto_buckets` maximises over ``q``). A debiased
    gain's noise has a standard deviation proportional to ``1/lambda``, so at a fixed number of
    rows a split's detectability (its gain over that noise) scales with ``lambda``; ``1 - 1/q`` is
    the share of a ranked feature's spread the buckets keep. 0 for a feature of one bucket."""
    q = int(n_buckets)
    if q < 2:
        return 0.0
    return rr_channel(epsilon, q)[2] * (1.0 - 1.0 / q)


def auto_select(gains, n_buckets_at, epsilon_per_party: float) -> tuple[int, np.ndarray]:
    """``--dp-select auto``: how many features ``K`` a party releases, from its pilot.

    ``gains[f]``: feature ``f``'s debiased root gain per pilot row (:func:`root_gains`; negative
    estimates count as 0). ``n_buckets_at(eps)``: the buckets each feature would be released in
    at ``eps`` per feature (an array over the features). Releasing the top ``K`` features by gain
    at ``eps_row / K`` each scores

        S(K) = sum over the top K features f of max(gain_f, 0) * split_signal(eps_row / K, q_f)

    (each selected feature's signal weighed by what its channel lets through: more features
    share the budget, each gets a noisier channel). Returns ``(K, S)`` with ``K = argmax S``
    (the smallest on ties; 1 when no gain is positive) and ``S[K - 1]`` for ``K = 1..d``."""
    eps = check_epsilon(epsilon_per_party)
    if eps == INF:
        raise InputError("automatic feature selection needs a finite epsilon (with no noise every feature "
                         "is released)")
    g = np.maximum(np.asarray(gains, dtype=np.float64), 0.0)
    if g.ndim != 1 or g.size == 0 or not np.all(np.isfinite(g)):
        raise InputError(f"auto_select needs a finite gain per feature, got {np.asarray(gains).tolist()}")
    order = np.argsort(-g, kind="stable")
    scores = np.zeros(g.size)
    for k in range(1, g.size + 1):
        q = np.asarray(n_buckets_at(eps / k), dtype=np.int64).reshape(-1)
        if q.shape != g.shape:
            raise InputError(f"auto_select: {q.size} bucket counts for {g.size} features")
        top = order[:k]
        scores[k - 1] = float(sum(g[f] * split_signal(eps / k, int(q[f])) for f in top.tolist()))
    best = int(np.argmax(scores)) + 1 if scores.max() > 0 else 1
    return best, scores


def coarse_buckets(counts, n_buckets: int) -> np.ndarray:
    """Merge ordered fine bins (``counts`` rows each) into at most ``n_buckets`` buckets of
    near-equal size; returns the bucket of every fine bin (non-decreasing, from 0).

    A fine bin is never cut (tied values stay together), empty fine bins join their
    neighbour, and no bucket is empty.
    """
    counts = np.asarray(counts, dtype=np.float64)
    q = check_n_buckets(n_buckets)
    nf = len(counts)
    if nf == 0:
        return np.zeros(0, dtype=np.int64)
    if q >= np.count_nonzero(counts):   # one bucket per non-empty fine bin
        group = np.cumsum(counts > 0) - 1
        return np.maximum(group, 0).astype(np.int64)
    total = counts.sum()
    mid = np.cumsum(counts) - counts / 2            # each fine bin's centre in rank space
    group = np.minimum((mid / total * q).astype(np.int64), q - 1)
    group = np.maximum.accumulate(group)
    # renumber without gaps (a bucket may have no fine bin when one bin is very large)
    _, group = np.unique(group, return_inverse=True)
    return group.astype(np.int64)


# --- estimates over one node's noisy histogram ----------------------------------
def debias(noisy, total, r: float, lam: float):
    """``(noisy - r * total) / lambda``: unbiased true-bucket sums from a noisy histogram."""
    return (np.asarray(noisy, dtype=np.float64) - r * np.asarray(total, dtype=np.float64)) / lam


def prefix_variance(a2_left, a2_total, size_left, r: float, lam: float):
    """Unbiased estimate of ``Var(G^_L)`` for a bucket set ``L`` of ``size_left`` buckets, from the
    noisy sums of squared row weights inside ``L`` (``a2_left``) and in the node (``a2_total``)."""
    c1 = (1.0 - r * size_left) / lam        # c_i of a row reported in L
    c0 = -r * size_left / lam               # ... reported outside L
    return c1 * (c1 - 1.0) * a2_left + c0 * (c0 - 1.0) * (a2_total - a2_left)


class DebiasedBucketSource(BucketSource):
    """A passive party's release seen through the channel: debiased split search, posteriors.

    ``build`` returns, per node, the noisy gradient histogram and, stacked, the noisy
    hessian and squared-gradient histograms (``sum_hessians`` has shape
    ``(n_nodes, 2, n_flat)``); :meth:`best_split` debiases them.
    """

    def __init__(self, party: str, buckets, n_bins, rr_domain, epsilon_per_feature: float, register,
                 rows_used=None):
        super().__init__(party, buckets, n_bins, register)
        n = self.bin_idx.shape[0]
        used = np.ones(n, dtype=bool) if rows_used is None else np.asarray(rows_used, dtype=bool)
        if used.shape != (n,) or not used.any():
            raise InputError(f"party {party!r}: rows_used must mark some of the {n} released rows")
        # the rows released through this channel (--dp-select: not the pilot's, which are only routed)
        self.rows_used = used
        eps = check_epsilon(epsilon_per_feature, "epsilon_per_feature")
        domain = np.asarray(rr_domain, dtype=np.int64)
        if domain.shape != self.n_bins.shape or np.any(domain > self.n_bins) or np.any(domain < 1):
            raise InputError(f"party {party!r}: randomized-response domains {domain.tolist()} do not fit "
                             f"{self.n_bins.tolist()} bucket slots")
        self.epsilon = eps
        self.domain = domain
        chan = [rr_channel(eps, int(k)) for k in domain.tolist()]
        self.r = np.array([c[1] for c in chan])
        self.lam = np.array([c[2] for c in chan])
        self._g2 = None
        self.prior, self.posterior = [], []
        for f in range(len(self.n_bins)):
            prior, post = self._posterior(f)
            self.prior.append(prior)
            self.posterior.append(post)

    # -- the prior and posterior of every feature's true bucket -------------------
    def _in_domain(self, f: int) -> np.ndarray:
        nb, k = int(self.n_bins[f]), int(self.domain[f])
        slots = np.arange(nb)
        return slots < k if k < nb else np.ones(nb, dtype=bool)

    def _posterior(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """``(prior, post)``: the prior of the true slot (the feature's debiased bucket frequencies
        over the released rows) and ``post[b, t] = P(true slot t | reported slot b)``."""
        nb = int(self.n_bins[f])
        dom = self._in_domain(f)
        counts = np.bincount(self.bin_idx[self.rows_used, f].astype(np.int64), minlength=nb).astype(np.float64)
        n = counts.sum()
        prior = np.where(dom, np.maximum(debias(counts, n, self.r[f], self.lam[f]), PRIOR_FLOOR * n), 0.0)
        prior /= prior.sum()
        p = self.r[f] + self.lam[f]
        like = np.where(np.eye(nb, dtype=bool), p, self.r[f]) * dom[None, :] * dom[:, None]
        post = like * prior[None, :]
        s = post.sum(axis=1, keepdims=True)
        return prior, np.divide(post, s, out=np.zeros_like(post), where=s > 0)

    def _left_slots(self, feature_idx: int, bin_idx: int, default_left: bool) -> np.ndarray:
        nb = int(self.n_bins[feature_idx])
        left = np.arange(nb) <= bin_idx
        left[nb - 1] = bool(default_left)                 # the missing slot
        return left.astype(np.float64)

    def prob_left(self, feature_idx: int, bin_idx: int, default_left: bool) -> np.ndarray:
        """Every row's posterior probability that its true value goes left (rows outside
        ``rows_used``: the prior probability)."""
        left = self._left_slots(feature_idx, bin_idx, default_left)
        per_reported = self.posterior[feature_idx] @ left
        out = per_reported[self.bin_idx[:, feature_idx].astype(np.int64)]
        return np.where(self.rows_used, out, float(self.prior[feature_idx] @ left))

    def split(self, round_idx, tree_idx, node_ids, feature_idx, bin_idx, default_left, assignment,
              categories=None):
        """Route by the released buckets; a row outside ``rows_used`` goes to the side its
        feature's prior makes likelier. (Mode dp has no categorical features: ``categories``
        is always None here.)"""
        out = super().split(round_idx, tree_idx, node_ids, feature_idx, bin_idx, default_left, assignment,
                            categories)
        if self.rows_used.all():
            return out
        fixed = []
        for (ref, go_left), t, nid, f, b, dl in zip(out, tree_idx, node_ids, feature_idx, bin_idx, default_left):
            rows = node_members(assignment[t], nid)
            likely = bool(self.prior[f] @ self._left_slots(f, b, dl) >= 0.5)
            fixed.append((ref, np.where(self.rows_used[rows], go_left, likely)))
        return fixed

    # -- histograms -------------------------------------------------------------------
    def start_round(self, gradients):
        super().start_round(gradients)
        used = self.rows_used[:, None]
        self._gu, self._hu = np.where(used, self._g, 0.0), np.where(used, self._h, 0.0)
        self._g2 = self._gu * self._gu

    def build(self, round_idx, tree_idx, node_ids, assignment):
        n_flat = int(self.bin_offsets[-1])
        sg = np.zeros((len(node_ids), n_flat))
        sh = np.zeros((len(node_ids), 2, n_flat))
        for i, (t, nid) in enumerate(zip(tree_idx, node_ids)):
            rows = np.flatnonzero(assignment[t] == nid)
            sg[i], sh[i, 0], sh[i, 1] = self._bin_sums(rows, [self._gu[rows, t], self._hu[rows, t],
                                                              self._g2[rows, t]])
        return sg, sh

    def best_split(self, sum_gradients, stacked, G: float, H: float, params, source_idx: int,
                   banned=frozenset(), z: float | None = None) -> SplitInfo | None:
        """The best split by lower confidence bound of the debiased, variance-corrected gain.

        The histograms cover the node's rows released through this channel; when some rows are
        not (the ``--dp-select`` pilot's), their gain is scaled to the node by ``H / H_used``."""
        z = Z_LCB if z is None else float(z)
        reg, mcw = float(params.reg_lambda), float(params.min_child_weight)
        offsets = self.bin_offsets
        nb = np.diff(offsets)
        F, width = len(nb), int(nb.max())
        present = np.arange(width)[None, :] < nb[:, None]
        mats = []
        for flat in (sum_gradients, stacked[0], stacked[1]):
            mat = np.zeros((F, width))
            mat[present] = np.asarray(flat, dtype=np.float64)
            mats.append(mat)
        mg, mh, m2 = mats
        rows = np.arange(F)
        j = np.arange(width)[None, :]
        dom_k = self.domain[:, None]
        missing_in = (self.domain == nb)[:, None]
        in_dom = np.where(missing_in, present, j < dom_k)
        r, lam = self.r[:, None], self.lam[:, None]
        Gt, Ht, A2t = (m.sum(axis=1, keepdims=True) for m in (mg, mh, m2))
        gd = np.where(in_dom, debias(mg, Gt, r, lam), 0.0)
        hd = np.where(in_dom, debias(mh, Ht, r, lam), 0.0)
        gl, hl, a2l = np.cumsum(gd, axis=1), np.cumsum(hd, axis=1), np.cumsum(m2, axis=1)
        gm, hm, a2m = gd[rows, nb - 1][:, None], hd[rows, nb - 1][:, None], m2[rows, nb - 1][:, None]
        parent = Gt * Gt / (Ht + reg)
        Hu = float(Ht[0, 0]) if F else 0.0
        scale = 1.0 if self.rows_used.all() or Hu <= 0 else float(H) / Hu
        scores = np.full((F, width, 2), -np.inf)
        for d, (GL, HL, A2L, size, ok) in enumerate((
                (gl, hl, a2l, j + 1, j < nb[:, None] - 1),
                (gl + gm, hl + hm, a2l + a2m, j + 2, (j < nb[:, None] - 2) & missing_in))):
            ok = ok & (size < dom_k) & (self.domain[:, None] >= 2)
            V = np.maximum(prefix_variance(A2L, A2t, size, r, lam), 0.0)
            GR = Gt - GL
            HLc, HRc = np.maximum(HL, mcw), np.maximum(Ht - HL, mcw)
            gain = (GL * GL - V) / (HLc + reg) + (GR * GR - V) / (HRc + reg) - parent
            sd = np.abs(2 * GL / (HLc + reg) - 2 * GR / (HRc + reg)) * np.sqrt(V)
            scores[:, :, d] = np.where(ok & np.isfinite(gain), (gain - z * sd) * scale, -np.inf)
        for f in banned:
            scores[f] = -np.inf
        cell = best_cell(scores, gl, hl, gm, hm)
        return None if cell is None else SplitInfo(cell[0], source_idx, *cell[1:])


# --- growing trees over debiased sources -----------------------------------------
class DPGrower(TreeGrower):
    """:class:`TreeGrower` for DP-only training: noisy features are scored by
    :meth:`DebiasedBucketSource.best_split`, used at most once per path, and leaf values are
    estimated for the rows' true regions (posterior memberships); :attr:`expected` holds every
    row's expected leaf value per tree, the training scores' update."""

    def grow(self, round_idx, gq, hq, in_sample=None):
        self._used: dict = {}
        self._rule: dict = {}
        self._in_sample = in_sample
        return super().grow(round_idx, gq, hq, in_sample)

    def _source_split(self, k, nid, node, si, sg, sh, cons):
        """Noisy features by :meth:`DebiasedBucketSource.best_split`, each at most once per path;
        the active party's own features as plain bins (no categorical, monotone or constraints)."""
        p, src = self.params, self.sources[si]
        if isinstance(src, DebiasedBucketSource):
            banned = {f for s, f in self._used.get((k, nid), frozenset()) if s == si}
            return src.best_split(sg, sh, node.sum_gradients, node.sum_hessians, p, si, banned)
        return find_best_split(sg, sh, src.bin_offsets, node.sum_gradients, node.sum_hessians, p.reg_lambda,
                               p.min_child_weight, si)

    def _add_children(self, k, nid, best, ref, go_left):
        children = super()._add_children(k, nid, best, ref, go_left)
        used = self._used.get((k, nid), frozenset())
        if isinstance(self.sources[best.source_idx], DebiasedBucketSource):
            used = used | {(best.source_idx, best.feature_idx)}
        for key in children:
            self._used[key] = used
        self._rule[(k, nid)] = best
        return children

    def _prob_left(self, best: SplitInfo) -> np.ndarray:
        src = self.sources[best.source_idx]
        if isinstance(src, DebiasedBucketSource):
            return src.prob_left(best.feature_idx, best.bin_idx, best.default_left)
        if isinstance(src, LocalSource):
            bins = src.bin_idx[:, best.feature_idx].astype(np.int64)
            return goes_left(bins, best.bin_idx, best.default_left,
                             missing=bins == src.missing_bin[best.feature_idx]).astype(np.float64)
        raise InputError(f"DP-only training cannot weigh a split of source {type(src).__name__}")

    def _set_leaf_values(self) -> None:
        super()._set_leaf_values()
        n_rows = self.gq.shape[0]
        self.expected = np.zeros((len(self.trees), n_rows))
        for k, tree in enumerate(self.trees):
            weight = self._memberships(k, tree, n_rows)
            for node in tree.nodes:
                if node.is_leaf:
                    self.expected[k] += weight[node.node_id] * node.value

    def _memberships(self, k: int, tree: Tree, n_rows: int) -> dict[int, np.ndarray]:
        """Every row's posterior probability of truly belonging to every node of tree ``k``."""
        weight = {0: np.ones(n_rows)}
        for node in tree.nodes:               # breadth-first: a parent before its children
            if node.is_leaf:
                continue
            pl = self._prob_left(self._rule[(k, node.node_id)])
            weight[node.left] = weight[node.node_id] * pl
            weight[node.right] = weight[node.node_id] * (1.0 - pl)
        return weight


def root_gains(buckets, n_bins, rr_domain, epsilon_per_feature: float, g, h, params) -> np.ndarray:
    """Every released feature's best debiased, variance-corrected root gain (no confidence
    penalty), summed over targets: how ``--dp-select`` ranks features on its pilot."""
    src = DebiasedBucketSource("pilot", buckets, n_bins, rr_domain, epsilon_per_feature, lambda *a: a[0])
    g = np.asarray(g, dtype=np.float64).reshape(len(src.bin_idx), -1)
    h = np.asarray(h, dtype=np.float64).reshape(len(src.bin_idx), -1)
    src._g, src._h = g, h
    src._gu, src._hu, src._g2 = g, h, g * g
    n_feat = len(src.n_bins)
    gains = np.zeros(n_feat)
    zeros = np.zeros((g.shape[1], len(g)), dtype=np.int32)
    for t in range(g.shape[1]):
        sg, sh = src.build(0, np.array([t]), np.array([0]), zeros)
        G, H = float(g[:, t].sum()), float(h[:, t].sum())
        for f in range(n_feat):
            info = src.best_split(sg[0], sh[0], G, H, params, 0, set(range(n_feat)) - {f}, z=0.0)
            gains[f] += 0.0 if info is None else info.gain
    return gains


class DPBooster(Booster):
    """:class:`Booster` over debiased sources: :class:`DPGrower`, and training scores move by each
    row's expected leaf value (its true leaf is unknown to the active party)."""

    def _grower(self, timing: RoundTiming) -> "DPGrower":
        return DPGrower(self.round_sources, self.params, self._map, timing)

    def _update_scores(self, grower: "DPGrower", trees, leaf_pos, raw: np.ndarray) -> None:
        raw += grower.expected.T
