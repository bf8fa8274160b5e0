"""Bin edges across shards (vfl.core.binning summaries): equal to Binner's when the summaries are exact,
pinned when approximate, and equal again after the exact refinement (ExactEdges); missing values
counted, never binned."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import examples

from vfl.core.bin_summaries import (
    ColumnSummary,
    _multiset_midpoint_percentiles,
    binner_from_summaries,
    merge_shard_summaries,
    merge_summaries,
    summarize_column,
    summarize_shard,
    thresholds_from_summary,
)
from vfl.core.binning import Binner
from vfl.core.errors import InputError
from vfl.core.sharded_binning import ExactEdges, answer_edge_query, fit_sharded_binner, merge_edge_answers

moderate = st.floats(min_value=-1e300, max_value=1e300, allow_nan=False, allow_infinity=False)


@st.composite
def columns(draw):
    """A column with duplicates and NaN: few or many distinct values."""
    pool = draw(st.lists(moderate, min_size=1, max_size=400))
    n = draw(st.integers(1, 600))
    picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=n, max_size=n))
    col = np.array([pool[i] for i in picks], dtype=np.float64)
    nan = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    col[np.array(nan)] = np.nan
    return col


@st.composite
def split_points(draw, n):
    cuts = draw(st.lists(st.integers(0, n), max_size=6))
    return sorted(cuts)


def _shards(col, cuts):
    return np.split(col, cuts)


def _merge_tree(summaries, order, max_points):
    """Merge in a random pairwise (tree) order."""
    pool = list(summaries)
    for pick in order:
        if len(pool) == 1:
            break
        i = pick % (len(pool) - 1)
        pool[i:i + 2] = [merge_summaries(pool[i:i + 2], max_points)]
    return merge_summaries(pool, max_points)


@pytest.mark.slow
@settings(max_examples=examples(80), deadline=None)
@given(data=st.data(), max_bin=st.integers(2, 256))
def test_exact_summaries_of_any_split_give_binners_edges(data, max_bin):
    col = data.draw(columns())
    cuts = data.draw(split_points(len(col)))
    order = data.draw(st.lists(st.integers(0, 100), max_size=8))
    summaries = [summarize_column(part) for part in _shards(col, cuts)]
    merged = _merge_tree(summaries, order, 4096)
    assert merged.exact
    assert merged.n_missing == int(np.isnan(col).sum())
    assert merged.n == int((~np.isnan(col)).sum())
    expected = Binner(max_bin).fit(col[:, None]).thresholds_[0]
    got = thresholds_from_summary(merged, max_bin)
    assert got.dtype == expected.dtype and np.array_equal(got, expected)


@settings(max_examples=examples(100), deadline=None)
@given(values=st.lists(moderate, min_size=1, max_size=50),
       counts=st.lists(st.integers(1, 30), min_size=50, max_size=50),
       qs=st.lists(st.floats(0, 100), min_size=1, max_size=20))
def test_multiset_percentile_is_numpys(values, counts, qs):
    v = np.unique(np.array(values, dtype=np.float64))
    c = np.array(counts[:len(v)], dtype=np.int64)
    got = _multiset_midpoint_percentiles(v, c, np.array(qs))
    expected = np.percentile(np.repeat(v, c), np.array(qs), method="midpoint")
    assert np.array_equal(got, expected)


def test_binner_from_shards_equals_binner_and_bins_the_same():
    rng = np.random.default_rng(3)
    X = np.column_stack([rng.normal(size=3000).round(2), rng.integers(0, 5, 3000).astype(float),
                         np.where(rng.random(3000) < 0.2, np.nan, rng.exponential(size=3000).round(3)),
                         np.full(3000, np.nan)])
    shards = [summarize_shard(X[a:b]) for a, b in ((0, 1000), (1000, 1001), (1001, 3000))]
    merged = merge_shard_summaries(shards)
    assert all(s.exact for s in merged)
    local = Binner(32).fit(X)
    sharded = binner_from_summaries(merged, 32)
    for a, b in zip(local.thresholds_, sharded.thresholds_):
        assert np.array_equal(a, b)
    assert np.array_equal(local.transform(X), sharded.transform(X))
    assert sharded.thresholds_[3].size == 0 and merged[3].n_missing == 3000


def test_approximate_summary_is_bounded_and_keeps_the_extremes():
    col = np.arange(100_000, dtype=np.float64)
    s = summarize_column(col, max_points=256)
    assert not s.exact and len(s.values) <= 256 and s.n == 100_000
    assert s.values[0] == 0.0 and s.values[-1] == 99_999.0
    merged = merge_summaries([s, summarize_column(col + 0.5, max_points=256)], max_points=256)
    assert not merged.exact and len(merged.values) <= 256 and merged.n == 200_000


def test_approximate_edges_are_pinned_and_close_to_the_exact_ones():
    """Four shards of 25,000 distinct values, summaries of 1,024 points: the edges are not Binner's
    but each is within n / max_points ranks of it (pinned, so a change of the sketch is seen)."""
    rng = np.random.default_rng(0)
    col = rng.permutation(np.arange(100_000, dtype=np.float64))
    shards = [summarize_column(part, max_points=1024) for part in np.split(col, 4)]
    merged = merge_summaries(shards, max_points=1024)
    assert not merged.exact
    got = thresholds_from_summary(merged, 8)
    exact = Binner(8).fit(col[:, None]).thresholds_[0]
    assert exact.tolist() == [12499.5, 24999.5, 37499.5, 49999.5, 62499.5, 74999.5, 87499.5]
    assert got.tolist() == PINNED_APPROX
    assert np.all(np.abs(got - exact) <= 100_000 / 1024)


PINNED_APPROX = [12455.0, 24986.0, 37517.0, 50014.0, 62488.0, 75006.0, 87519.0]


def test_missing_values_go_to_the_missing_bin_as_in_binner():
    col = np.array([np.nan, 1.0, 2.0, np.nan, 3.0, 2.0])
    merged = merge_summaries([summarize_column(col[:3]), summarize_column(col[3:])])
    b = binner_from_summaries([merged], 4)
    local = Binner(4).fit(col[:, None])
    assert np.array_equal(b.transform(col[:, None]), local.transform(col[:, None]))
    assert (b.transform(col[:, None])[[0, 3], 0] == b.missing_bin(0)).all()
    all_nan = merge_summaries([summarize_column(np.full(3, np.nan)), summarize_column(np.full(2, np.nan))])
    assert all_nan.n == 0 and all_nan.n_missing == 5 and thresholds_from_summary(all_nan, 4).size == 0


def test_summary_round_trip_and_bad_input():
    s = summarize_column(np.array([3.0, 1.0, 1.0, np.nan]))
    back = ColumnSummary.from_dict(s.to_dict())
    assert back.values.tolist() == [1.0, 3.0] and back.counts.tolist() == [2, 1]
    assert back.exact and back.n_missing == 1
    with pytest.raises(InputError, match="strictly increasing"):
        ColumnSummary([2.0, 1.0], [1, 1], True)
    with pytest.raises(InputError, match="bad column summary"):
        ColumnSummary.from_dict({"values": [1.0]})
    with pytest.raises(InputError, match="max_points"):
        summarize_column(np.ones(3), max_points=10)
    with pytest.raises(InputError, match="number of features"):
        merge_shard_summaries([summarize_shard(np.ones((2, 2))), summarize_shard(np.ones((2, 3)))])


# --------------------------------------------------------------------------- exact refinement

@st.composite
def wide_columns(draw):
    """Columns with more distinct values than a 256-point summary holds (so summaries are approximate),
    with runs of equal values, NaN and extreme magnitudes."""
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(300, 1000))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "ints", "mixed"]))
    if kind == "normal":
        col = rng.normal(size=n) * draw(st.sampled_from([1e-300, 1.0, 1e300]))
    elif kind == "ints":
        col = rng.integers(0, draw(st.integers(260, 5000)), n).astype(np.float64)
    else:
        col = np.where(rng.random(n) < 0.3, rng.integers(0, 3, n), rng.normal(size=n))
    col[rng.random(n) < draw(st.floats(0, 0.3))] = np.nan
    return col


@settings(max_examples=examples(30), deadline=None)
@given(data=st.data(), max_bin=st.integers(2, 256), bracket_points=st.integers(8, 64))
def test_exact_refinement_gives_binners_edges_for_any_split(data, max_bin, bracket_points):
    col = data.draw(wide_columns())
    cuts = data.draw(split_points(len(col)))
    shards = [part[:, None] for part in _shards(col, cuts)]
    binner = fit_sharded_binner(shards, max_bin, max_points=256, bracket_points=bracket_points)
    expected = Binner(max_bin).fit(col[:, None]).thresholds_[0]
    assert np.array_equal(binner.thresholds_[0], expected)


def test_exact_refinement_rounds_on_a_wide_column():
    """100,000 distinct values in 4 shards, 1,024-point summaries: the one-round edges are off (pinned
    above); the refinement gives Binner's in a few small rounds, and a shard's answers are bounded."""
    rng = np.random.default_rng(0)
    col = rng.permutation(np.arange(100_000, dtype=np.float64))
    shards = [part[:, None] for part in np.split(col, 4)]
    merged = merge_shard_summaries([summarize_shard(s, 1024) for s in shards], 1024)
    plan = ExactEdges(merged, 8)
    sizes = []
    while not plan.done:
        query = plan.query()
        answers = [answer_edge_query(s, query) for s in shards]
        sizes.append(max(len(inside.values) for a in answers for _, inside in a[0]))
        plan.update(query, merge_edge_answers(answers))
    assert 1 <= plan.rounds <= 4 and max(sizes) <= 32
    assert plan.binner().thresholds_[0].tolist() == Binner(8).fit(col[:, None]).thresholds_[0].tolist()
    assert fit_sharded_binner(shards, 8, max_points=1024, exact=False).thresholds_[0].tolist() == PINNED_APPROX


def test_exact_refinement_bookkeeping():
    X = np.column_stack([np.arange(1000.0), np.repeat([1.0, 2.0], 500), np.full(1000, np.nan)])
    merged = merge_shard_summaries([summarize_shard(X[:600], 256), summarize_shard(X[600:], 256)], 256)
    plan = ExactEdges(merged, 16)
    assert list(plan.query()) == [0]              # the exact columns need no round
    with pytest.raises(InputError, match="not known yet"):
        plan.binner()
    query = plan.query()
    with pytest.raises(InputError, match="miss feature 0"):
        plan.update(query, {})
    a = answer_edge_query(X[:600], query)
    with pytest.raises(InputError, match="disagree on the number of brackets"):
        merge_edge_answers([a, {0: a[0][:-1]}])
    with pytest.raises(InputError, match="bracket_points"):
        ExactEdges(merged, 16, bracket_points=2)
    binner = fit_sharded_binner([X[:600], X[600:]], 16, max_points=256)
    local = Binner(16).fit(X)
    assert all(np.array_equal(a, b) for a, b in zip(binner.thresholds_, local.thresholds_))
