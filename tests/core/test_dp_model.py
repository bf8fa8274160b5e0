"""A DP released model (vfl.core.dp_model): the mechanisms, the accounting, the bounds and the seams."""
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats
from support import halving_levels, rnm_probs, small_frames

from datasets.errors import InputError
from datasets.frames import PartyFrame
from vfl.api import federation_from_frames
from vfl.core.binning import Binner
from vfl.core.boosting import Booster
from vfl.core.dp_bins import DPBinner, dp_bounds
from vfl.core.dp_budget import account_gaussian, account_pure, amplified, gain_sensitivity
from vfl.core.dp_mechanisms import PoissonSampler, TreeMechanisms, candidate_gains, dp_base_score, exponential_mechanism
from vfl.core.dp_model import DPModelPlan, gaussian_plan_event, plan_dp_model
from vfl.core.dp_noise import SecureNoise, SeededNoise
from vfl.core.objectives import BinaryObjective, get_objective
from vfl.core.params import TrainParams
from vfl.core.rounds import RoundObserver
from vfl.core.tree import Node


# --------------------------------------------------------------------------- exponential mechanism
def _chi2(counts, probs):
    n = counts.sum()
    expected = n * probs
    return float(((counts - expected) ** 2 / expected).sum())


def test_exponential_mechanism_frequencies_follow_report_noisy_max_of_scale_2_delta_over_eps():
    """Selection frequencies over a fixed candidate set match report-noisy-max with exponential
    noise of scale 2 Delta / eps (the exponential mechanism's eps guarantee); the same draws compared
    against a wrong Delta (2 Delta or Delta / 2) fail the chi-square test. OpenDP's sampler (the
    secure source) gives the same distribution: its draws cannot be seeded, so they are judged at a
    false-alarm rate of one in a million (at 0.001 this test failed about once in a thousand runs),
    and the same draws reject both wrong Deltas at that level (non-centrality above 200 against a
    critical value of 33: the check keeps its power)."""
    u = np.array([0.0, 1.0, 2.0, 3.0, 5.0])
    eps, delta = 1.0, 1.5
    noise = SeededNoise(7)
    n = 40_000
    picks = np.array([exponential_mechanism(u, eps, delta, noise) for _ in range(n)])
    counts = np.bincount(picks, minlength=u.size).astype(float)
    critical = stats.chi2.ppf(0.999, df=u.size - 1)
    assert _chi2(counts, rnm_probs(u, 2 * delta / eps)) < critical
    assert _chi2(counts, rnm_probs(u, 4 * delta / eps)) > critical
    assert _chi2(counts, rnm_probs(u, delta / eps)) > critical
    secure = np.bincount([exponential_mechanism(u, eps, delta, SecureNoise()) for _ in range(1500)],
                         minlength=u.size).astype(float)
    strict = stats.chi2.ppf(1 - 1e-6, df=u.size - 1)
    assert _chi2(secure, rnm_probs(u, 2 * delta / eps)) < strict
    assert _chi2(secure, rnm_probs(u, 4 * delta / eps)) > strict
    assert _chi2(secure, rnm_probs(u, delta / eps)) > strict


def test_exponential_mechanism_edges_no_overflow_inf_and_zero():
    rng = SecureNoise()
    huge = np.array([1e300, 1e300 * 0.5, -1e300])
    assert exponential_mechanism(huge, 1.0, 1e-3, rng) == 0          # scores 1e305: no overflow, no NaN
    assert exponential_mechanism(np.array([1.0, 3.0, 2.0]), math.inf, 1.0, rng) == 1
    picks = [exponential_mechanism(np.array([0.0, 1e6]), 0.0, 1.0, rng) for _ in range(4000)]
    assert 0.45 < np.mean(picks) < 0.55                                # epsilon 0: uniform
    with pytest.raises(ValueError):
        exponential_mechanism(np.array([]), 1.0, 1.0, rng)


# --------------------------------------------------------------------------- gain sensitivity
def _node_gains(g, bins, n_bins, reg_lambda, h_star):
    """Every candidate gain of one feature with ``n_bins`` ordinary bins (+ the missing slot)."""
    sg = np.bincount(bins, g, minlength=n_bins + 1)
    sh = np.bincount(bins, np.full(len(g), h_star), minlength=n_bins + 1)
    return candidate_gains(sg, sh, np.array([0, n_bins + 1]), float(sg.sum()), float(sh.sum()), reg_lambda)[0]


