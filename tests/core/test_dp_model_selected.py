"""``dp_trees = "selected"``: one feature per tree chosen by the exponential mechanism over the absolute
gradient sums of the leaves of every feature's halving tree, then data-independent halving splits
(vfl/core/dp_model.py)."""
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats
from support import halving_levels, rnm_probs

from vfl.core.dp_budget import account_gaussian, account_pure, gain_sensitivity
from vfl.core.dp_mechanisms import TreeMechanisms, halving_abs_gradients, halving_leaves, halving_sums
from vfl.core.dp_model import gaussian_plan_event, plan_dp_model
from vfl.core.dp_noise import SeededNoise
from vfl.core.params import TrainParams
from vfl.core.tree import Node


def halving_gains(sum_gradients, sum_hessians, bin_offsets, depth, reg_lambda):
    """Per feature, the gain of its halving tree: sum over leaves of G_l^2/(H_l+lambda) minus
    G^2/(H+lambda) (NaN: no ordinary bins). The oracle of the sensitivity bound of one split's gain
    (a tree of several leaves moves by no more than a split); training does not compute it."""
    def score(G, H):          # an empty leaf (H + lambda = 0) scores 0
        G, d = np.asarray(G, dtype=np.float64), np.asarray(H, dtype=np.float64) + reg_lambda
        return np.divide(G * G, d, out=np.zeros_like(d), where=d > 0)
    return np.array([np.nan if s is None else float(score(s[0], s[1]).sum() - score(s[0].sum(), s[1].sum()))
                     for s in halving_sums(sum_gradients, sum_hessians, bin_offsets, depth)])


def _plan(**kw):
    params = TrainParams(**({"dp_model": 4.0, "n_estimators": 5, "max_depth": 2, "mode": "plain",
                             "dp_trees": "selected"} | kw))
    return plan_dp_model(params, 1, 2)


# --------------------------------------------------------------------------- the halving tree
def _grow_halving(mech, offsets, tree, depth):
    """The leaves' bin sets of the tree ``mech`` grows by halving (as the grower would call it)."""
    nodes = [Node(0, 0)]
    held = {0: set(range(int(offsets[0][1] - offsets[0][0]) - 1))}      # source 0, feature 0
    frontier = [0]
    for d in range(depth):
        nxt = []
        for nid in frontier:
            s = mech.choose_split(nodes[nid], [None], offsets, tree, nodes)
            assert (s.source_idx, s.feature_idx, s.default_left) == (0, 0, False)
            left, right = Node(len(nodes), d + 1, parent=nid), Node(len(nodes) + 1, d + 1, parent=nid)
            nodes[nid].left, nodes[nid].right = left.node_id, right.node_id
            nodes += [left, right]
            held[left.node_id] = {b for b in held[nid] if b <= s.bin_idx}
            held[right.node_id] = {b for b in held[nid] if b > s.bin_idx}
            nxt += [left.node_id, right.node_id]
        frontier = nxt
    return [held[n] for n in frontier]


@pytest.mark.parametrize("n_ordinary, depth", [(8, 3), (31, 3), (5, 3), (3, 3), (1, 2), (32, 4)])
def test_halving_leaves_are_the_leaves_the_cyclic_trees_grow(n_ordinary, depth):
    """halving_leaves (used for the utilities) describes exactly the partition that _halve grows."""
    plan = plan_dp_model(TrainParams(mode="plain", dp_model=1.0, n_estimators=1, max_depth=depth,
                                     dp_trees="cyclic"), 1, 1)
    mech = TreeMechanisms(plan, 1.0, SeededNoise(0))
    grown = _grow_halving(mech, [np.array([0, n_ordinary + 1])], (0, 0), depth)
    leaves = halving_leaves(n_ordinary, depth)
    assert [set(range(a, z + 1)) for a, z in leaves] == grown
    assert sorted(b for a, z in leaves for b in range(a, z + 1)) == list(range(n_ordinary))


