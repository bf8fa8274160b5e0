"""Empirical privacy audit of the DP offers (issue 23): prints one JSON object.

For each offer, two neighbouring datasets D and D' that differ in one canary row, many releases
from each, a distinguisher that guesses D or D' from what the receiving party (or the model file)
sees, and a Clopper-Pearson lower bound on epsilon at 95% confidence:

    eps_lb = max(log(TPR_lo / FPR_hi), log((1 - FPR_hi) / (1 - TPR_lo)))

where TPR = P(guess D | D), FPR = P(guess D | D'). A sound mechanism never gives an ``eps_lb`` above
its claimed epsilon (except with 5% probability). Audits:

* ``dp_release_changed`` (finding 1): mode dp at epsilon 0.5; the canary moves from one side of a
  heavily tied value to the other, which moved the old equal-frequency bucket edges and with them
  a hundred other rows; distinguisher: how many *other* rows are reported in the first bucket.
* ``dp_release_missing`` (finding 2): the canary is missing in D' (no row is missing in D);
  distinguisher: the domain the active party is told (slots, randomized-response domain) differs
  from D's, or the canary is reported in the missing slot.
* ``dp_release_extreme``: the canary takes an extreme value (1e9, a new distinct value) in D'.
* ``dp_seeded`` (finding 3): ``vfl.api.simulate`` with the default ``--seed``; the attacker replays
  the seed: the canary's released bucket equals the one a D run gave.
* ``dp_model_leaf`` (finding 6): the released model's leaf of 3 rows (D) or 4 (D', one row added);
  distinguisher: a Mironov test of what the model file stores (the noisy sums, when it stores
  them) against numpy's Laplace sampler: D' is guessed when the stored sums cannot be D's sums plus
  a value numpy's ``laplace`` can produce.
* ``dp_model_bins_extreme``: the released model's DP bin edges of one feature, with an extreme
  canary (1e9) added in D'; distinguisher: an edge above 1000.

Run it against another checkout with ``PYTHONPATH=/that/checkout python benchmarks/dp_audit.py``
(the script uses whatever ``vfl`` is importable first). ``--trials N`` per side; the tests run it
small (tests/core/test_dp_audit.py).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

try:
    import vfl  # noqa: F401  (the checkout on PYTHONPATH, if any)
except ImportError:       # pragma: no cover - run from the repository without PYTHONPATH
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd
from scipy import stats

import parties.dp as pdp
from parties.active import ActiveParty
from parties.passive import PassiveParty
from protocols import messages as m
from vfl.api import Federation
from vfl.core.params import TrainParams

ALPHA = 0.05
CANARY_ID = 10 ** 6


# --------------------------------------------------------------------------- the bound
def clopper_pearson(k: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """Two-sided ``1 - alpha`` Clopper-Pearson interval of a binomial proportion ``k / n``."""
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def epsilon_lower_bound(tp: int, n_d: int, fp: int, n_d2: int, alpha: float = ALPHA) -> float:
    """``eps_lb`` from ``tp`` of ``n_d`` D-releases guessed D and ``fp`` of ``n_d2`` D'-releases guessed
    D (Bonferroni: each interval at ``alpha / 2``)."""
    tpr_lo, tpr_hi = clopper_pearson(tp, n_d, alpha / 2)
    fpr_lo, fpr_hi = clopper_pearson(fp, n_d2, alpha / 2)
    best = 0.0
    if fpr_hi > 0 and tpr_lo > 0:
        best = max(best, math.log(tpr_lo / fpr_hi))
    if tpr_lo < 1 and fpr_hi < 1:      # (1 - FPR) at least 1 - fpr_hi, (1 - TPR) at most 1 - tpr_lo
        best = max(best, math.log((1 - fpr_hi) / (1 - tpr_lo)))
    return best


def _result(claimed: float, guesses_d: list, guesses_d2: list, **extra) -> dict:
    tp, fp = int(sum(guesses_d)), int(sum(guesses_d2))
    lb = epsilon_lower_bound(tp, len(guesses_d), fp, len(guesses_d2))
    return {"claimed_epsilon": claimed, "epsilon_lower_bound": round(lb, 4), "trials_per_side": len(guesses_d),
            "tpr": round(tp / len(guesses_d), 4), "fpr": round(fp / len(guesses_d2), 4),
            "passes": bool(lb <= claimed), **extra}


# --------------------------------------------------------------------------- mode dp: one release
TIED = (0.0, 1.0, 2.0)        # a passive feature of heavily tied values (the canary's neighbours)


def _frames(canary: float, m_per_value: int = 100, seed: int = 0):
    rng = np.random.default_rng(seed)
    vals = np.repeat(TIED, m_per_value)
    ids = np.arange(len(vals))
    ids = np.append(ids, CANARY_ID)
    x = np.append(vals, canary)
    y = (rng.random(len(x)) < 0.5).astype(int)
    a = pd.DataFrame({"id": ids, "y": y, "a0": rng.normal(size=len(x))})
    b = pd.DataFrame({"id": ids, "b0": x})
    return a, b


class ReleaseRig:
    """One federation set up once (alignment); each trial is a fresh TrainSetup and release of the
    passive party, with the active party's own rules of whichever version of the code is imported."""

    def __init__(self, canary: float, epsilon: float, max_bin: int = 32, noise_seed=None):
        a, b = _frames(canary)
        self.fed = Federation(ActiveParty("a", a, label_col="y"), [PassiveParty("b", b)])
        if noise_seed is not None:      # NOT PRIVATE, reproducible test runs only (never the benchmark)
            self.fed.passives["b"].dp_unsafe_noise_seed = noise_seed
        self.params = TrainParams(mode="dp", epsilon=epsilon, n_estimators=1, max_depth=1, dp_select=None,
                                  max_bin=max_bin)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.fed.fit(self.params)
        st = self.fed.passives["b"]._state
        self.canary_pos = int(np.flatnonzero(np.asarray(st.ids)[st.train.rows] == CANARY_ID)[0])
        self.n = 0

    def release(self):
        """``(n_bins told at setup, DPRelease)`` of one fresh release."""
        self.n += 1
        mid = f"audit{self.n}"
        binning = pdp.dp_only_binning(self.params) if hasattr(pdp, "dp_only_binning") else None
        t = self.fed.transport
        info = t.call("b", m.TrainSetup("dp", self.params.max_bin, mid, binning, 64))
        spent = float((getattr(info, "dp_binning", None) or {}).get("epsilon", 0.0)) if binning else 0.0
        eps_f = (self.params.epsilon - spent) / len(info.n_bins)
        wanted = pdp.release_buckets_wanted(info.n_bins, eps_f, "auto")
        rel = t.call("b", m.DPReleaseRequest(mid, eps_f, wanted))
        return tuple(info.n_bins.tolist()), rel


