"""A differentially private released model (``--dp-model EPS``): DP-XGBoost inside the federation.

Encryption (``he``) protects what the parties send each other during training; it does nothing
for what the finished model reveals. With ``TrainParams.dp_model`` set, the trees the active
party releases are (epsilon, delta)-DP with respect to one training row (its features at every
party and its label), under add/remove-one-row neighbouring datasets.

Mechanisms (see docs/dp.md, "DP on the released model"):

* **Bounded gradients** (:meth:`DPModelPlan.bound_gradients`): ``g`` is clipped to ``[-g*, g*]``
  (binary and softmax: ``g* = 1``, nothing is clipped; pseudo-Huber: ``g* = huber_slope``;
  squared error: ``g* = dp_clip``, which the user must give) and every hessian is replaced by the
  objective's public bound ``h*`` (1/4 binary, 1/2 softmax, 1 regression). So a node's hessian sum
  is ``h* * n`` and every leaf weight and gain has a bounded sensitivity (a data-dependent
  hessian makes ``G/H`` unbounded). Leaves are Newton steps with this constant hessian.
* **Bins** (:class:`DPBinner`): each party's bin edges come from one DP histogram per feature
  (Laplace counts over fixed cells of the symmetric log scale ``sign(x) log(1 + |x|)``) that gives
  DP bounds; the edges are equally spaced on that scale between them (noisy quantiles need far
  more budget than a sketch share gives at epsilon ~ 1). Each party spends
  90% of the sketch budget / ``n_parties``, split evenly over its features (the base score
  takes the other 10%), except the features it gives public bounds or edges for
  (``dp_bins``, ``--dp-bins FILE``: :func:`check_dp_bins`), which spend nothing; what each party
  spent is recorded (:meth:`DPModelPlan.record_binning`).
* **Base score** (:func:`dp_base_score`): from noisy counts (binary, multiclass) or a noisy
  clipped mean (regression), with a share of the sketch budget.
* **Trees** (:class:`TreeMechanisms`, ``dp_trees``): ``"selected"`` (default): the active party
  picks each tree's one feature with the exponential mechanism over every party's features, the
  utility the absolute gradient sums of the feature's halving leaves from the (decrypted) root
  histograms (:func:`halving_abs_gradients`, sensitivity ``g*``), then every node halves its bin
  range of that feature (no data); ``"cyclic"``: the features in turn, halving; ``"exponential"``:
  each node's split by the exponential mechanism over the gains of every candidate of every
  party, no data-dependent validity filter, gain sensitivity ``4 g*^2 / h*``
  (:func:`gain_sensitivity`). Sampling by the Gumbel-max trick (no overflow). Trees grow to
  ``max_depth`` whatever the data (stopping on counts or gains would leak).
* **Leaves**: noisy gradient and hessian sums (Laplace, or Gaussian with ``dp_delta``),
  sensitivities ``g*`` and ``h*``; weight ``-G~ / (max(H~, floor) + lambda)`` clipped to ``g*/h*``,
  where ``floor`` (``min_child_weight`` or the hessian of as many rows as twice the gradient
  noise scale) shrinks leaves that are mostly noise.
* **Accounting** (:func:`plan_dp_model`): the budget is split between sketch, splits and leaves
  (``dp_budget``; selected trees spend the split share on their feature choices); the nodes of
  one level and the leaves of one tree are disjoint (parallel composition); levels, trees,
  rounds and classes compose sequentially. Pure epsilon: basic
  composition, with amplification by Poisson row subsampling (``subsample < 1``:
  ``log(1 + q (e^eps - 1))`` per tree; the sample is drawn from secret randomness). With
  ``dp_delta``: Gaussian leaves, everything accounted by Google's ``dp-accounting`` RDP
  accountant (exponential mechanism as ``eps^2/8``-zCDP, the pure-DP sketch as ``eps^2/2``-zCDP),
  no subsampling amplification (the library amplifies Gaussian events only).

``dp_model = inf`` is exactly the non-private training (no clipping, exact bins, argmax splits).
All noise is drawn through the mechanism seam :mod:`vfl.core.dp_noise`: OpenDP's discrete Laplace
(counts), float-safe Laplace and Gaussian (sums), report-noisy-max (selection, the exponential
mechanism's guarantee) and ``os.urandom`` bits (Poisson sampling), never seeded: the public ``seed``
parameter, recorded in the model file, never touches it (``dp_unsafe_noise_seed`` does, for tests:
the model then says NOT PRIVATE). The model file keeps only what prediction needs: leaf values and
split thresholds, never a noisy sum.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from datasets.errors import InputError, ProtocolError
from vfl.core.binning import Binner, _thresholds
from vfl.core.dp_noise import NOT_PRIVATE, NoiseSource, SecureNoise, noise_source
from vfl.core.split import SplitInfo

#: the trees of a DP model (the first is the default): one feature per tree chosen by the exponential
#: mechanism (over the absolute gradient sums of every feature's halving leaves), then halving splits;
#: one feature per tree in turn, halving splits; or splits over every feature's candidates
DP_TREES = ("selected", "cyclic", "exponential")
#: default relative shares of the budget: sketch (bin edges, base score), splits, leaves, per dp_trees:
#: selected trees spend the split share on one feature choice per tree; cyclic trees halve (no split
#: budget: Maddock et al.'s best at epsilon ~ 1); exponential trees choose every split
DEFAULT_BUDGETS = {"selected": (0.1, 0.2, 0.7), "cyclic": (0.1, 0.0, 0.9), "exponential": (0.1, 0.3, 0.6)}
DEFAULT_BUDGET = DEFAULT_BUDGETS[DP_TREES[0]]
#: share of the sketch budget spent on the base score (the rest: the parties' bin edges, evenly)
BASE_SCORE_SHARE = 0.1
#: share of a leaf's budget spent on its gradient sum (the rest on its hessian sum, i.e. its count)
LEAF_GRADIENT_SHARE = 0.8
#: the natural gradient bound g* and the constant hessian h* per objective (None: dp_clip needed)
OBJECTIVE_BOUNDS = {"binary": (1.0, 0.25), "multiclass": (1.0, 0.5), "regression": (None, 1.0),
                    "pseudohuber": ("huber_slope", 1.0)}
_SYMLOG_RANGE = 30.0          # grid of the DP bounds: sign(x) log1p(|x|) in [-30, 30] (|x| < 1e13)
_COARSE_CELLS = 120           # cells of width 0.5 on that scale


def parse_budget(value) -> tuple[float, float, float]:
    """``dp_budget``: three relative shares (sketch, splits, leaves), given as a sequence or as
    ``"0.1,0.3,0.6"``; normalised to sum 1. Sketch and leaves must be > 0; splits may be 0
    (totally random trees: uniform split choice)."""
    raw = value
    if isinstance(value, str):
        value = [v for v in value.replace(";", ",").split(",") if v.strip()]
    try:
        shares = [float(v) for v in value]
    except (TypeError, ValueError):
        raise InputError(f"parameter dp_budget must be three numbers 'sketch,splits,leaves', got {raw!r}") from None
    if len(shares) != 3 or not all(math.isfinite(s) and s >= 0 for s in shares):
        raise InputError(f"parameter dp_budget must be three finite numbers >= 0 'sketch,splits,leaves', got {raw!r}")
    if shares[0] <= 0 or shares[2] <= 0:
        raise InputError(f"parameter dp_budget: the sketch and leaf shares must be > 0, got {raw!r}")
    total = sum(shares)
    return tuple(s / total for s in shares)


def gradient_bounds(objective: str, dp_clip: float | None, huber_slope: float = 1.0) -> tuple[float, float]:
    """``(g*, h*)``: the public gradient bound (``dp_clip`` if given, at most the natural one)
    and the constant hessian of DP training."""
    g_nat, h_star = OBJECTIVE_BOUNDS[objective]
    if g_nat == "huber_slope":
        g_nat = float(huber_slope)
    if dp_clip is None:
        if g_nat is None:
            raise InputError(f"objective {objective!r} has unbounded gradients: --dp-model needs dp_clip "
                             "(--dp-clip), the public bound g* to which every residual is clipped")
        return float(g_nat), float(h_star)
    return (float(dp_clip) if g_nat is None else min(float(dp_clip), float(g_nat))), float(h_star)


def gain_sensitivity(g_star: float, h_star: float) -> float:
    """Sensitivity of one candidate's gain ``GL^2/(HL+l) + GR^2/(HR+l) - G^2/(H+l)`` when one row
    with ``|g| <= g*`` and constant hessian ``h*`` is added or removed (any ``lambda >= 0``).

    With ``a = H + lambda``, ``r = G/a`` (``|r| <= g*/h*``) and ``t = g/h*``, adding the row
    changes one score by ``h* (t^2 - a/(a+h*) (r - t)^2)``; the row enters the parent and one
    child, so the gain moves by ``h* (w_P (r_P - t)^2 - w_C (r_C - t)^2)`` with ``w`` in [0, 1)
    and ``(r - t)^2 <= 4 (g*/h*)^2``: at most ``4 g*^2 / h*`` (a bound approached by an empty
    child next to a parent of opposite gradients; tests/core/test_dp_model.py searches for it)."""
    return 4.0 * g_star * g_star / h_star


def amplified(epsilon: float, q: float) -> float:
    """Epsilon of an epsilon-DP mechanism run on a Poisson sample of rate ``q`` (add/remove)."""
    if q >= 1.0:
        return epsilon
    return math.log1p(q * math.expm1(epsilon))


def de_amplified(epsilon: float, q: float) -> float:
    """The inverse of :func:`amplified`: what a mechanism may spend on the sample."""
    if q >= 1.0:
        return epsilon
    return math.log1p(math.expm1(epsilon) / q)


def account_pure(sketch: float, level: float, depth: int, leaf_gradients: float, leaf_hessians: float,
                 n_trees: int, q: float = 1.0, select: float = 0.0) -> float:
    """Total epsilon by basic composition: the sketch, then ``n_trees`` trees of one feature choice
    (``select``, ``dp_trees = "selected"``), ``depth`` levels (the nodes of a level are disjoint:
    one ``level`` each) and one leaf release (the gradient and hessian sums of the disjoint
    leaves), each tree amplified by Poisson sampling of rate q."""
    tree = select + depth * level + leaf_gradients + leaf_hessians
    return sketch + n_trees * amplified(tree, q)


# --------------------------------------------------------------------------- (epsilon, delta) path
def _accounting():
    """Google's dp-accounting (the ``[dp]`` extra), imported on use."""
    try:
        from dp_accounting import dp_event
        from dp_accounting.rdp import rdp_privacy_accountant
    except ImportError:     # pragma: no cover - the extra is installed in CI
        raise InputError("dp_delta (Gaussian mechanisms) needs Google's dp-accounting: "
                         "pip install 'vfl-boost[dp]'") from None
    return dp_event, rdp_privacy_accountant


