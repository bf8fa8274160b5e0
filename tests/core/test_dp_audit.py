"""The empirical privacy audit (benchmarks/dp_audit.py, issue 23) at a small size: every DP offer's
Clopper-Pearson lower bound on epsilon stays at or below the claimed epsilon, and the audit's parts
can fail (a perfect distinguisher, numpy's float Laplace under Mironov's test)."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import dp_audit  # noqa: E402


def test_clopper_pearson_bound_reference_values():
    # exact: for k = n the lower bound is (alpha/2)^(1/n); for k = 0 the upper bound is 1 - (alpha/2)^(1/n)
    lo, hi = dp_audit.clopper_pearson(20, 20, 0.05)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 20))
    lo, hi = dp_audit.clopper_pearson(0, 20, 0.05)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 20))
    # a perfect distinguisher over 200 trials per side proves eps > 3.8 (and a coin flip proves nothing)
    perfect = dp_audit.epsilon_lower_bound(200, 200, 0, 200)
    assert perfect == pytest.approx(math.log((0.0125 ** (1 / 200)) / (1 - 0.0125 ** (1 / 200))), rel=1e-9)
    assert perfect > 3.8
    assert dp_audit.epsilon_lower_bound(100, 200, 100, 200) == 0.0


def test_mironov_test_tells_numpy_laplace_centres_apart():
    """The model-file distinguisher: numpy's float Laplace output is (nearly always) consistent with
    its true centre and often inconsistent with the neighbouring one (the low bits leak)."""
    rng = np.random.default_rng(1)
    b = 1.79
    ok = [dp_audit.numpy_laplace_can_give(float(0.75 + rng.laplace(0.0, b, size=())), 0.75, b) for _ in range(200)]
    bad = [dp_audit.numpy_laplace_can_give(float(1.0 + rng.laplace(0.0, b, size=())), 0.75, b) for _ in range(200)]
    assert np.mean(ok) > 0.97 and np.mean(bad) < 0.5


@pytest.mark.parametrize("kind", ["changed", "missing", "extreme"])
def test_dp_only_release_passes_the_audit(kind):
    # reproducible (NOT PRIVATE test noise, numpy's sampler in place of OpenDP's: same distributions)
    r = dp_audit.audit_release(kind, 60, noise_seed=7)
    assert r["trials_per_side"] == 60 and r["claimed_epsilon"] == 0.5
    assert r["epsilon_lower_bound"] <= r["claimed_epsilon"], r


def test_seeded_simulation_and_model_leaf_pass_the_audit():
    r = dp_audit.audit_seeded(20)          # 20 per side: a perfect distinguisher would prove eps > 1.4
    assert r["epsilon_lower_bound"] <= r["claimed_epsilon"], r
    leaf = dp_audit.audit_model_leaf(60)
    # the model file stores no noisy sum: nothing for the Mironov test to read
    assert leaf["fpr"] == 1.0 and leaf["epsilon_lower_bound"] == 0.0
    bins = dp_audit.audit_model_bins(60)            # DP bounds hide an extreme canary
    assert bins["epsilon_lower_bound"] <= bins["claimed_epsilon"], bins


def test_the_script_prints_one_json_object(capsys):
    import json
    assert dp_audit.main(["--trials", "20", "--only", "dp_model_leaf"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["audits"]) == {"dp_model_leaf"} and doc["all_pass"] is True
