"""WOE/IV from counts (vfl.core.woe, issue 33): the optbinning oracle, monotone and minimum-share merging,
the refusals of labels that are not binary."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vfl.core.binning import Binner
from vfl.core.woe import (
    WOEError,
    check_binary_labels,
    check_group_labels,
    groups_to_labels,
    min_share_groups,
    monotone_groups,
    naive_counts,
    screen_feature,
    woe_iv,
)


def _data(n=4000, seed=0, missing=0.05):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-1.5 * x))).astype(int)
    x[rng.random(n) < missing] = np.nan
    return x, y


@pytest.mark.slow      # optbinning's import and solver: seconds
def test_woe_and_iv_equal_optbinnings_given_the_same_edges():
    """optbinning (user splits fixed, no optimisation) on the same edges: WOE per bin and IV agree to
    1e-9. optbinning's bins are [a, b), ours (a, b]: continuous data has no value on an edge."""
    optbinning = pytest.importorskip("optbinning")
    x, y = _data()
    b = Binner(12).fit(x[:, None])
    edges = b.thresholds_[0]
    assert not np.isin(x[~np.isnan(x)], edges).any()          # no tie: both conventions give the same bins
    rows, events = naive_counts(b.transform(x[:, None])[:, 0], y, int(b.n_bins[0]))
    woe, iv_bins, iv, smoothed = woe_iv(rows, events)
    assert smoothed == []
    ob = optbinning.OptimalBinning(dtype="numerical", user_splits=edges, user_splits_fixed=[True] * len(edges),
                                   monotonic_trend=None, min_prebin_size=1e-9)
    with warnings.catch_warnings():         # optbinning's own pandas deprecation warnings
        warnings.simplefilter("ignore")
        ob.fit(x, y)
        table = ob.binning_table.build()
    n_value = len(edges) + 1
    ob_woe = table["WoE"].to_numpy()
    np.testing.assert_array_equal(table["Count"].to_numpy()[:n_value], rows[:n_value])
    np.testing.assert_array_equal(table["Event"].to_numpy()[:n_value], events[:n_value])
    np.testing.assert_allclose(woe[:n_value], ob_woe[:n_value].astype(float), atol=1e-9, rtol=0)
    # optbinning's last two rows: "Special" (empty) and "Missing" = our missing slot
    assert table["Count"].to_numpy()[n_value + 1] == rows[-1]
    assert abs(woe[-1] - float(ob_woe[n_value + 1])) < 1e-9
    assert abs(iv - ob.binning_table.iv) < 1e-9


def test_a_bin_without_events_is_smoothed_where_optbinning_gives_it_zero():
    """The one stated difference: a bin with rows but no events has WOE 0 and IV 0 in optbinning; here
    its WOE is smoothed (+0.5 to both counts) and it adds its IV."""
    pytest.importorskip("optbinning")
    from optbinning.binning.binning_statistics import BinningTable  # noqa: I001
    x, y = _data(missing=0)
    y[x > 1.5] = 0                                              # the top bin has no event
    edges = np.array([-1.0, 0.0, 1.0, 1.5])
    bins = np.searchsorted(edges, x, side="left")
    rows, events = naive_counts(bins, y, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bt = BinningTable("x", "numerical", None, edges, np.append(rows - events, 0)[[0, 1, 2, 3, 4, 6, 5]],
                          np.append(events, 0)[[0, 1, 2, 3, 4, 6, 5]])
        ob_woe = bt.build()["WoE"].to_numpy()
    woe, iv_bins, iv, smoothed = woe_iv(rows, events)
    assert smoothed == [4] and events[4] == 0 and rows[4] > 0
    assert float(ob_woe[4]) == 0.0
    non, E, N = rows[4] - events[4], events.sum(), (rows - events).sum()
    assert woe[4] == pytest.approx(math.log(((non + 0.5) / N) / (0.5 / E)), abs=1e-12)
    assert abs(iv - iv_bins[4] - bt.iv) < 1e-9                  # the other bins' IV is optbinning's
    np.testing.assert_allclose(woe[:4], ob_woe[:4].astype(float), atol=1e-9, rtol=0)
    fs, _ = screen_feature("p", 0, "x", rows, events)
    assert any("no events" in n and "smoothed" in n for n in fs.notes)


counts = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), min_size=1, max_size=25)


@settings(max_examples=100, deadline=None)
@given(counts)
def test_monotone_merging_gives_monotone_woe(pairs):
    events = np.array([e for e, _ in pairs], dtype=float)
    rows = events + np.array([n for _, n in pairs], dtype=float)
    if not (events.sum() > 0 and (rows - events).sum() > 0):
        return
    groups = monotone_groups(rows, events)
    assert sorted(sum(groups, [])) == list(range(len(rows)))          # a partition into consecutive runs
    assert all(g == list(range(g[0], g[-1] + 1)) for g in groups)
    gr = np.array([rows[g].sum() for g in groups])
    ge = np.array([events[g].sum() for g in groups])
    rate = ge / gr
    d = np.diff(rate)
    assert (d >= -1e-12).all() or (d <= 1e-12).all()
    woe = woe_iv(np.append(gr, 0), np.append(ge, 0))[0][:-1]
    dw = np.diff(woe)
    assert (dw >= -1e-9).all() or (dw <= 1e-9).all()


@settings(max_examples=100, deadline=None)
@given(counts, st.floats(0.01, 0.4))
def test_min_share_leaves_no_small_bin_and_keeps_monotone(pairs, share):
    events = np.array([e for e, _ in pairs], dtype=float)
    rows = events + np.array([n for _, n in pairs], dtype=float)
    if not (events.sum() > 0 and (rows - events).sum() > 0):
        return
    mono = monotone_groups(rows, events)
    groups = min_share_groups(mono, rows, share * rows.sum())
    sizes = [rows[g].sum() for g in groups]
    assert len(groups) == 1 or min(sizes) >= share * rows.sum()
    rate = np.array([events[g].sum() / rows[g].sum() for g in groups])
    d = np.diff(rate)
    assert (d >= -1e-12).all() or (d <= 1e-12).all()
    labels = groups_to_labels(groups, len(rows))
    assert check_group_labels(labels, len(rows)) == groups


def test_group_labels_other_than_consecutive_runs_are_refused():
    with pytest.raises(ValueError, match="consecutive"):
        check_group_labels(np.array([0, 1, 0]), 3)
    with pytest.raises(ValueError, match="consecutive"):
        check_group_labels(np.array([0, 2, 2]), 3)
    with pytest.raises(ValueError, match="3 value bins"):
        check_group_labels(np.array([0, 1]), 3)


@pytest.mark.parametrize("y, match", [
    (np.array([0, 1, 2, 1, 0]), "multiclass target"),
    (np.array([0.5, 1.7, 2.2, 0.1]), "non-binary target"),
    (np.array([1, 1, 1]), "only one value"),
    (np.array([0.0, np.nan, 1.0]), "missing values"),
])
def test_labels_that_are_not_binary_are_refused_clearly(y, match):
    with pytest.raises(WOEError, match=match) as info:
        check_binary_labels(y, "label column 'y'")
    assert "label column 'y'" in str(info.value)


def test_a_constant_feature_has_iv_zero_and_a_note():
    rows = np.array([100.0, 0.0, 0.0, 0.0])
    events = np.array([30.0, 0.0, 0.0, 0.0])
    fs, labels = screen_feature("p", 3, "c", rows, events)
    assert fs.iv == 0.0 and any("constant feature" in n for n in fs.notes)
    assert labels.tolist() == [0, 0, 0]