def gaussian_event(sketch_epsilon: float, level_epsilon: float, depth: int, sigma_gradients: float,
                   sigma_hessians: float, g_star: float, h_star: float, n_trees: int, select_epsilon: float = 0.0):
    """The whole training as a ``dp_accounting`` event: the pure-DP sketch (``eps^2/2``-zCDP),
    per tree one feature choice and ``depth`` exponential mechanisms (``eps^2/8``-zCDP each,
    Cesar and Rogers 2021) and the Gaussian leaf sums (noise multipliers ``sigma / sensitivity``)."""
    dp_event, _ = _accounting()
    tree = [dp_event.GaussianDpEvent(sigma_gradients / g_star), dp_event.GaussianDpEvent(sigma_hessians / h_star)]
    if level_epsilon > 0:
        tree.append(dp_event.SelfComposedDpEvent(dp_event.ZCDpEvent(level_epsilon ** 2 / 8.0), depth))
    if select_epsilon > 0:
        tree.append(dp_event.ZCDpEvent(select_epsilon ** 2 / 8.0))
    return dp_event.ComposedDpEvent([dp_event.ZCDpEvent(sketch_epsilon ** 2 / 2.0),
                                     dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent(tree), n_trees)])


def account_gaussian(event, delta: float) -> float:
    """Epsilon at ``delta`` of ``event`` by the RDP accountant of ``dp_accounting``."""
    _, rdp = _accounting()
    acc = rdp.RdpAccountant()
    acc.compose(event)
    return float(acc.get_epsilon(delta))


