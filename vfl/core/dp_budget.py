"""The budget of a DP model (:mod:`vfl.core.dp_model`): the budget shares and gradient bounds,
the gain's sensitivity, privacy amplification by sampling, and the accounting of a whole training
(pure DP, or (epsilon, delta) through Google's ``dp_accounting``, the ``[dp]`` extra).
"""
from __future__ import annotations

import math

from datasets.errors import InputError

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


def pure_zcdp(epsilon: float) -> float:
    """The zCDP ``rho`` of an ``epsilon``-DP mechanism: ``epsilon^2 / 2`` (Bun and Steinke 2016,
    Proposition 1.4; what OpenDP's ``make_pureDP_to_zCDP`` returns)."""
    return float(epsilon) ** 2 / 2.0


def gaussian_event(sketch_epsilon: float, level_epsilon: float, depth: int, sigma_gradients: float,
                   sigma_hessians: float, g_star: float, h_star: float, n_trees: int, select_epsilon: float = 0.0):
    """The whole training as a ``dp_accounting`` event: the pure-DP sketch, per tree one feature
    choice and ``depth`` split choices, and the Gaussian leaf sums (noise multipliers ``sigma /
    sensitivity``). Every pure-DP part counts ``eps^2/2``-zCDP (:func:`pure_zcdp`): the choices are
    OpenDP's report-noisy-max with *exponential* noise (permute-and-flip), which is ``eps``-DP and no
    better in general; the tighter ``eps^2/8`` of Cesar and Rogers (2021) holds for the Gumbel form
    (the exponential mechanism) only (issue 31, finding 6: two candidates already give a KL of
    ``0.33 eps^2`` at ``eps = 1``)."""
    dp_event, _ = _accounting()
    tree = [dp_event.GaussianDpEvent(sigma_gradients / g_star), dp_event.GaussianDpEvent(sigma_hessians / h_star)]
    if level_epsilon > 0:
        tree.append(dp_event.SelfComposedDpEvent(dp_event.ZCDpEvent(pure_zcdp(level_epsilon)), depth))
    if select_epsilon > 0:
        tree.append(dp_event.ZCDpEvent(pure_zcdp(select_epsilon)))
    return dp_event.ComposedDpEvent([dp_event.ZCDpEvent(pure_zcdp(sketch_epsilon)),
                                     dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent(tree), n_trees)])


def account_gaussian(event, delta: float) -> float:
    """Epsilon at ``delta`` of ``event`` by the RDP accountant of ``dp_accounting``."""
    _, rdp = _accounting()
    acc = rdp.RdpAccountant()
    acc.compose(event)
    return float(acc.get_epsilon(delta))
