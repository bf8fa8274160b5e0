"""Scorecard points (issue 37, item 9): PDO,BASE_SCORE,BASE_ODDS scaling of a binary model's log-odds."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vfl.api import ActiveParty, Federation, PassiveParty
from vfl.core.errors import InputError
from vfl.core.scorecard import PointsScale


def test_the_textbook_scale():
    s = PointsScale.parse("20,600,50")           # 600 points at 50:1, 20 more per doubling
    p_at_base = 1 / 51                           # odds good:bad = 50
    assert s.from_proba([p_at_base])[0] == pytest.approx(600)
    assert s.from_proba([1 / 101])[0] == pytest.approx(620)        # odds 100: doubled
    assert s.from_proba([1 / 26])[0] == pytest.approx(580)         # odds 25: halved
    assert s.factor == pytest.approx(20 / math.log(2)) and s.offset == pytest.approx(600 - s.factor * math.log(50))
    assert s.from_margin([-math.log(50)])[0] == pytest.approx(600)


@given(st.floats(-30, 15), st.floats(1, 100), st.floats(0, 1000), st.floats(0.01, 1000))
def test_points_of_a_probability_equal_points_of_its_margin(margin, pdo, base, odds):
    """(Above a margin of ~15, 1 - p keeps too few digits of a float64 probability for 1e-9.)"""
    s = PointsScale(pdo, base, odds)
    p = 1 / (1 + math.exp(-margin))
    assert s.from_proba([p])[0] == pytest.approx(s.from_margin([margin])[0], rel=1e-9, abs=1e-6)


@pytest.mark.parametrize("text, msg", [
    ("20,600", "takes PDO,BASE_SCORE,BASE_ODDS"), ("a,600,50", "not a number"), ("0,600,50", "PDO"),
    ("20,600,0", "BASE_ODDS"), ("20,inf,50", "finite"),
])
def test_bad_scales_are_refused(text, msg):
    with pytest.raises(InputError, match=msg):
        PointsScale.parse(text)


def test_the_prediction_table_adds_points_for_a_binary_model_only():
    rng = np.random.default_rng(0)
    ids = np.arange(120)
    X = rng.normal(size=(120, 2))
    a = pd.DataFrame({"id": ids, "y": (X[:, 0] + X[:, 1] > 0).astype(int), "a0": X[:, 0]})
    fed = Federation(ActiveParty("a", a), [PassiveParty("b", pd.DataFrame({"id": ids, "b0": X[:, 1]}))])
    fed.fit(mode="plain", n_estimators=2, max_depth=2)
    raw = fed.predict_raw()
    proba = fed.predict_proba()
    s = PointsScale.parse("20,600,50")
    table = fed.model.prediction_table(ids, proba, "id", s)
    assert list(table.columns) == ["id", "proba", "points"]
    assert np.allclose(table.points, s.from_margin(raw[:, 0] if raw.ndim == 2 else raw))
    assert table.points.corr(table.proba, method="spearman") == pytest.approx(-1)    # more points, less risk
    fed3 = Federation(ActiveParty("a", a.assign(y=ids % 3)), [PassiveParty("b", pd.DataFrame({"id": ids,
                                                                                              "b0": X[:, 1]}))])
    fed3.fit(mode="plain", n_estimators=1, max_depth=2, objective="multiclass")
    with pytest.raises(InputError, match="binary model"):
        fed3.model.prediction_table(ids, fed3.predict_proba(), "id", s)