@pytest.mark.parametrize("h_star, reg_lambda", [(0.25, 1.0), (1.0, 0.0), (0.5, 0.1)])
def test_gain_sensitivity_bounds_every_neighbour_and_is_nearly_reached(h_star, reg_lambda):
    """Adding one row changes no candidate's gain by more than 4 g*^2 / h*; an empty child next to a
    parent of opposite gradients comes close to the bound (so it is not loose by a factor)."""
    g_star = 1.0
    bound = gain_sensitivity(g_star, h_star)
    rng = np.random.default_rng(1)
    worst = 0.0
    for trial in range(300):
        n = int(rng.integers(0, 40))
        g = rng.choice([-g_star, g_star, 0.3], size=n) if trial % 2 else rng.uniform(-g_star, g_star, n)
        bins = rng.integers(0, 4, n)
        base = _node_gains(g, bins, 4, reg_lambda, h_star)
        extra_g = rng.choice([-g_star, g_star])
        more = _node_gains(np.append(g, extra_g), np.append(bins, rng.integers(0, 5)), 4, reg_lambda, h_star)
        worst = max(worst, float(np.max(np.abs(more - base))))
    assert worst <= bound
    # near-worst case: 200 rows at -g* in bins 1..3, the new row at +g* alone in bin 0
    g = np.full(200, -g_star)
    bins = np.full(200, 2)
    base = _node_gains(g, bins, 4, reg_lambda, h_star)
    more = _node_gains(np.append(g, g_star), np.append(bins, 0), 4, reg_lambda, h_star)
    assert float(np.max(np.abs(more - base))) > 0.75 * bound


# --------------------------------------------------------------------------- leaves
def _plan(**kw):
    params = TrainParams(**({"dp_model": 1.0, "n_estimators": 5, "max_depth": 3, "mode": "plain"} | kw))
    return plan_dp_model(params, 1, 2)


def test_laplace_leaf_noise_has_the_stated_scale():
    """Reference figures by hand (not from the plan): dp_model 1, 5 selected trees, budget
    0.1/0.2/0.7: each tree gets 0.9/5 = 0.18, its leaves 0.7/0.9 of it = 0.14, the gradient sums 80%
    = 0.112 (sensitivity g* = 1: scale 1/0.112), the hessian sums 0.028 (h* = 1/4: scale 0.25/0.028)."""
    plan = _plan()
    b_g, b_h = 1.0 / 0.112, 0.25 / 0.028
    assert plan.g_star / plan.leaf_gradients == pytest.approx(b_g, rel=1e-12)
    assert plan.h_star / plan.leaf_hessians == pytest.approx(b_h, rel=1e-12)
    mech = TreeMechanisms(plan, 1.0, SeededNoise(3))
    draws = np.array([mech.noisy_sums(10.0, 5.0) for _ in range(40_000)])
    assert np.var(draws[:, 0]) == pytest.approx(2 * b_g ** 2, rel=0.05)
    assert np.var(draws[:, 1]) == pytest.approx(2 * b_h ** 2, rel=0.05)
    assert np.mean(draws[:, 0]) == pytest.approx(10.0, abs=4 * b_g * math.sqrt(2 / 40_000))
    # the Laplace shape, not merely its variance: the mean absolute deviation of Laplace(b) is b
    assert np.mean(np.abs(draws[:, 0] - 10.0)) == pytest.approx(b_g, rel=0.03)


def _reference_rho(eps: float, delta: float, T: int, D: int, shares, trees: str, g_star: float, h_star: float):
    """The total zCDP budget a (eps, delta) plan can spend, calibrated here from scratch with
    dp-accounting (the events written out with literal sensitivities, not the plan's helpers), and the
    leaf sigmas it gives: ``(rho, sigma_gradients, sigma_hessians)``."""
    def events(rho):
        leaf = shares[2] * rho / T
        sg, sh = g_star / math.sqrt(2 * 0.8 * leaf), h_star / math.sqrt(2 * 0.2 * leaf)
        tree = [dp_event.GaussianDpEvent(sg / g_star), dp_event.GaussianDpEvent(sh / h_star)]
        if trees == "selected":
            tree.append(dp_event.ZCDpEvent(shares[1] * rho / T))
        else:
            tree.append(dp_event.SelfComposedDpEvent(dp_event.ZCDpEvent(shares[1] * rho / (T * D)), D))
        return dp_event.ComposedDpEvent([dp_event.ZCDpEvent(shares[0] * rho),
                                         dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent(tree), T)]), sg, sh

    def spent(rho):
        acc = rdp_privacy_accountant.RdpAccountant()
        acc.compose(events(rho)[0])
        return acc.get_epsilon(delta)

    lo, hi = 0.0, 1.0
    while spent(hi) < eps:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spent(mid) <= eps else (lo, mid)
    _, sg, sh = events(lo)
    return lo, sg, sh


