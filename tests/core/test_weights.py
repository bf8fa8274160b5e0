"""Sample weights (issue 15, item 2): weighted gradients, weighted base scores, the fixed-point
bounds scaled by the largest weight, bad weights refused."""
import numpy as np
import pandas as pd
import pytest
from support import small_frames

from datasets.errors import InputError
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core.boosting import Booster
from vfl.core.objectives import (
    BinaryObjective,
    PseudoHuberObjective,
    SoftmaxObjective,
    SquaredErrorObjective,
    check_sample_weight,
    weighted_median,
)
from vfl.core.rounds import RoundObserver
from vfl.core.sources import LocalSource


def _duplicated(a, b, w):
    """The rows of ``a``/``b`` repeated ``w`` times (new ids)."""
    rep = np.repeat(np.arange(len(a)), w)
    a2, b2 = a.iloc[rep].reset_index(drop=True), b.iloc[rep].reset_index(drop=True)
    a2["id"] = b2["id"] = np.arange(len(rep))
    return a2, b2


@pytest.mark.parametrize("objective", ["binary", "regression"])
def test_weighted_training_equals_training_on_duplicated_rows(objective):
    # features with fewer distinct values than max_bin: the bins are the same with and without the
    # duplicates (quantile bins of many distinct values are not weighted: a passive party never
    # sees the weights)
    a, b, _ = small_frames(200, seed=5)
    a[["a0", "a1"]], b[["b0", "b1"]] = a[["a0", "a1"]].round(1), b[["b0", "b1"]].round(1)
    if objective == "regression":
        a["y"] = a["a0"] * 2 + b["b0"] + 0.1 * np.arange(200) % 3
    w = np.random.default_rng(1).integers(1, 4, size=len(a))
    # min_node_rows 1: both children of a split hold at least min_node_rows *rows* (issue 31), and a row of
    # weight 3 is one row, not three
    params = TrainParams(mode="plain", n_estimators=4, max_depth=3, objective=objective, min_child_weight=0.5,
                         max_bin=256, min_node_rows=1)
    weighted = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    weighted.fit(params, sample_weight=w)
    a2, b2 = _duplicated(a, b, w)
    dup = Federation(ActiveParty("bank", a2), [PassiveParty("telco", b2)])
    dup.fit(params)
    assert weighted.model.base_score == pytest.approx(dup.model.base_score, abs=1e-12)
    for t1, t2 in zip([t for r in weighted.model.rounds for t in r], [t for r in dup.model.rounds for t in r]):
        s1, s2 = t1.structure(), t2.structure()
        assert [n[:2] + n[3:] for n in s1] == [n[:2] + n[3:] for n in s2]     # same splits
        assert np.allclose([n[2] for n in s1], [n[2] for n in s2], atol=1e-6)  # same leaf values
    new = {"bank": a.drop(columns="y"), "telco": b}
    assert np.allclose(weighted.predict_raw(new), dup.predict_raw(new), atol=1e-5)


def test_weight_column_of_the_active_party_is_not_a_feature():
    a, b, _ = small_frames(150, seed=2)
    w = np.random.default_rng(0).integers(1, 3, size=len(a)).astype(float)
    by_col = Federation(ActiveParty("bank", a.assign(w=w), weight_col="w"), [PassiveParty("telco", b)])
    by_col.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2))
    by_arg = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    by_arg.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2), sample_weight=w)
    assert by_col.model.active_features == ["a0", "a1"]
    assert [t.structure() for r in by_col.model.rounds for t in r] == \
        [t.structure() for r in by_arg.model.rounds for t in r]
    # prediction frames may keep the weight column
    assert np.allclose(by_col.predict_proba({"bank": a.assign(w=w).drop(columns="y"), "telco": b}),
                       by_arg.predict_proba({"bank": a.drop(columns="y"), "telco": b}))


class _Grab(RoundObserver):
    def __init__(self):
        self.rounds = []

    def round_started(self, gradients):
        self.rounds.append(gradients)


