"""User-given public bounds or bin edges for a DP released model (``dp_bins``, ``--dp-bins FILE``):
used exactly, no sketch budget spent on them, accounting per party, clear errors for bad input."""
import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st
from support import JSON_VALUES, mutated

from datasets.errors import InputError, ProtocolError
from vfl.core.dp_bins import DPBinner
from vfl.core.dp_bins_file import check_dp_bins, public_thresholds, read_dp_bins
from vfl.core.dp_budget import account_pure
from vfl.core.dp_model import plan_dp_model
from vfl.core.dp_noise import SeededNoise
from vfl.core.params import TrainParams

GOOD = {"age": {"lo": 18, "hi": 90}, "income": {"edges": [0, 1000.5, 20000, 1e6]}}


def test_public_edges_are_used_exactly_and_spend_no_budget():
    """Given edges are the thresholds as given; public bounds give max_bin - 1 edges equally spaced on
    the symmetric log scale between them; only the other features spend the party's epsilon (all of
    it, split over them); a party with public bins for every feature spends nothing."""
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(50, 10, 5000), rng.lognormal(8, 1, 5000), rng.normal(0, 1, 5000)])
    public = {0: {"lo": 18.0, "hi": 90.0}, 1: {"edges": [0.0, 1000.5, 20000.0, 1e6]}}
    b = DPBinner(16, 0.6, SeededNoise(1), public=public, party="p").fit(X)
    assert np.array_equal(b.thresholds_[1], [0.0, 1000.5, 20000.0, 1e6])
    t0 = b.thresholds_[0]
    z = np.log1p(t0)
    assert len(t0) == 15 and np.allclose(np.diff(z), (np.log1p(90) - np.log1p(18)) / 16)
    assert t0[0] == pytest.approx(np.expm1(np.log1p(18) + (np.log1p(90) - np.log1p(18)) / 16))
    assert np.array_equal(public_thresholds(public[0], 16), t0)
    assert b.report() == {"epsilon": 0.6, "dp_features": 1, "public_features": 2}
    # the one DP feature gets the whole 0.6: its bounds are those of a DP fit at 0.6 with the same noise
    alone = DPBinner(16, 0.6, SeededNoise(1)).fit(X[:, 2:])
    assert np.array_equal(b.thresholds_[2], alone.thresholds_[0])
    # every feature public: no data is read at all (NaN everywhere would still bin), nothing spent
    allpub = DPBinner(16, 0.6, public={0: public[0], 1: public[1], 2: {"edges": [0.0]}}).fit(np.full((10, 3), np.nan))
    assert allpub.report() == {"epsilon": 0.0, "dp_features": 0, "public_features": 3}
    assert np.array_equal(allpub.thresholds_[2], [0.0])
    # epsilon inf: the exact (non-private) bins, public bins ignored
    exact = DPBinner(16, math.inf, public=public).fit(X)
    assert not np.array_equal(exact.thresholds_[1], [0.0, 1000.5, 20000.0, 1e6])


def test_public_edges_bin_values_as_documented():
    b = DPBinner(8, 1.0, public={0: {"edges": [1.0, 2.0]}}).fit(np.array([[0.0], [1.0], [1.5], [2.0], [3.0], [np.nan]]))
    assert b.transform(np.array([[0.0], [1.0], [1.5], [2.0], [3.0], [np.nan]]))[:, 0].tolist() == [0, 0, 1, 1, 2, 3]


def test_too_many_edges_for_max_bin_is_refused():
    with pytest.raises(InputError, match="4 edges make 5 bins, more than max_bin = 4"):
        DPBinner(4, 1.0, public={0: {"edges": [1, 2, 3, 4]}}, party="passive").fit(np.zeros((5, 1)))


def test_plan_records_what_each_party_spent_and_reports_the_epsilon_by_hand():
    """dp_model 1, 2 trees of depth 2, default budget 0.1,0,0.9, 3 parties: sketch 0.1 = base 0.01 +
    0.03 per party. Party 'b' gives public bins for all its features (spends 0), 'c' for some (spends
    its 0.03): epsilon = 0.01 + 0.03 + 0 + 0.03 + 2 x 0.45 = 0.97."""
    plan = plan_dp_model(TrainParams(mode="plain", n_estimators=2, max_depth=2, dp_model=1.0), 1, 3)
    assert plan.sketch_epsilon_per_party == pytest.approx(0.03)
    plan.record_binning({"a": {"epsilon": 0.03, "dp_features": 2, "public_features": 0},
                         "b": {"epsilon": 0.0, "dp_features": 0, "public_features": 2},
                         "c": {"epsilon": 0.03, "dp_features": 1, "public_features": 1}})
    assert plan.reported_epsilon == pytest.approx(0.97)
    assert account_pure(0.07, 0.0, 2, 0.36, 0.09, 2) == pytest.approx(0.97)
    d = plan.to_dict()
    assert d["epsilon"] == pytest.approx(0.97) and d["epsilon_target"] == 1.0
    assert d["sketch"]["epsilon_spent"] == pytest.approx(0.07)
    assert d["sketch"]["per_party"]["b"] == {"epsilon": 0.0, "dp_features": 0, "public_features": 2}
    # a party claiming more than its share, or a malformed report, is a protocol error
    for bad in ({"epsilon": 0.5, "dp_features": 1, "public_features": 0}, {"epsilon": 0.01},
                {"epsilon": float("nan"), "dp_features": 1, "public_features": 0}, None,
                {"epsilon": True, "dp_features": 1, "public_features": 0}):
        with pytest.raises(ProtocolError, match="party 'x' reported its DP binning"):
            plan.record_binning({"x": bad})


