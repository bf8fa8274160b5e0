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
  accountant (every pure-DP part as ``eps^2/2``-zCDP: the sketch and the selections, whose
  report-noisy-max with exponential noise is only ``eps``-DP, Bun-Steinke's conversion; the
  ``eps^2/8`` bound of Cesar-Rogers holds for the Gumbel form only, issue 31 finding 6),
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

import math
from dataclasses import dataclass, field

import numpy as np

from datasets.errors import InputError, ProtocolError
from vfl.core.binning import Binner
from vfl.core.dp_bins import DPBinner
from vfl.core.dp_budget import (
    BASE_SCORE_SHARE,
    DEFAULT_BUDGET,
    DEFAULT_BUDGETS,
    DP_TREES,
    LEAF_GRADIENT_SHARE,
    account_gaussian,
    account_pure,
    amplified,
    de_amplified,
    gain_sensitivity,
    gaussian_event,
    gradient_bounds,
    parse_budget,
)
from vfl.core.dp_mechanisms import PoissonSampler, TreeMechanisms, dp_base_score
from vfl.core.dp_noise import NOT_PRIVATE, NoiseSource, SecureNoise, noise_source


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
        plan.select_epsilon = math.sqrt(2.0 * shares[1] * rho / T)
    else:
        plan.level_epsilon = math.sqrt(2.0 * shares[1] * rho / (T * D))
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