def test_gaussian_leaf_noise_has_the_stated_sigma():
    """The leaf sigmas against a calibration made here from scratch (binary: g* = 1, h* = 1/4)."""
    plan = _plan(dp_delta=1e-5)
    _, sg, sh = _reference_rho(1.0, 1e-5, 5, 3, (0.1, 0.2, 0.7), "selected", 1.0, 0.25)
    assert plan.leaf_gradients == pytest.approx(sg, rel=1e-6)
    assert plan.leaf_hessians == pytest.approx(sh, rel=1e-6)
    mech = TreeMechanisms(plan, 1.0, SeededNoise(4))
    draws = np.array([mech.noisy_sums(0.0, 0.0) for _ in range(40_000)])
    assert np.std(draws[:, 0]) == pytest.approx(sg, rel=0.03)
    assert np.std(draws[:, 1]) == pytest.approx(sh, rel=0.03)


def test_leaf_weight_is_clipped_and_the_released_tree_keeps_no_exact_statistics():
    plan = _plan(dp_model=0.01)
    mech = TreeMechanisms(plan, 1.0, SeededNoise(5))
    bound = plan.g_star / plan.h_star
    weights = [mech.leaf_weight(Node(0, 0, sum_gradients=3.0, sum_hessians=0.25)) for _ in range(300)]
    assert max(abs(w) for w in weights) <= bound and max(abs(w) for w in weights) == pytest.approx(bound)


# --------------------------------------------------------------------------- accounting
def test_pure_accounting_by_hand_one_tree_depth_3():
    """One tree of depth 3: sketch 0.1, 0.1 per level, leaves 0.2 + 0.1 -> 0.7; with Poisson sampling
    q = 0.5 the tree's 0.6 becomes log(1 + 0.5 (e^0.6 - 1)) = log(1.4110594) = 0.3443408"""
    assert account_pure(0.1, 0.1, 3, 0.2, 0.1, 1, 1.0) == pytest.approx(0.7)
    assert account_pure(0.1, 0.1, 3, 0.2, 0.1, 1, 0.5) == pytest.approx(0.1 + 0.3443408, abs=1e-7)
    assert account_pure(0.1, 0.1, 3, 0.2, 0.1, 20, 1.0) == pytest.approx(0.1 + 20 * 0.6)


@pytest.mark.parametrize("subsample", [1.0, 0.5])
def test_plan_of_one_tree_depth_3_reports_the_hand_computed_epsilon(subsample):
    params = TrainParams(mode="plain", n_estimators=1, max_depth=3, dp_model=1.0, subsample=subsample,
                         dp_budget="0.1,0.3,0.6", dp_trees="cyclic")
    plan = plan_dp_model(params, 1, 2)
    # by hand: 0.1 to the sketch (0.01 for the base score, 0.045 per party); the tree gets 0.9 after sampling
    tree = 0.9 if subsample == 1 else math.log(1 + (math.exp(0.9) - 1) / 0.5)   # 1.3658951...
    assert plan.sketch_epsilon == pytest.approx(0.1) and plan.sketch_epsilon_per_party == pytest.approx(0.045)
    assert plan.base_epsilon == pytest.approx(0.01)
    assert plan.tree_epsilon == pytest.approx(tree)
    assert plan.level_epsilon == pytest.approx(tree / 3 / 3)        # splits: 1/3 of the tree, 3 levels
    assert plan.leaf_gradients + plan.leaf_hessians == pytest.approx(tree * 2 / 3)
    assert plan.reported_epsilon == pytest.approx(1.0)
    assert 0.1 + math.log(1 + subsample * (math.exp(tree) - 1)) == pytest.approx(1.0)
    d = plan.to_dict()
    assert d["epsilon"] == pytest.approx(1.0) and d["mechanism"] == "laplace"
    assert d["per_tree"]["split_epsilon_per_level"] == pytest.approx(tree / 9)
    assert d["per_tree"]["epsilon_after_sampling"] == pytest.approx(0.9)