def audit_release(kind: str, trials: int, epsilon: float = 0.5, noise_seed=None) -> dict:
    """Mode dp, one passive feature released at ``epsilon`` per row. The feature holds 100 rows each
    of 0, 1 and 2; the canary is 0 in D and 2 (changed), missing or 1e9 (extreme) in D'. With 2
    buckets (what epsilon 0.5 gets), equal-frequency edges put the 1s with the 2s in D and with the
    0s in D': a hundred rows move. Distinguisher: D' when the domain the active party is told
    (slots at setup, slots and randomized-response domain of the release) differs from D's; else,
    for a missing canary, D' when it is reported in the missing slot, otherwise by the count of the
    other rows reported in the first bucket (threshold from separate calibration releases)."""
    d2_value = {"changed": 2.0, "missing": float("nan"), "extreme": 1e9}[kind]
    seeds = (None, None) if noise_seed is None else (noise_seed, noise_seed + 1)
    rig_d, rig_d2 = ReleaseRig(0.0, epsilon, noise_seed=seeds[0]), ReleaseRig(d2_value, epsilon, noise_seed=seeds[1])

    def view(rig):
        told, rel = rig.release()
        domain = (told, tuple(rel.n_bins.tolist()), tuple(rel.rr_domain.tolist()))
        col = np.asarray(rel.buckets)[:, 0].astype(np.int64)
        return domain, int(np.sum(np.delete(col, rig.canary_pos) == 0)), \
            int(col[rig.canary_pos]) == int(rel.n_bins[0]) - 1

    cal = max(20, trials // 4)
    vd = [view(rig_d) for _ in range(cal)]
    vd2 = [view(rig_d2) for _ in range(cal)]
    domain_d = vd[0][0]
    s_d, s_d2 = np.mean([v[1] for v in vd]), np.mean([v[1] for v in vd2])
    mid, above = (s_d + s_d2) / 2, bool(s_d > s_d2)

    def guess_d(rig):
        domain, s, canary_missing = view(rig)
        if domain != domain_d:
            return False
        if kind == "missing":
            return not canary_missing
        return (s > mid) == above

    gd = [guess_d(rig_d) for _ in range(trials)]
    gd2 = [guess_d(rig_d2) for _ in range(trials)]
    return _result(epsilon, gd, gd2, distinguisher="the domain told differs from D's; else "
                   + ("the canary reported missing" if kind == "missing" else
                      "the other rows reported in the first bucket"),
                   calibration_means=[round(float(s_d), 2), round(float(s_d2), 2)])


# --------------------------------------------------------------------------- mode dp: --seed
def audit_seeded(trials: int, epsilon: float = 1.0) -> dict:
    """``vfl.api.simulate`` as a user runs it (default seed); the attacker knows the seed."""
    from vfl.api import simulate

    def canary_bucket(value):
        a, b = _frames(value, m_per_value=25)
        a = a.assign(a0=0.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fed, _, _, _ = simulate([_pf(a, "a", "y"), _pf(b, "b", None)],
                                    TrainParams(mode="dp", epsilon=epsilon, n_estimators=1, max_depth=1,
                                                dp_select=None), test_size=0.05, record=True)
        st = fed.passives["b"]._state
        pos = np.flatnonzero(np.asarray(st.ids)[st.train.rows] == CANARY_ID)
        rel = [x for x in (_loads(f) for s_, r, f in fed.transport.log if r == "a") if isinstance(x, m.DPRelease)]
        return int(rel[0].buckets[pos[0], 0]) if pos.size else None

    ref = canary_bucket(0.0)
    gd = [canary_bucket(0.0) == ref for _ in range(trials)]
    gd2 = [canary_bucket(3.0) == ref for _ in range(trials)]
    return _result(epsilon, gd, gd2, distinguisher="the canary's released bucket equals a D run's (the seed "
                                                   "replayed)")


def _pf(frame, name, label):
    from datasets.frames import PartyFrame
    return PartyFrame(name, frame, "id", label)


def _loads(frame):
    from protocols.serialization import loads
    return loads(frame)


# --------------------------------------------------------------------------- --dp-model: a leaf
def numpy_laplace_can_give(x: float, center: float, scale: float) -> bool:
    """Whether ``x == center + rng.laplace(0, scale)`` is possible with numpy's sampler (53-bit
    uniforms ``U``; ``scale * log(2U)`` below 0.5, ``-(scale * log(2 - U - U))`` above): Mironov's test."""
    base = x - center
    cands, up, down = [base], base, base
    for _ in range(6):
        up, down = float(np.nextafter(up, math.inf)), float(np.nextafter(down, -math.inf))
        cands += [up, down]
    for L in cands:
        if center + L != x:
            continue
        if L < 0:
            u = math.exp(L / scale) / 2.0
            k0 = round(u * 2.0 ** 53)
            for k in range(k0 - 3, k0 + 4):
                if 0 < k < 2 ** 52 and scale * math.log(k / 2.0 ** 53 + k / 2.0 ** 53) == L:
                    return True
        else:
            u = 1.0 - math.exp(-L / scale) / 2.0
            k0 = round(u * 2.0 ** 53)
            for k in range(k0 - 3, k0 + 4):
                uk = k / 2.0 ** 53
                if 2 ** 52 <= k < 2 ** 53 and -(scale * math.log(2.0 - uk - uk)) == L:
                    return True
    return False


def audit_model_leaf(trials: int, epsilon: float = 1.0) -> dict:
    """A released model's leaf holding 3 rows (D) or 4 (D': the canary added); what the model file
    keeps of it after the mechanisms ran (``TreeMechanisms.leaf_weight`` and ``release``)."""
    from vfl.core.dp_model import plan_dp_model
    from vfl.core.tree import Node
    params = TrainParams(mode="plain", dp_model=epsilon, n_estimators=1, max_depth=1)
    plan = plan_dp_model(params, 1, 1)
    mech = plan.tree_mechanisms(params)
    g = [0.5, -0.25, 0.75]
    d = (float(sum(g)), 3 * plan.h_star)
    d2 = (float(sum(g) + 0.5), 4 * plan.h_star)
    b_g, b_h = plan.g_star / plan.leaf_gradients, plan.h_star / plan.leaf_hessians

    class _Tree:
        def __init__(self, node):
            self.nodes = [node]

    def stored(G, H):
        node = Node(0, 0, sum_gradients=G, sum_hessians=H)
        node.is_leaf = True
        node.value = mech.leaf_weight(node)
        mech.release(_Tree(node))
        return node.sum_gradients, node.sum_hessians

    def guess_d(G_t, H_t):
        Gs, Hs = stored(G_t, H_t)
        if Gs == 0.0 and Hs == 0.0:        # nothing stored beyond the leaf value: no Mironov test
            return True
        return numpy_laplace_can_give(Gs, d[0], b_g) and numpy_laplace_can_give(Hs, d[1], b_h)

    gd = [guess_d(*d) for _ in range(trials)]
    gd2 = [guess_d(*d2) for _ in range(trials)]
    return _result(epsilon, gd, gd2, distinguisher="Mironov: can D's sums plus numpy Laplace noise give the "
                                                   "stored noisy sums?")


def audit_model_bins(trials: int, epsilon: float = 1.0) -> dict:
    """A released model's DP bin edges of one feature (what a party's lookup table holds, and what
    routing reveals): 300 typical rows (D) and the same with an extreme canary, 1e9 (D', add one
    row). Distinguisher: D' when any edge lies above 1000."""
    from vfl.core.dp_bins import DPBinner
    x = np.random.default_rng(0).normal(0.0, 1.0, 300)
    d, d2 = x[:, None], np.append(x, 1e9)[:, None]

    def guess_d(X):
        return not any(float(np.max(t)) > 1e3 for t in DPBinner(8, epsilon).fit(X).thresholds_ if len(t))

    gd = [guess_d(d) for _ in range(trials)]
    gd2 = [guess_d(d2) for _ in range(trials)]
    return _result(epsilon, gd, gd2, distinguisher="an edge above 1000")


AUDITS = {"dp_release_changed": lambda n: audit_release("changed", n),
          "dp_release_missing": lambda n: audit_release("missing", n),
          "dp_release_extreme": lambda n: audit_release("extreme", n),
          "dp_seeded": lambda n: audit_seeded(max(10, n // 10)),
          "dp_model_leaf": lambda n: audit_model_leaf(n),
          "dp_model_bins_extreme": lambda n: audit_model_bins(n)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=400, help="releases per side (dp_seeded: a tenth)")
    ap.add_argument("--only", nargs="*", choices=sorted(AUDITS), help="run these audits only")
    args = ap.parse_args(argv)
    out = {"code": str(Path(pdp.__file__).resolve().parents[1]), "alpha": ALPHA, "audits": {}}
    for name in args.only or AUDITS:
        out["audits"][name] = AUDITS[name](args.trials)
    out["all_pass"] = all(a["passes"] for a in out["audits"].values())
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