def test_fixed_point_bounds_account_for_the_largest_weight():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2))
    y = (X[:, 0] > 0).astype(float)
    w = np.full(300, 1.0)
    w[7] = 5.5                                           # rounded up to 8
    grab = _Grab()
    Booster([LocalSource("a", X, ["x0", "x1"], 16)], BinaryObjective(),
            TrainParams(mode="plain", n_estimators=1, max_depth=2), [grab]).fit(y, sample_weight=w)
    g = grab.rounds[0]
    assert (g.g_bound, g.h_bound) == (8.0, 2.0)
    assert np.all(np.abs(g.g) <= g.g_bound * 2 ** g.precision_bits)
    assert abs(g.g[7, 0]) > 5 * abs(g.g[8, 0]) * (0.5 if y[7] != y[8] else 1)


def test_weighted_base_scores():
    y = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    w = np.array([1, 2, 0, 3, 1])
    rep = np.repeat(y, w)
    assert BinaryObjective().base_score(y, w) == pytest.approx(BinaryObjective().base_score(rep))
    assert SquaredErrorObjective().base_score(y, w) == pytest.approx(SquaredErrorObjective().base_score(rep))
    soft = SoftmaxObjective()
    soft.check_labels(y)
    assert soft.base_score(y, w) == pytest.approx(soft.base_score(rep))
    vals = np.array([3.0, 1.0, 2.0, 10.0])
    for ww in ([1, 1, 1, 1], [2, 1, 3, 1], [1, 4, 1, 2], [0, 1, 1, 1]):
        assert weighted_median(vals, np.array(ww, dtype=float)) == np.median(np.repeat(vals, ww))
    assert PseudoHuberObjective().base_score(vals, np.array([2.0, 1, 3, 1]))[0] == \
        np.median(np.repeat(vals, [2, 1, 3, 1]))


@pytest.mark.parametrize("w, message", [
    ([1.0, -1.0, 1.0], "1 negative weights"),
    ([1.0, np.nan, 1.0], "1 NaN/inf weights"),
    ([0.0, 0.0, 0.0], "all zero"),
    ([1.0, 1.0], "one weight per row"),
    (["a", "b", "c"], "must be numbers"),
])
def test_bad_weights_are_refused(w, message):
    with pytest.raises(InputError, match=message):
        check_sample_weight(w, 3, "bank")


def test_bad_weight_columns_are_refused_with_the_party_and_column():
    a, b, _ = small_frames(20)
    with pytest.raises(InputError, match="party 'bank'.*weight column 'w' not found"):
        ActiveParty("bank", a, weight_col="w")
    with pytest.raises(InputError, match="party 'bank'.*column 'w'.*1 negative"):
        ActiveParty("bank", a.assign(w=[-1.0] + [1.0] * 19), weight_col="w")
    with pytest.raises(InputError, match="weight column 'w' is not numeric"):
        ActiveParty("bank", a.assign(w=["x"] * 20), weight_col="w")
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    with pytest.raises(InputError, match="NaN/inf"):
        fed.fit(TrainParams(mode="plain", n_estimators=1), sample_weight=[np.nan] * 20)
    assert pd.isna(np.nan)


def test_weighted_metrics_equal_the_metrics_of_repeated_rows():
    from vfl.core import metrics
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, size=80).astype(float)
    p = np.round(rng.random(80), 1)                      # ties
    w = rng.integers(0, 4, size=80)
    w[:2] = 1
    yr, pr = np.repeat(y, w), np.repeat(p, w)
    got = metrics.weighted_metrics(("auc", "logloss", "error", "rmse", "mae"), y, p, w)
    assert got["auc"] == pytest.approx(metrics.auc(yr, pr), abs=1e-12)
    assert got["logloss"] == pytest.approx(metrics.logloss(yr, pr), abs=1e-12)
    assert got["error"] == pytest.approx(metrics.error(yr, pr), abs=1e-12)
    assert got["rmse"] == pytest.approx(metrics.rmse(yr, pr), abs=1e-12)
    assert got["mae"] == pytest.approx(metrics.mae(yr, pr), abs=1e-12)