def test_multiclass_trees_compose_sequentially():
    params = TrainParams(mode="plain", objective="multiclass", n_estimators=4, max_depth=2, dp_model=2.0)
    plan = plan_dp_model(params, 3, 1)
    assert plan.n_trees == 12
    assert plan.tree_epsilon == pytest.approx(2.0 * 0.9 / 12)


def test_gaussian_path_matches_dp_accounting_figures():
    """The (epsilon, delta) plan: the accountant's epsilon equals what dp-accounting itself computes
    for the same events, and it spends (nearly all of) the target."""
    params = TrainParams(mode="plain", n_estimators=20, max_depth=3, dp_model=1.0, dp_delta=1e-5,
                         dp_trees="exponential")
    plan = plan_dp_model(params, 1, 2)
    assert plan.mechanism == "gaussian" and plan.level_epsilon > 0
    assert 0.99 <= plan.reported_epsilon <= 1.0
    # reference: calibrated here with literal sensitivities (g* = 1, h* = 1/4, gain 4 g*^2/h* = 16 only
    # enters through the split choices' zCDP eps^2/2, a sensitivity-free figure)
    rho, sg, sh = _reference_rho(1.0, 1e-5, 20, 3, (0.1, 0.3, 0.6), "exponential", 1.0, 0.25)
    assert plan.extra["rho"] == pytest.approx(rho, rel=1e-6)
    assert plan.leaf_gradients == pytest.approx(sg, rel=1e-6) and plan.leaf_hessians == pytest.approx(sh, rel=1e-6)
    assert plan.level_epsilon == pytest.approx(math.sqrt(2 * 0.3 * rho / 60), rel=1e-6)
    assert plan.sketch_epsilon == pytest.approx(math.sqrt(2 * 0.1 * rho), rel=1e-6)
    assert account_gaussian(gaussian_plan_event(plan), 1e-5) == pytest.approx(plan.reported_epsilon, rel=1e-12)
    # a single Gaussian event: our accountant call is the library's
    one = dp_event.GaussianDpEvent(2.0)
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(one)
    assert account_gaussian(one, 1e-6) == acc.get_epsilon(1e-6)


def test_amplification_is_the_poisson_formula():
    assert amplified(1.0, 1.0) == 1.0
    assert amplified(1.0, 0.1) == pytest.approx(math.log(1 + 0.1 * (math.e - 1)))


def test_epsilon_inf_plan_is_not_private():
    plan = plan_dp_model(TrainParams(mode="plain", dp_model="inf"), 1, 2)
    assert not plan.private and plan.binning_setup() is None
    assert plan.to_dict()["mechanism"] == "none"
    assert type(plan.binner(16)) is Binner


# --------------------------------------------------------------------------- clipping
def test_clipping_bounds_hold():
    params = TrainParams(mode="plain", objective="regression", dp_model=1.0, dp_clip=2.0)
    plan = plan_dp_model(params, 1, 1)
    assert (plan.g_star, plan.h_star) == (2.0, 1.0)
    g = np.array([[-50.0], [-2.0], [0.5], [3.0], [1e9]])
    gc, hc = plan.bound_gradients(g, np.full_like(g, 0.3))
    assert np.all(np.abs(gc) <= 2.0) and gc[2, 0] == 0.5 and np.all(hc == 1.0)
    # binary: |g| <= 1 already, dp_clip may tighten it; pseudohuber: at most the slope
    assert plan_dp_model(TrainParams(mode="plain", dp_model=1.0), 1, 1).g_star == 1.0
    assert plan_dp_model(TrainParams(mode="plain", dp_model=1.0, dp_clip=0.5), 1, 1).g_star == 0.5
    assert plan_dp_model(TrainParams(mode="plain", objective="pseudohuber", huber_slope=3.0, dp_model=1.0,
                                     dp_clip=10.0), 1, 1).g_star == 3.0