def test_gaussian_plan_recounts_the_unspent_sketch_with_dp_accounting():
    plan = plan_dp_model(TrainParams(mode="plain", n_estimators=5, max_depth=2, dp_model=2.0, dp_delta=1e-5), 1, 2)
    full = plan.reported_epsilon
    plan.record_binning({"a": {"epsilon": 0.0, "dp_features": 0, "public_features": 3},
                         "b": {"epsilon": plan.sketch_epsilon_per_party, "dp_features": 2, "public_features": 0}})
    # reference, written out with dp-accounting's own events and literal sensitivities (binary: g* = 1,
    # h* = 1/4): the spent sketch (base score + party b's share, pure eps -> eps^2/2 zCDP), then 5 trees
    # of one feature choice (pure eps -> eps^2/2 zCDP) and the Gaussian leaf sums
    spent_sketch = plan.base_epsilon + plan.sketch_epsilon_per_party
    tree = dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(plan.leaf_gradients / 1.0),
                                     dp_event.GaussianDpEvent(plan.leaf_hessians / 0.25),
                                     dp_event.ZCDpEvent(plan.select_epsilon ** 2 / 2)])
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.ComposedDpEvent([dp_event.ZCDpEvent(spent_sketch ** 2 / 2),
                                          dp_event.SelfComposedDpEvent(tree, 5)]))
    assert plan.reported_epsilon == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9) and plan.reported_epsilon < full
    assert spent_sketch == pytest.approx(0.1 * plan.sketch_epsilon + 0.9 * plan.sketch_epsilon / 2)


def test_check_dp_bins_normalises():
    assert check_dp_bins(GOOD) == {"age": {"lo": 18.0, "hi": 90.0}, "income": {"edges": [0.0, 1000.5, 20000.0, 1e6]}}
    assert check_dp_bins(None) == {} and check_dp_bins({}) == {}


@pytest.mark.parametrize("spec, match", [
    ([1, 2], "expected an object"),
    ({"age": [18, 90]}, "column 'age': expected"),
    ({"age": {"lo": 18}}, "column 'age': expected"),
    ({"age": {"lo": 1, "hi": 2, "edges": [1]}}, "column 'age': expected"),
    ({"age": {"lo": 90, "hi": 18}}, "column 'age': \"lo\" must be below \"hi\", got 90 and 18"),
    ({"age": {"lo": 1, "hi": 1}}, "must be below"),
    ({"age": {"lo": "a", "hi": 2}}, "must be finite numbers"),
    ({"age": {"lo": float("-inf"), "hi": 2}}, "must be finite numbers"),
    ({"age": {"lo": True, "hi": 2}}, "must be finite numbers"),
    ({"age": {"edges": []}}, "non-empty list"),
    ({"age": {"edges": 3}}, "non-empty list"),
    ({"age": {"edges": [1, "2"]}}, "finite numbers, got '2'"),
    ({"age": {"edges": [1, float("nan")]}}, "finite numbers"),
    ({"age": {"edges": [1, 3, 2]}}, r"strictly increasing \(3 then 2\)"),
    ({"age": {"edges": [1, 1]}}, r"strictly increasing \(1 then 1\)"),
    ({"": {"edges": [1]}}, "column names must be non-empty"),
])
def test_bad_dp_bins_are_refused_naming_the_column(spec, match):
    with pytest.raises(InputError, match=match):
        check_dp_bins(spec, "--dp-bins file 'b.json'")


def test_read_dp_bins_file_errors_name_the_file_line_and_column(tmp_path):
    good = tmp_path / "bins.json"
    good.write_text(json.dumps(GOOD))
    assert read_dp_bins(good) == check_dp_bins(GOOD)
    with pytest.raises(InputError, match=r"--dp-bins file '.*missing.json': no such file"):
        read_dp_bins(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"age": {"lo": 1,\n  "hi": }}')
    with pytest.raises(InputError, match=r"--dp-bins file '.*bad.json': not valid JSON at line 2, column 9"):
        read_dp_bins(bad)
    col = tmp_path / "col.json"
    col.write_text('{"age": {"lo": 5, "hi": 1}}')
    with pytest.raises(InputError, match=r"--dp-bins file '.*col.json', column 'age': \"lo\" must be below"):
        read_dp_bins(col)
    with pytest.raises(InputError, match="cannot be read"):
        read_dp_bins(tmp_path)


def test_dp_bins_params_need_dp_model_and_round_trip():
    with pytest.raises(InputError, match="dp_bins applies with dp_model only .--dp-model EPS. or mode dp"):
        TrainParams(mode="plain", dp_bins=GOOD)
    assert TrainParams(mode="dp", epsilon=1.0, dp_bins=GOOD).dp_bins == check_dp_bins(GOOD)   # mode dp: edges
    p = TrainParams(mode="plain", dp_model=1.0, dp_bins=GOOD)
    assert TrainParams.from_dict(p.to_dict()).dp_bins == check_dp_bins(GOOD)
    with pytest.raises(InputError, match="parameter dp_bins, column 'age'"):
        TrainParams(mode="plain", dp_model=1.0, dp_bins={"age": {"lo": 2, "hi": 1}})


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON_VALUES, mutated(GOOD).map(lambda t: t[0])))
def test_any_json_document_is_accepted_or_refused_clearly(doc):
    """Whatever the file holds: a checked spec whose public bins are valid edges, or an InputError."""
    try:
        spec = check_dp_bins(doc)
    except InputError:
        return
    for entry in spec.values():
        t = public_thresholds(entry, 256) if "lo" in entry or len(entry["edges"]) < 256 else None
        if t is not None:
            assert np.all(np.isfinite(t)) and np.all(np.diff(t) > 0)