def test_halving_gains_by_hand():
    """One feature, 4 ordinary bins + missing, depth 1 (split after bin 1), lambda 1:
    left bins 0,1: G = 1 + 2 = 3, H = 1 + 1 = 2; right bins 2,3 + missing: G = -1 - 2 + 4 = 1, H = 3;
    total G = 4, H = 5: gain = 9/3 + 1/4 - 16/6 = 3 + 0.25 - 2.6666667 = 0.5833333.
    Depth 2 (leaves {0}, {1}, {2}, {3} + missing): 1/2 + 4/2 + 1/2 + 4/3 - 16/6 = 1.6666667."""
    sg = np.array([1.0, 2.0, -1.0, -2.0, 4.0])
    sh = np.array([1.0, 1.0, 1.0, 1.0, 1.0])
    assert halving_gains(sg, sh, np.array([0, 5]), 1, 1.0)[0] == pytest.approx(0.5833333, abs=1e-7)
    assert halving_gains(sg, sh, np.array([0, 5]), 2, 1.0)[0] == pytest.approx(1.6666667, abs=1e-7)
    # two features; one without ordinary bins (only the missing slot) has no utility
    two = halving_gains(np.concatenate([sg, [3.0]]), np.concatenate([sh, [1.0]]), np.array([0, 5, 6]), 1, 1.0)
    assert two[0] == pytest.approx(0.5833333, abs=1e-7) and math.isnan(two[1])
    # the feature choice's utility: |3| + |1| = 4 at depth 1; |1| + |2| + |-1| + |-2 + 4| = 6 at depth 2
    assert halving_abs_gradients(sg, sh, np.array([0, 5]), 1)[0] == 4.0
    assert halving_abs_gradients(sg, sh, np.array([0, 5]), 2)[0] == 6.0
    assert math.isnan(halving_abs_gradients(np.concatenate([sg, [3.0]]), np.concatenate([sh, [1.0]]),
                                            np.array([0, 5, 6]), 1)[1])


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_halving_abs_gradients_sensitivity_is_g_star_and_reached(depth):
    """Adding one row with |g| <= g* moves the feature choice's utility by at most g* (and exactly g*
    when it lands in a leaf whose sum has its sign or is 0)."""
    rng = np.random.default_rng(6)

    def util(g, bins):
        return halving_abs_gradients(np.bincount(bins, g, minlength=9), np.bincount(bins, minlength=9) * 0.25,
                                     np.array([0, 9]), depth)[0]

    worst = 0.0
    for _ in range(500):
        n = int(rng.integers(0, 30))
        g, bins = rng.uniform(-1, 1, n), rng.integers(0, 9, n)
        worst = max(worst, abs(util(np.append(g, rng.choice([-1.0, 1.0])), np.append(bins, rng.integers(0, 9)))
                               - util(g, bins)))
    assert worst <= 1.0 + 1e-12
    assert util(np.array([1.0]), np.array([0])) - util(np.array([]), np.array([], dtype=int)) == 1.0


@pytest.mark.parametrize("h_star, reg_lambda, depth", [(0.25, 1.0, 3), (1.0, 0.0, 2), (0.5, 0.1, 1)])
def test_halving_gain_sensitivity_bounds_every_neighbour(h_star, reg_lambda, depth):
    """Adding one row (|g| <= g*, hessian h*) moves a feature's halving-tree gain by at most 4 g*^2/h*,
    the sensitivity the feature choice uses; the bound is nearly reached."""
    bound = gain_sensitivity(1.0, h_star)
    rng = np.random.default_rng(5)

    def gain(g, bins):
        sg = np.bincount(bins, g, minlength=9)
        sh = np.bincount(bins, np.full(len(g), h_star), minlength=9)
        return halving_gains(sg, sh, np.array([0, 9]), depth, reg_lambda)[0]

    worst = 0.0
    for trial in range(400):
        n = int(rng.integers(0, 40))
        g = rng.choice([-1.0, 1.0, 0.2], size=n) if trial % 2 else rng.uniform(-1, 1, n)
        bins = rng.integers(0, 9, n)
        worst = max(worst, abs(gain(np.append(g, rng.choice([-1.0, 1.0])), np.append(bins, rng.integers(0, 9)))
                               - gain(g, bins)))
    assert worst <= bound
    g, bins = np.full(300, -1.0), np.full(300, 7)
    assert abs(gain(np.append(g, 1.0), np.append(bins, 0)) - gain(g, bins)) > 0.75 * bound


# --------------------------------------------------------------------------- the feature choice
@pytest.mark.slow
def test_feature_choice_frequencies_follow_the_exponential_mechanism():
    """select_feature over fixed histograms picks feature j as report-noisy-max with exponential
    noise of scale 2 Delta / eps over u_j, the absolute gradient sums of its halving leaves,
    Delta = g* (the exponential mechanism's guarantee); a wrong Delta fails."""
    plan = _plan()
    plan.select_epsilon = 0.5
    mech = TreeMechanisms(plan, 1.0, SeededNoise(11))
    offsets = [np.array([0, 5, 10]), np.array([0, 5])]
    hists = [(np.array([3.0, 1.0, -1.0, -2.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]), np.full(10, 4.0)),
             (np.array([5.0, 3.0, -4.0, -5.0, 1.0]), np.full(5, 4.0))]
    u = np.concatenate([halving_abs_gradients(*hists[0], offsets[0], plan.depth),
                        halving_abs_gradients(*hists[1], offsets[1], plan.depth)])
    assert u.size == 3 and len(set(np.round(u, 6))) == 3
    feats = [(0, 0), (0, 1), (1, 0)]
    n = 30_000
    picks = [feats.index(mech.select_feature(hists, offsets)) for _ in range(n)]
    counts = np.bincount(picks, minlength=3).astype(float)

    def chi2(sens):
        expected = n * rnm_probs(u, 2 * sens / plan.select_epsilon)
        return float(((counts - expected) ** 2 / expected).sum())

    critical = stats.chi2.ppf(0.999, df=2)
    delta = plan.g_star
    assert delta == 1.0                                       # binary: g* = 1
    assert chi2(delta) < critical
    assert chi2(2 * delta) > critical and chi2(delta / 2) > critical