class _GradientSpy(RoundObserver):
    def __init__(self):
        self.max_g, self.h_values = 0.0, set()

    def round_started(self, gradients):
        g, h = gradients.as_float()
        self.max_g = max(self.max_g, float(np.abs(g).max()))
        self.h_values |= set(np.unique(h).tolist())


def test_training_sees_only_clipped_gradients_and_the_constant_hessian():
    a, b, c = small_frames(150)
    a["y"] = 40.0 * a["a0"] + 100.0          # residuals far above the clip
    fed = federation_from_frames([PartyFrame("a", a, "id", "y"), PartyFrame("b", b, "id"),
                                  PartyFrame("c", c, "id")])
    spy = _GradientSpy()
    fed.fit(TrainParams(mode="plain", objective="regression", n_estimators=3, max_depth=2, dp_model=5.0,
                        dp_clip=1.5), observers=[spy])
    assert 0 < spy.max_g <= 1.5
    assert spy.h_values == {1.0}


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw, match", [
    ({"dp_model": 0}, "dp_model must be > 0"),
    ({"dp_model": -1.0}, "dp_model must be > 0"),
    ({"dp_model": float("nan")}, "dp_model must be a number"),
    ({"dp_model": "lots"}, "dp_model must be a number"),
    ({"dp_model": 1.0, "dp_delta": 1.0}, r"dp_delta must be a number in \(0, 1\)"),
    ({"dp_model": 1.0, "dp_delta": 0.0}, r"dp_delta must be a number in \(0, 1\)"),
    ({"dp_model": 1.0, "dp_delta": float("nan")}, r"dp_delta must be a number in \(0, 1\)"),
    ({"dp_delta": 1e-5}, "dp_delta applies with dp_model only"),
    ({"dp_clip": 1.0}, "dp_clip applies with dp_model only"),
    ({"dp_model": 1.0, "dp_clip": 0.0}, "dp_clip must be a finite number > 0"),
    ({"dp_model": 1.0, "dp_clip": float("inf")}, "dp_clip must be a finite number > 0"),
    ({"dp_model": 1.0, "dp_budget": "1,2"}, "dp_budget must be three"),
    ({"dp_model": 1.0, "dp_budget": "0,1,1"}, "sketch and leaf shares must be > 0"),
    ({"dp_model": 1.0, "dp_budget": "a,b,c"}, "dp_budget must be three numbers"),
    ({"dp_model": 1.0, "mode": "dp", "epsilon": 1.0}, "dp_model applies to modes 'he' and 'plain'"),
    ({"dp_model": 1.0, "goss": True}, "cannot be combined with goss"),
    ({"dp_model": 1.0, "early_stopping_rounds": 3}, "cannot be combined with early_stopping_rounds"),
    ({"dp_model": 1.0, "objective": "regression"}, "needs dp_clip"),
])
def test_bad_dp_model_input_is_refused_clearly(kw, match):
    with pytest.raises(InputError, match=match):
        TrainParams(**({"mode": "plain"} | kw))


def test_budget_shares_are_normalised_and_round_trip():
    p = TrainParams(mode="plain", dp_model="inf", dp_budget=[1, 1, 2])
    assert p.dp_budget == "0.25,0.25,0.5" and math.isinf(p.dp_model)
    d = p.to_dict()
    assert d["dp_model"] == "inf"
    assert TrainParams.from_dict(d).dp_budget == "0.25,0.25,0.5"


# --------------------------------------------------------------------------- DP bin edges
def test_dp_binner_edges():
    """Edges equally spaced on the symmetric log scale between DP bounds that cover the bulk of the data
    (and no far-away empty range); a three-valued feature is separated; inf gives the exact bins."""
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(0, 1, 20_000), rng.lognormal(3, 1, 20_000), rng.integers(0, 3, 20_000)])
    X[::10, 0] = np.nan
    b = DPBinner(16, 3.0, SeededNoise(1)).fit(X)      # 1 per feature
    for j, t in enumerate(b.thresholds_):
        assert np.all(np.diff(t) > 0) and len(t) == 15
        z = np.sign(t) * np.log1p(np.abs(t))
        assert np.allclose(np.diff(z), np.diff(z)[0])                     # equal steps on the log scale
        col = X[~np.isnan(X[:, j]), j]
        if j < 2:       # continuous: the bounds cover the bulk
            assert t[0] <= np.quantile(col, 0.1) and t[-1] >= np.quantile(col, 0.9)
        assert t[0] >= np.min(col) - 1.0 and t[-1] <= 2.0 * np.max(col) + 1.0
    counts = np.bincount(b.transform(X)[:, 1].astype(int))
    assert np.count_nonzero(counts) >= 10                                 # the lognormal spreads over bins
    assert len(np.unique(b.transform(X)[:, 2])) == 3
    inf = DPBinner(16, math.inf).fit(X)
    exact = Binner(16).fit(X)
    assert all(np.array_equal(u, v) for u, v in zip(inf.thresholds_, exact.thresholds_))
    with pytest.raises(InputError):
        DPBinner(16, 0.0)


