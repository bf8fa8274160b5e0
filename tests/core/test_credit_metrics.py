"""Credit metrics (issue 34) against independent implementations on the same predictions: KS against
scipy.stats.ks_2samp, Gini/AUC and Brier against scikit-learn, the reliability bins against
sklearn.calibration.calibration_curve; the decile table sums to the totals."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import ks_2samp
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss, roc_auc_score

from datasets.errors import InputError
from vfl.core import credit_metrics as cm


def ks_stat(a, b) -> float:
    """scipy's two-sample KS statistic (its p-value, unused here, warns on tiny samples)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return ks_2samp(a, b, method="asymp").statistic


def _data(seed, n=800, ties=False):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    p = np.clip(rng.random(n) * 0.6 + y * 0.3, 0, 1)
    return y, (np.round(p, 2) if ties else p)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ks_gini_brier_calibration_match_oracles(seed, ties):
    y, p = _data(seed, ties=ties)
    k = cm.ks(y, p)
    assert k["ks"] == pytest.approx(ks_stat(p[y == 1], p[y == 0]), abs=1e-12)
    # the threshold reaches the KS: the cut "score > t" separates the classes by exactly that much
    t = k["threshold"]
    assert abs(np.mean(p[y == 0] <= t) - np.mean(p[y == 1] <= t)) == pytest.approx(k["ks"], abs=1e-12)
    assert cm.gini(y, p) == pytest.approx(2 * roc_auc_score(y, p) - 1, abs=1e-12)
    assert cm.brier(y, p) == pytest.approx(brier_score_loss(y, p), abs=1e-12)
    for n_bins in (5, 10, 17):
        bins = cm.calibration(y, p, n_bins)["bins"]
        prob_true, prob_pred = calibration_curve(y, p, n_bins=n_bins, strategy="uniform")
        np.testing.assert_allclose([b["event_rate"] for b in bins], prob_true, atol=1e-12)
        np.testing.assert_allclose([b["mean_predicted"] for b in bins], prob_pred, atol=1e-12)
        assert sum(b["rows"] for b in bins) == len(y)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 20)), min_size=2, max_size=120))
def test_ks_and_auc_property(rows):
    y = np.array([r[0] for r in rows])
    p = np.array([r[1] / 20 for r in rows])
    k = cm.ks(y, p)
    if 0 < y.sum() < len(y):
        assert k["ks"] == pytest.approx(ks_stat(p[y == 1], p[y == 0]), abs=1e-12)
        assert cm.gini(y, p) == pytest.approx(2 * roc_auc_score(y, p) - 1, abs=1e-12)
    else:
        assert k == {"ks": None, "threshold": None}
        assert cm.gini(y, p) is None
    table = cm.decile_table(y, p)
    assert sum(r["rows"] for r in table) == len(y)
    assert sum(r["events"] for r in table) == y.sum()


@pytest.mark.parametrize("n", [7, 10, 1003])
def test_decile_table_sums_to_totals(n):
    y, p = _data(3, n)
    table = cm.decile_table(y, p)
    assert len(table) == min(10, n)
    assert sum(r["rows"] for r in table) == n and table[-1]["cum_rows"] == n
    assert sum(r["events"] for r in table) == y.sum() == table[-1]["cum_events"]
    assert table[-1]["cum_capture"] == pytest.approx(1.0) and table[-1]["cum_lift"] == pytest.approx(1.0)
    sizes = [r["rows"] for r in table]
    assert max(sizes) - min(sizes) <= 1
    # decile 1 holds the highest scores, and lift is its event rate over the overall one
    assert table[0]["min_score"] >= table[-1]["max_score"]
    assert table[0]["lift"] == pytest.approx(table[0]["event_rate"] / y.mean())
    assert [r["cum_capture"] for r in table] == sorted(r["cum_capture"] for r in table)


def test_report_shapes_multiclass_regression_segments():
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 3, 300)
    proba = rng.dirichlet([1, 1, 1], 300)
    r = cm.credit_report("multiclass", codes, proba, classes=["a", "b", "c"])
    assert set(r["overall"]["per_class"]) == {"a", "b", "c"}
    b = r["overall"]["per_class"]["b"]
    assert b["auc"] == pytest.approx(roc_auc_score(codes == 1, proba[:, 1]))
    yr = rng.normal(size=300)
    reg = cm.credit_report("regression", yr, yr + rng.normal(size=300))
    assert sum(d["events"] for d in reg["overall"]["deciles"]) == pytest.approx(yr.sum())
    y, p = _data(6, 300)
    seg = np.where(np.arange(300) % 3 == 0, "x", "y").astype(object)
    seg[5] = None
    s = cm.credit_report("binary", y, p, segments=seg, segment_name="region")
    assert set(s["segments"]) == {"x", "y", "(missing)"}
    assert sum(v["n"] for v in s["segments"].values()) == 300
    assert s["segments"]["x"]["ks"] == pytest.approx(cm.ks(y[seg == "x"], p[seg == "x"])["ks"])


def test_bad_input_is_named():
    with pytest.raises(InputError, match="labels 0 and 1"):
        cm.ks([0, 2], [0.1, 0.2])
    with pytest.raises(InputError, match="differ in length"):
        cm.decile_table([0, 1], [0.1])
    with pytest.raises(InputError, match="3 values for 2 rows"):
        cm.credit_report("binary", [0, 1], [0.2, 0.7], segments=[1, 2, 3], segment_name="s")