def test_selected_tree_halves_the_chosen_feature():
    """The root chooses the tree's feature (here with a budget so large the best gain wins), every
    node of that tree then halves its bin range of it; another tree chooses again."""
    plan = _plan(max_depth=2)
    plan.select_epsilon = 1e9
    mech = TreeMechanisms(plan, 1.0, SeededNoise(0))
    offsets = [np.array([0, 5]), np.array([0, 9])]             # source 1's feature: 8 ordinary bins
    flat = (np.zeros(5), np.full(5, 2.0))
    signal = (np.array([9.0, 9.0, 9.0, 9.0, -9.0, -9.0, -9.0, -9.0, 0.0]), np.full(9, 2.0))
    # the children do not choose again (histograms are not even looked at: None)
    s, left_bin, right_bin = halving_levels(mech, [flat, signal], None, offsets)
    assert (s.source_idx, s.feature_idx, s.bin_idx, s.default_left) == (1, 0, 3, False)
    assert (left_bin, right_bin) == (1, 5)
    assert mech.tree_feature(offsets, (0, 0)) == (1, 0)
    s = mech.choose_split(Node(0, 0), [flat, (np.zeros(9), np.full(9, 2.0))],
                          [np.array([0, 5]), np.array([0, 9])], (1, 0), [Node(0, 0)])
    assert s is not None and (1, 0) in mech._features and mech._features[(1, 0)] == (s.source_idx, s.feature_idx)


# --------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("subsample", [1.0, 0.5])
def test_selected_plan_of_one_tree_depth_3_by_hand(subsample):
    """dp_model 1, one tree of depth 3, budget 0.1,0.3,0.6, two parties: the sketch 0.1 (base score
    0.01, 0.045 per party); the tree 0.9 after sampling (before: 0.9, or log(1 + (e^0.9 - 1)/0.5) =
    1.3658891 with q = 0.5), of which 1/3 buys the one feature choice (0.3 or 0.4552964) and 2/3 the
    leaves; no level spends anything (halving splits)."""
    params = TrainParams(mode="plain", n_estimators=1, max_depth=3, dp_model=1.0, subsample=subsample,
                         dp_budget="0.1,0.3,0.6", dp_trees="selected")
    plan = plan_dp_model(params, 1, 2)
    tree = 0.9 if subsample == 1 else 1.3658891
    assert plan.tree_epsilon == pytest.approx(tree, abs=1e-7)
    assert plan.select_epsilon == pytest.approx(tree / 3, abs=1e-7) and plan.level_epsilon == 0
    assert plan.leaf_gradients + plan.leaf_hessians == pytest.approx(tree * 2 / 3, abs=1e-7)
    assert plan.reported_epsilon == pytest.approx(1.0)
    assert account_pure(0.1, 0.0, 3, 0.48, 0.12, 1, 1.0, select=0.3) == pytest.approx(1.0)
    d = plan.to_dict()
    assert d["per_tree"]["feature_choice_epsilon"] == pytest.approx(tree / 3, abs=1e-7)
    assert "chosen by the exponential mechanism" in d["per_tree"]["split_features"]
    assert d["per_tree"]["split_epsilon_per_level"] == 0
    assert "halving" in d["per_tree"]["split_mechanism"]


def test_selected_gaussian_path_matches_dp_accounting_figures():
    params = TrainParams(mode="plain", n_estimators=20, max_depth=3, dp_model=4.0, dp_delta=1e-5,
                         dp_trees="selected")
    plan = plan_dp_model(params, 1, 2)
    assert plan.select_epsilon > 0 and plan.level_epsilon == 0
    assert 3.96 <= plan.reported_epsilon <= 4.0
    tree = dp_event.ComposedDpEvent([
        dp_event.GaussianDpEvent(plan.leaf_gradients / plan.g_star),
        dp_event.GaussianDpEvent(plan.leaf_hessians / plan.h_star),
        dp_event.ZCDpEvent(plan.select_epsilon ** 2 / 2)])
    event = dp_event.ComposedDpEvent([dp_event.ZCDpEvent(plan.sketch_epsilon ** 2 / 2),
                                      dp_event.SelfComposedDpEvent(tree, 20)])
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(event)
    assert acc.get_epsilon(1e-5) == pytest.approx(plan.reported_epsilon, rel=1e-9)
    assert account_gaussian(gaussian_plan_event(plan), 1e-5) == pytest.approx(plan.reported_epsilon, rel=1e-12)
    # the zCDP shares: rho of the feature choices = 0.2 of the total (default budget 0.1,0.2,0.7)
    rho = plan.extra["rho"]
    assert 20 * plan.select_epsilon ** 2 / 2 == pytest.approx(0.2 * rho)