def test_dp_bounds_ignore_empty_cells_at_small_epsilon():
    """At epsilon 0.01 over 120 cells an empty cell's noise passes the threshold in about 0.5% of fits
    (by design); the bounds always hold the bulk of the data."""
    z = np.random.default_rng(0).normal(2.0, 0.3, 30_000)
    rng = SeededNoise(2)
    wide = 0
    for _ in range(400):
        lo, hi = dp_bounds(z, 0.01, rng)
        assert lo <= 1.5 and hi >= 2.5
        wide += not (0.0 <= lo and hi <= 4.0)
    assert wide <= 6


def test_dp_binner_noise_is_fresh_without_an_rng():
    X = np.random.default_rng(0).lognormal(0, 2, size=(3000, 1))
    fits = {tuple(DPBinner(16, 0.002).fit(X).thresholds_[0]) for _ in range(10)}
    assert len(fits) > 1


def test_plan_dataclass_defaults_are_not_private():
    assert not DPModelPlan(math.inf).private


def test_dp_base_scores():
    rng = np.random.default_rng(0)
    noise = SecureNoise()
    y = (rng.random(10_000) < 0.2).astype(float)
    binary = get_objective("binary")
    exact = binary.base_score(y)[0]
    assert dp_base_score(binary, y, 1e4, noise)[0] == pytest.approx(exact, abs=1e-3)
    noisy = [dp_base_score(binary, y, 0.01, noise)[0] for _ in range(50)]
    assert np.std(noisy) > 0.01 and abs(np.mean(noisy) - exact) < 0.2
    multi = get_objective("multiclass")
    yk = multi.check_labels(rng.integers(0, 3, 9000))
    assert np.allclose(dp_base_score(multi, yk, 1e4, noise), multi.base_score(yk), atol=1e-3)
    reg = get_objective("regression")
    yr = rng.normal(50.0, 5.0, 20_000)
    assert dp_base_score(reg, yr, 10.0, noise)[0] == pytest.approx(50.0, abs=0.5)


def test_cyclic_random_trees_halve_the_bin_range_without_looking_at_data():
    """dp_trees cyclic with no split budget: each node halves its bin range of the tree's feature
    (no histogram is read: None is passed for them), missing values to the right."""
    plan = _plan(n_estimators=4, dp_trees="cyclic")
    assert plan.trees == "cyclic" and plan.level_epsilon == 0
    mech = TreeMechanisms(plan, 1.0, SeededNoise(0))
    offsets = [np.array([0, 9, 12]), np.array([0, 5])]      # source 0: 8 + 2 ordinary bins; source 1: 4
    s, left_bin, right_bin = halving_levels(mech, [None, None], [None, None], offsets)
    assert (s.source_idx, s.feature_idx, s.bin_idx, s.default_left) == (0, 0, 3, False)
    assert (left_bin, right_bin) == (1, 5)
    # the next trees take the next features in turn: source 0 feature 1, then source 1 feature 0
    assert (mech.choose_split(Node(0, 0), [None, None], offsets, (1, 0), [Node(0, 0)]).feature_idx,
            mech.choose_split(Node(0, 0), [None, None], offsets, (2, 0), [Node(0, 0)]).source_idx) == (1, 1)