# --------------------------------------------------------------------------- the plan
@dataclass
class DPModelPlan:
    """The budget of one DP training and the mechanisms' parameters (recorded in the model file)."""

    epsilon: float                       # the total asked for (inf: non-private)
    delta: float | None = None
    mechanism: str = "none"              # "laplace", "gaussian" or "none" (epsilon inf)
    g_star: float = 0.0
    h_star: float = 0.0
    n_trees: int = 0                     # rounds x targets
    depth: int = 0
    subsample: float = 1.0
    shares: tuple = DEFAULT_BUDGET
    sketch_epsilon: float = 0.0          # all parties' bin edges together (pure epsilon)
    sketch_epsilon_per_party: float = 0.0
    base_epsilon: float = 0.0            # the base score's share of the sketch budget
    level_epsilon: float = 0.0           # the exponential mechanism at every node of one level
    select_epsilon: float = 0.0          # dp_trees "selected": the exponential mechanism choosing a tree's feature
    leaf_gradients: float = 0.0          # Laplace: epsilon; Gaussian: sigma of the gradient sums
    leaf_hessians: float = 0.0           # Laplace: epsilon; Gaussian: sigma of the hessian sums
    tree_epsilon: float = 0.0            # one tree's pure epsilon before amplification (Laplace)
    reported_epsilon: float = math.inf   # what the accountant reports for the whole training
    parties: int = 1
    trees: str = DP_TREES[0]            # "selected"/"cyclic": one feature per tree; "exponential": every feature
    n_targets: int = 1
    extra: dict = field(default_factory=dict)
    noise: NoiseSource = field(default_factory=SecureNoise)     # where every mechanism draws (never seeded)

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    @property
    def gain_sensitivity(self) -> float:
        return gain_sensitivity(self.g_star, self.h_star)

    def to_dict(self) -> dict:
        if not self.private:
            return {"epsilon": "inf", "mechanism": "none",
                    "note": "epsilon inf: the non-private training (exact bins, argmax splits, exact leaves)"}
        d = {"epsilon": self.reported_epsilon, "epsilon_target": self.epsilon, "delta": self.delta,
             "mechanism": self.mechanism,
             "accounting": ("basic composition (pure epsilon)" + (", Poisson subsampling amplification"
                                                                  if self.subsample < 1 else "")
                            if self.mechanism == "laplace" else "dp-accounting RDP (zCDP events + Gaussian)"),
             "privacy_unit": "one training row (its features at every party and its label), add/remove",
             "noise": self.noise.label(), **({} if self.noise.private else {"privacy": NOT_PRIVATE}),
             "gradient_bound": self.g_star, "constant_hessian": self.h_star,
             "gain_sensitivity": self.gain_sensitivity, "n_trees": self.n_trees, "max_depth": self.depth,
             "subsample": self.subsample, "budget_shares": {"sketch": self.shares[0], "splits": self.shares[1],
                                                            "leaves": self.shares[2]},
             "sketch": {"epsilon_total": self.sketch_epsilon, "epsilon_per_party": self.sketch_epsilon_per_party,
                        "parties": self.parties, "base_score_epsilon": self.base_epsilon,
                        "mechanism": "laplace histogram per feature (DP bounds), edges equally spaced on the "
                                     "symmetric log scale"},
             "per_tree": {"split_epsilon_per_level": self.level_epsilon, "levels": self.depth,
                          "split_mechanism": ("halving each node's bin range of the tree's feature (no data)"
                                              if self.level_epsilon == 0 and self.trees != "exponential"
                                              else "uniform (totally random splits)" if self.level_epsilon == 0
                                              else "exponential (Gumbel-max)"),
                          "split_features": {"exponential": "all features",
                                             "cyclic": "one feature per tree, in turn over every party's features",
                                             "selected": "one feature per tree, chosen by the exponential mechanism "
                                                         "over the absolute gradient sums of the leaves of every "
                                                         "feature's halving tree"
                                             }[self.trees]}}
        if self.trees == "selected":
            d["per_tree"]["feature_choice_epsilon"] = self.select_epsilon
        if self.mechanism == "laplace":
            d["per_tree"].update({"leaf_gradient_epsilon": self.leaf_gradients,
                                  "leaf_hessian_epsilon": self.leaf_hessians,
                                  "leaf_mechanism": "laplace", "epsilon": self.tree_epsilon,
                                  "epsilon_after_sampling": amplified(self.tree_epsilon, self.subsample)})
        else:
            d["per_tree"].update({"leaf_gradient_sigma": self.leaf_gradients,
                                  "leaf_hessian_sigma": self.leaf_hessians, "leaf_mechanism": "gaussian"})
        extra = dict(self.extra)
        if "sketch_parties" in extra:       # what each party's bin edges spent (public bins: nothing)
            d["sketch"]["per_party"] = extra.pop("sketch_parties")
            d["sketch"]["epsilon_spent"] = extra.pop("sketch_epsilon_spent")
            d["sketch"]["public_bins"] = ("user-given public bounds or edges spend no budget; the reported "
                                          "epsilon counts what the parties' DP edges spent")
        d.update(extra)
        return d

    # -- what the parties use ---------------------------------------------------
    def binning_setup(self) -> dict | None:
        """The DP settings a passive party needs at setup (``TrainSetup.dp_binning``): its sketch budget
        and the training's total (what its lifetime ledger charges, parties.dp_ledger)."""
        return {"epsilon": self.sketch_epsilon_per_party, "training_epsilon": self.reported_epsilon} \
            if self.private else None

    def binner(self, max_bin: int, public: dict | None = None, party: str = "") -> Binner:
        """A party's binner: DP edges with its sketch share, except on ``public`` features
        (``{feature index: entry}``, user-given bounds or edges: no budget)."""
        return DPBinner(max_bin, self.sketch_epsilon_per_party, self.noise, public=public, party=party) \
            if self.private else Binner(max_bin)

    def record_binning(self, reports: dict) -> None:
        """What each party's bin edges spent (``{party: DPBinner.report()}``, a passive party's from its
        ``BinningInfo``): a party whose every feature has public bins spends none of its share, and
        the reported epsilon drops by what was not spent (the plan's other parts are unchanged)."""
        if not self.private:
            return
        checked = {}
        for party, r in reports.items():
            ok = isinstance(r, dict) and set(r) == {"epsilon", "dp_features", "public_features"} and all(
                not isinstance(r[k], bool) and isinstance(r[k], (int, float)) and math.isfinite(r[k]) and r[k] >= 0
                for k in r) and r["epsilon"] <= self.sketch_epsilon_per_party * (1 + 1e-9)
            if not ok:
                raise ProtocolError(f"party {party!r} reported its DP binning as {r!r}: expected "
                                    f"{{'epsilon': at most {self.sketch_epsilon_per_party}, 'dp_features': n, "
                                    "'public_features': n}")
            checked[party] = {"epsilon": float(r["epsilon"]), "dp_features": int(r["dp_features"]),
                              "public_features": int(r["public_features"])}
        self.extra["sketch_parties"] = checked
        spent = self.base_epsilon + sum(r["epsilon"] for r in checked.values())
        self.extra["sketch_epsilon_spent"] = spent
        if self.mechanism == "laplace":
            self.reported_epsilon = account_pure(spent, self.level_epsilon, self.depth, self.leaf_gradients,
                                                 self.leaf_hessians, self.n_trees, self.subsample,
                                                 self.select_epsilon)
        else:
            self.reported_epsilon = account_gaussian(
                gaussian_event(spent, self.level_epsilon, self.depth, self.leaf_gradients, self.leaf_hessians,
                               self.g_star, self.h_star, self.n_trees, self.select_epsilon), self.delta)

    def bound_gradients(self, g: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Clip ``g`` to ``[-g*, g*]`` and replace every hessian by ``h*``."""
        return np.clip(g, -self.g_star, self.g_star), np.full_like(h, self.h_star)

    def base_score(self, objective, y: np.ndarray) -> np.ndarray:
        """The released base score from noisy statistics (:func:`dp_base_score`) with its budget
        ``base_epsilon``; the exact one when not private."""
        if not self.private:
            return objective.base_score(y)
        return dp_base_score(objective, y, self.base_epsilon, self.noise)

    def tree_mechanisms(self, params) -> "TreeMechanisms":
        return TreeMechanisms(self, params.reg_lambda, self.noise, params.min_child_weight)

    def sampler(self) -> "PoissonSampler":
        return PoissonSampler(self.subsample, self.noise)


def plan_dp_model(params, n_targets: int, n_parties: int) -> DPModelPlan:
    """The budget plan of ``params`` (``dp_model``, ``dp_delta``, ``dp_budget``, ``dp_clip``) for
    ``n_targets`` trees per round and ``n_parties`` parties holding features."""
    eps = params.dp_model
    if eps is None or not math.isfinite(eps):
        return DPModelPlan(math.inf)
    g_star, h_star = gradient_bounds(params.objective, params.dp_clip, params.huber_slope)
    shares = parse_budget(params.dp_budget) if params.dp_budget is not None else DEFAULT_BUDGETS[params.dp_trees]
    T, D, q = int(params.n_estimators) * int(n_targets), int(params.max_depth), float(params.subsample)
    n_parties = max(int(n_parties), 1)
    plan = DPModelPlan(eps, params.dp_delta, "laplace" if params.dp_delta is None else "gaussian",
                       g_star, h_star, T, D, q, shares, parties=n_parties, trees=params.dp_trees,
                       n_targets=int(n_targets), noise=noise_source(params.dp_unsafe_noise_seed))
    if params.dp_delta is None:
        plan.sketch_epsilon = shares[0] * eps
        tree_amp = (shares[1] + shares[2]) * eps / T
        plan.tree_epsilon = de_amplified(tree_amp, q)
        split_part = plan.tree_epsilon * shares[1] / (shares[1] + shares[2])
        leaf_part = plan.tree_epsilon - split_part
        if params.dp_trees == "selected":       # the split share buys one feature choice per tree
            plan.select_epsilon = split_part
        else:
            plan.level_epsilon = split_part / D
        plan.leaf_gradients = LEAF_GRADIENT_SHARE * leaf_part
        plan.leaf_hessians = leaf_part - plan.leaf_gradients
        plan.reported_epsilon = account_pure(plan.sketch_epsilon, plan.level_epsilon, D, plan.leaf_gradients,
                                             plan.leaf_hessians, T, q, plan.select_epsilon)
    else:
        _calibrate_gaussian(plan, eps, params.dp_delta, shares)
    plan.base_epsilon = BASE_SCORE_SHARE * plan.sketch_epsilon
    plan.sketch_epsilon_per_party = (plan.sketch_epsilon - plan.base_epsilon) / n_parties
    return plan


def _gaussian_parts(plan: DPModelPlan, rho: float, shares) -> None:
    """Parameters of every mechanism when the training spends ``rho`` (zCDP) in total."""
    T, D = plan.n_trees, plan.depth
    plan.sketch_epsilon = math.sqrt(2.0 * shares[0] * rho)
    if plan.trees == "selected":
        plan.select_epsilon = math.sqrt(8.0 * shares[1] * rho / T)
    else:
        plan.level_epsilon = math.sqrt(8.0 * shares[1] * rho / (T * D))
    leaf = shares[2] * rho / T
    rho_g, rho_h = LEAF_GRADIENT_SHARE * leaf, (1 - LEAF_GRADIENT_SHARE) * leaf
    plan.leaf_gradients = plan.g_star / math.sqrt(2.0 * rho_g)
    plan.leaf_hessians = plan.h_star / math.sqrt(2.0 * rho_h)


def gaussian_plan_event(plan: DPModelPlan):
    return gaussian_event(plan.sketch_epsilon, plan.level_epsilon, plan.depth, plan.leaf_gradients,
                          plan.leaf_hessians, plan.g_star, plan.h_star, plan.n_trees, plan.select_epsilon)


def _calibrate_gaussian(plan: DPModelPlan, eps: float, delta: float, shares) -> None:
    """The largest total zCDP ``rho`` whose accounted epsilon (dp-accounting) is at most ``eps``."""
    def spent(rho):
        _gaussian_parts(plan, rho, shares)
        return account_gaussian(gaussian_plan_event(plan), delta)

    lo, hi = 0.0, max(eps, 1e-3)
    while spent(hi) < eps:
        lo, hi = hi, hi * 2.0
        if hi > 1e9:
            break
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if spent(mid) <= eps:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * hi:
            break
    if lo <= 0:
        raise InputError(f"dp_model {eps} at dp_delta {delta} leaves no budget for any mechanism")
    plan.reported_epsilon = spent(lo)
    plan.extra["rho"] = lo


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
    and what the released tree keeps (no exact statistics)."""

    def __init__(self, plan: DPModelPlan, reg_lambda: float, noise: NoiseSource | None = None,
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


# --------------------------------------------------------------------------- DP bin edges
def _symlog(x):
    return np.sign(x) * np.log1p(np.abs(x))


def _symexp(z):
    return np.sign(z) * np.expm1(np.abs(z))


def dp_bounds(z: np.ndarray, epsilon: float, noise: NoiseSource, sensitivity: float = 1.0) -> tuple[float, float]:
    """``epsilon``-DP bounds of ``z`` (symmetric-log values): a Laplace histogram over fixed cells of
    [-R, R] (a row changes one count by one under add/remove: ``sensitivity`` 1; a changed row moves
    between two cells: 2), then, as post-processing, the span of the cells whose noisy count passes
    ``tau = sensitivity ln(cells / 0.01) / epsilon`` (so an empty cell passes with probability about
    1/200 over all cells); none passes: the noisiest-max cell. Discrete Laplace counts."""
    cells = _COARSE_CELLS
    width = 2 * _SYMLOG_RANGE / cells
    counts = np.bincount(np.clip(((z + _SYMLOG_RANGE) / width).astype(np.int64), 0, cells - 1),
                         minlength=cells)
    scale = sensitivity / epsilon
    noisy = noise.laplace_counts(counts, scale).astype(np.float64)
    keep = np.flatnonzero(noisy > sensitivity * math.log(cells / 0.01) / epsilon)
    if keep.size == 0:
        keep = np.array([int(np.argmax(noisy))])
    return -_SYMLOG_RANGE + keep[0] * width, -_SYMLOG_RANGE + (keep[-1] + 1) * width


def dp_thresholds(col: np.ndarray, max_bin: int, epsilon: float, noise: NoiseSource) -> np.ndarray:
    """DP bin edges of one feature: ``max_bin - 1`` edges equally spaced on the symmetric log scale
    ``sign(x) log(1 + |x|)`` between ``epsilon``-DP bounds (:func:`dp_bounds`); values outside fall
    in the first or last bin. NaN (missing) rows take no part."""
    z = _symlog(col[~np.isnan(col)])
    lo, hi = dp_bounds(z, epsilon, noise)
    inner = np.linspace(lo, hi, max_bin + 1)[1:-1]
    return np.unique(_symexp(inner))


# --------------------------------------------------------------------------- user-given public bins
def read_dp_bins(path) -> dict:
    """A ``--dp-bins`` file: JSON ``{column: {"lo": x, "hi": y} | {"edges": [...]}}`` of public
    bounds or bin edges, checked (:func:`check_dp_bins`); errors name the file (line, column of a
    JSON syntax error) and the column."""
    where = f"--dp-bins file {str(path)!r}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: cannot be read ({exc})") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply") from None
    return check_dp_bins(spec, where)


def _finite_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def check_dp_bins(spec, where: str = "dp_bins") -> dict:
    """Public bins per column, checked and normalised: ``{column: {"lo": float, "hi": float}}``
    (public bounds, ``lo < hi``: the edges are then placed as the DP ones, equally spaced on the
    symmetric log scale) or ``{column: {"edges": [floats]}}`` (strictly increasing, finite; a value
    ``x <= edges[i]`` falls in bin ``i`` or lower). Mode dp also reads an optional ``"missing": false``
    (the public schema says the column is never missing: its release has no missing slot), alone or
    beside the bounds or edges; a released model ignores it."""
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise InputError(f"{where}: expected an object {{column: {{\"lo\": x, \"hi\": y}} or {{\"edges\": [...]}}}}, "
                         f"got {type(spec).__name__}")
    out = {}
    for col, entry in spec.items():
        at = f"{where}, column {col!r}"
        if not isinstance(col, str) or not col:
            raise InputError(f"{where}: column names must be non-empty strings, got {col!r}")
        keys = set(entry) - {"missing"} if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or keys not in ({"lo", "hi"}, {"edges"}, set()) or not entry:
            raise InputError(f"{at}: expected {{\"lo\": x, \"hi\": y}} or {{\"edges\": [...]}} (and optionally "
                             f"\"missing\": false), got {entry!r}")
        if "missing" in entry and not isinstance(entry["missing"], bool):
            raise InputError(f"{at}: \"missing\" must be true or false, got {entry['missing']!r}")
        flag = {"missing": entry["missing"]} if "missing" in entry else {}
        if not keys:
            out[col] = flag
            continue
        if "edges" in entry:
            edges = entry["edges"]
            if not isinstance(edges, (list, tuple)) or not edges:
                raise InputError(f"{at}: \"edges\" must be a non-empty list of numbers, got {edges!r}")
            bad = [e for e in edges if not _finite_number(e)]
            if bad:
                raise InputError(f"{at}: \"edges\" must be finite numbers, got {bad[0]!r}")
            e = np.asarray(edges, dtype=np.float64)
            if np.any(np.diff(e) <= 0):
                i = int(np.flatnonzero(np.diff(e) <= 0)[0])
                raise InputError(f"{at}: \"edges\" must be strictly increasing ({edges[i]!r} then {edges[i + 1]!r})")
            out[col] = {"edges": [float(x) for x in e], **flag}
            continue
        lo, hi = entry["lo"], entry["hi"]
        if not (_finite_number(lo) and _finite_number(hi)):
            raise InputError(f"{at}: \"lo\" and \"hi\" must be finite numbers, got {lo!r} and {hi!r}")
        if not lo < hi:
            raise InputError(f"{at}: \"lo\" must be below \"hi\", got {lo!r} and {hi!r}")
        out[col] = {"lo": float(lo), "hi": float(hi), **flag}
    return out


def public_thresholds(entry: dict, max_bin: int, where: str = "dp_bins") -> np.ndarray:
    """The bin edges of one column's public bins (:func:`check_dp_bins`): the given edges (at most
    ``max_bin - 1``), or ``max_bin - 1`` edges equally spaced on the symmetric log scale between the
    public bounds (as :func:`dp_thresholds` between DP ones). No data, no budget."""
    if "edges" in entry:
        e = np.asarray(entry["edges"], dtype=np.float64)
        if e.size > max_bin - 1:
            raise InputError(f"{where}: {e.size} edges make {e.size + 1} bins, more than max_bin = {max_bin}")
        return e
    lo, hi = _symlog(np.float64(entry["lo"])), _symlog(np.float64(entry["hi"]))
    return np.unique(_symexp(np.linspace(lo, hi, max_bin + 1)[1:-1]))


def public_columns(spec: dict, feature_names: list, party: str, hint: str = "") -> dict:
    """``{feature index: entry}`` of a party's public bins; a column the party does not hold is an error."""
    unknown = [c for c in spec if c not in feature_names]
    if unknown:
        raise InputError(f"dp_bins: column {unknown[0]!r} is not a feature column of party {party!r}{hint}")
    return {feature_names.index(c): e for c, e in spec.items()}


class DPBinner(Binner):
    """A party's bins from DP histograms: ``epsilon`` for all its features together (split evenly
    over the features that need DP edges); ``public``: ``{feature index: entry}`` of user-given
    public bounds or edges (:func:`check_dp_bins`), which spend no budget; ``inf``: the exact
    quantile bins of :class:`vfl.core.binning.Binner` (public bins ignored: the non-private training)."""

    def __init__(self, max_bin: int = 32, epsilon: float = math.inf, noise: NoiseSource | None = None,
                 public: dict | None = None,
                 party: str = ""):
        super().__init__(max_bin)
        if not (isinstance(epsilon, (int, float)) and epsilon > 0) or math.isnan(epsilon):
            raise InputError(f"DP binning needs an epsilon > 0, got {epsilon!r}")
        self.epsilon = float(epsilon)
        # bounds or edges (an entry with only mode dp's "missing" flag is not a public bin)
        self.public = {j: e for j, e in (public or {}).items() if "edges" in e or "lo" in e}
        self.party = party
        self.noise = SecureNoise() if noise is None else noise
        self.spent = 0.0

    def fit(self, X) -> "DPBinner":
        X = np.asarray(X, dtype=np.float64)
        n_features = X.shape[1]
        if math.isinf(self.epsilon):
            self.thresholds_ = [_thresholds(X[:, j], self.max_bin) for j in range(n_features)]
            return self
        bad = [j for j in self.public if not (isinstance(j, (int, np.integer)) and 0 <= j < n_features)]
        if bad:
            raise InputError(f"public bins of party {self.party!r}: no feature {bad[0]!r}")
        n_dp = n_features - len(self.public)
        per = self.epsilon / max(n_dp, 1)
        self.thresholds_ = [public_thresholds(self.public[j], self.max_bin, f"public bins of party "
                                              f"{self.party!r}, feature {j}")
                            if j in self.public else dp_thresholds(X[:, j], self.max_bin, per, self.noise)
                            for j in range(n_features)]
        self.spent = self.epsilon if n_dp > 0 else 0.0
        return self

    def report(self) -> dict:
        """What the binning spent: ``{"epsilon", "dp_features", "public_features"}``."""
        n = len(self.thresholds_ or [])
        return {"epsilon": self.spent, "dp_features": n - len(self.public), "public_features": len(self.public)}