def test_dp_training_samples_rows_by_secret_poisson_draws():
    """subsample < 1 under --dp-model: each row joins each tree's sample independently with probability q,
    from fresh entropy (the public seed does not fix the sample, as amplification needs)."""
    params = TrainParams(mode="plain", dp_model=1.0, subsample=0.3, n_estimators=2)
    plan = plan_dp_model(params, 1, 1)
    booster = Booster([], BinaryObjective(), params, dp=plan)
    assert isinstance(booster.sampler, PoissonSampler)
    g = np.zeros((20_000, 2))
    a, _, _ = booster.sampler.draw(0, g, g)
    b, _, _ = Booster([], BinaryObjective(), params, dp=plan).sampler.draw(0, g, g)
    assert a.shape == (2, 20_000) and abs(a.mean() - 0.3) < 0.01
    assert not np.array_equal(a, b)
    assert not np.array_equal(a[0], a[1])            # independent per tree
    assert booster.sampler.draw(0, g, g)[0] is not None
    assert PoissonSampler(1.0).draw(0, g, g) == (None, None, 1.0)


# --------------------------------------------------------------------------- the mechanisms that ran
class CountingNoise(SeededNoise):
    """Records every mechanism drawn through the seam: (kind, scale, values)."""

    def __init__(self, seed, calls):
        super().__init__(seed)
        self.calls = calls

    def laplace_counts(self, counts, scale):
        self.calls.append(("laplace_counts", float(scale), int(np.size(counts))))
        return super().laplace_counts(counts, scale)

    def laplace(self, values, scale):
        self.calls.append(("laplace", float(scale), int(np.size(values))))
        return super().laplace(values, scale)

    def gaussian(self, values, scale):
        self.calls.append(("gaussian", float(scale), int(np.size(values))))
        return super().gaussian(values, scale)

    def noisy_max(self, scores, scale):
        self.calls.append(("noisy_max", float(scale), int(np.size(scores))))
        return super().noisy_max(scores, scale)


def test_the_mechanisms_that_ran_add_up_to_the_reported_epsilon(monkeypatch):
    """End to end (a federation of two parties, 3 selected trees of depth 2, binary): every draw of
    every party is recorded at the noise seam, and the epsilon they spend -- by their scales and the
    sensitivities written here (a count: 1; a leaf's gradient sum: g* = 1, hessian sum: h* = 1/4; a
    feature choice: g* = 1, epsilon = 2 Delta / scale), leaves of a tree in parallel, the rest in
    sequence -- equals the plan's reported epsilon; and the counts match the plan's shape."""
    import parties.passive_train as pt
    import vfl.core.dp_model as dm
    calls = {"active": [], "passive": []}
    monkeypatch.setattr(dm, "noise_source", lambda seed=None: CountingNoise(0, calls["active"]))
    monkeypatch.setattr(pt, "noise_source", lambda seed=None: CountingNoise(1, calls["passive"]))
    a, b, _ = small_frames(300, seed=2)
    fed = federation_from_frames([PartyFrame("a", a, "id", "y"), PartyFrame("b", b, "id")])
    T, D = 3, 2
    fed.fit(TrainParams(mode="plain", n_estimators=T, max_depth=D, dp_model=1.0))
    reported = fed.model.dp_model["epsilon"]
    act, pas = calls["active"], calls["passive"]
    kinds = [k for k, _, _ in act]
    assert kinds.count("noisy_max") == T                          # one feature choice per tree
    leaves = [c for c in act if c[0] == "laplace"]
    assert len(leaves) == 2 * T * 2 ** D                          # G~ and H~ of every leaf of full trees
    counts = [c for c in act if c[0] == "laplace_counts"]
    base = [c for c in counts if c[2] == 2]                       # the binary base score: (positives, rows)
    bins_a = [c for c in counts if c[2] == 120]                   # a DP bound histogram per feature
    assert len(base) == 1 and len(bins_a) == 2 and len(pas) == 2 and all(c[2] == 120 for c in pas)
    eps = 2 / base[0][1]                                          # two counts of sensitivity 1
    eps += sum(1 / c[1] for c in bins_a) + sum(1 / c[1] for c in pas)
    eps += sum(2 * 1.0 / c[1] for c in act if c[0] == "noisy_max")
    for t in range(T):                                            # each tree's leaves: disjoint rows
        tree = leaves[t * 2 ** (D + 1):(t + 1) * 2 ** (D + 1)]
        eps += max(1.0 / g[1] + 0.25 / h[1] for g, h in zip(tree[0::2], tree[1::2]))
    assert eps == pytest.approx(reported, rel=1e-9)
    assert reported <= 1.0 + 1e-9
