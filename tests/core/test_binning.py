"""vfl.core.binning: thresholds, transform, the missing bin, and "bin <= b" == "x <= threshold(f, b)"."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import ColumnReader, examples

from vfl.core.binning import Binner, check_max_bin
from vfl.core.errors import InputError
from vfl.core.split import goes_left

# |x| <= 1e307: no midpoint of two values overflows (the extremes have their own test below)
moderate = st.floats(min_value=-1e307, max_value=1e307, allow_nan=False, allow_infinity=False)


@st.composite
def columns(draw, values=moderate):
    """A column with duplicates, NaN and a few distinct values, or many distinct values."""
    pool = draw(st.lists(values, min_size=1, max_size=60))
    n = draw(st.integers(1, 80))
    picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=n, max_size=n))
    col = np.array([pool[i] for i in picks], dtype=np.float64)
    nan = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    col[np.array(nan)] = np.nan
    return col


def _fit(col, max_bin):
    return Binner(max_bin).fit(col[:, None])


@settings(max_examples=examples(80), deadline=None)
@given(col=columns(), max_bin=st.integers(2, 40))
def test_bin_le_b_is_x_le_threshold(col, max_bin):
    """For every ordinary bin b: "bin <= b" is exactly "x <= threshold(0, b)" (NaN: never), and
    goes_left on bins equals goes_left on raw values for both missing directions."""
    binner = _fit(col, max_bin)
    bins = binner.transform(col[:, None])[:, 0].astype(np.int64)
    t = binner.thresholds_[0]
    missing = binner.missing_bin(0)
    assert missing == len(t) + 1 == binner.n_bins[0] - 1
    assert np.array_equal(bins == missing, np.isnan(col))
    for b in range(len(t) + 1):
        thr = binner.threshold(0, b)
        with np.errstate(invalid="ignore"):
            assert np.array_equal(bins <= b, col <= thr)
        for default_left in (False, True):
            assert np.array_equal(goes_left(bins, b, default_left, missing=bins == missing),
                                  goes_left(col, thr, default_left))


@settings(max_examples=examples(80), deadline=None)
@given(col=columns(), max_bin=st.integers(2, 40))
def test_thresholds_are_increasing_and_every_bin_is_used_at_its_ends(col, max_bin):
    binner = _fit(col, max_bin)
    t = binner.thresholds_[0]
    values = np.unique(col[~np.isnan(col)])
    assert len(t) <= max_bin - 1
    assert np.all(np.diff(t) > 0)
    if values.size:
        # at most max_bin ordinary bins, the lowest and the highest value on either side of every cut
        assert np.all(t >= values[0]) and np.all(t < values[-1])
    bins = binner.transform(values[:, None])[:, 0]
    assert np.all(np.diff(bins.astype(np.int64)) >= 0)          # monotone in x
    assert bins.size == 0 or int(bins.max()) == len(t)            # the last ordinary bin is not empty


@settings(max_examples=examples(60), deadline=None)
@given(values=st.lists(moderate, min_size=2, max_size=30, unique=True), max_bin=st.integers(2, 40))
def test_few_distinct_values_each_get_their_own_bin(values, max_bin):
    """With at most max_bin distinct values, any two values that are not neighbouring floats are split
    apart (the cut is their midpoint; for neighbouring floats the midpoint may round onto the upper one,
    which then shares the lower one's bin)."""
    v = np.unique(np.array(values))
    if v.size > max_bin:
        v = v[:max_bin]
    binner = _fit(v, max_bin)
    bins = binner.transform(v[:, None])[:, 0].astype(np.int64)
    far = np.nextafter(v[:-1], np.inf) < v[1:]
    step = np.diff(bins)
    assert np.all(step[far] >= 1) and np.all(step <= 2)
    assert np.all(step >= 0) and bins[0] == 0


def test_thresholds_transform_and_missing_bin_by_hand():
    X = np.array([[1.0, 5.0, np.nan],
                  [2.0, 5.0, np.nan],
                  [2.0, np.nan, np.nan],
                  [4.0, 5.0, np.nan]])
    binner = Binner(8).fit(X)
    assert np.array_equal(binner.thresholds_[0], [1.5, 3.0])
    assert binner.thresholds_[1].size == 0 and binner.thresholds_[2].size == 0   # constant / all missing
    assert binner.n_bins.tolist() == [4, 2, 2]
    assert binner.bin_offsets.tolist() == [0, 4, 6, 8]
    assert [binner.missing_bin(f) for f in range(3)] == [3, 1, 1]
    assert binner.transform(X).tolist() == [[0, 0, 1], [1, 0, 1], [1, 1, 1], [2, 0, 1]]
    assert binner.threshold(0, 0) == 1.5 and binner.threshold(0, 1) == 3.0
    assert binner.threshold(0, 2) == float("inf") and binner.threshold(1, 0) == float("inf")
    # values never seen in fit: below, between, above, exactly on a cut (goes to the lower bin)
    new = np.array([[-1e9, 0, 0], [1.5, 0, 0], [1.6, 0, 0], [3.0, 0, 0], [1e9, 0, 0]])
    assert binner.transform(new)[:, 0].tolist() == [0, 0, 1, 1, 2]


def test_many_distinct_values_use_quantile_cuts():
    x = np.arange(1000, dtype=np.float64)
    binner = Binner(4).fit(x[:, None])
    t = binner.thresholds_[0]
    assert t.size == 3
    counts = np.bincount(binner.transform(x[:, None])[:, 0], minlength=binner.n_bins[0])
    assert counts.tolist()[:4] == [250, 250, 250, 250] and counts[4] == 0    # equal-frequency, none missing


def test_transform_dtype_and_256_bins():
    x = np.linspace(0, 1, 2000)
    binner = Binner(256).fit(x[:, None])
    out = binner.transform(x[:, None])
    assert out.dtype == np.uint16
    assert int(out.max()) == 255 and binner.missing_bin(0) == 256


@pytest.mark.parametrize("bad", [1, 257, 0, -3, True, 2.0, "8", None])
def test_check_max_bin_rejects(bad):
    with pytest.raises(InputError, match="max_bin must be an integer from 2 to 256"):
        check_max_bin(bad)


@pytest.mark.parametrize("good", [2, 32, 256, np.int64(16)])
def test_check_max_bin_accepts(good):
    assert check_max_bin(good) == int(good) and type(check_max_bin(good)) is int


@pytest.mark.parametrize("values", [[1.5e308, 1.7e308], [-1.7e308, -1.5e308], [-1.7e308, 1.0, 1.5e308, 1.7e308],
                                    [-1.7976931348623157e308, 1.7976931348623157e308],
                                    [1.7976931348623155e308, 1.7976931348623157e308],
                                    [5e-324, 1e-323], [-5e-324, 0.0, 5e-324], [-1e-310, 2.5e-320, 3e-310],
                                    [-1.7e308, -5e-324, 0.0, 5e-324, 1.7e308]])
def test_values_near_the_float_maximum_keep_their_split(values):
    x = np.array(values)
    binner = Binner(8).fit(x[:, None])
    t = binner.thresholds_[0]
    assert t.size == len(values) - 1 and np.all(np.isfinite(t))
    assert binner.transform(x[:, None])[:, 0].tolist() == list(range(len(values)))


def test_quantile_cuts_near_the_float_maximum_stay_finite():
    # more distinct values than bins: the quantile path (np.percentile midpoints) must not overflow either
    x = np.concatenate([np.linspace(1.0e308, 1.79e308, 40), -np.linspace(1.0e308, 1.79e308, 40)])
    binner = Binner(4).fit(x[:, None])
    t = binner.thresholds_[0]
    assert t.size >= 2 and np.all(np.isfinite(t))
    bins = binner.transform(x[:, None])[:, 0]
    assert len(np.unique(bins)) == t.size + 1


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=2, max_size=12, unique=True))
def test_every_pair_of_distinct_finite_values_is_split(values):
    x = np.array(sorted(values))
    binner = Binner(256).fit(x[:, None])
    t = binner.thresholds_[0]
    assert np.all(np.isfinite(t))
    # each distinct value its own bin, in order ("x <= t" separates neighbours)
    assert binner.transform(x[:, None])[:, 0].tolist() == list(range(len(x)))


@settings(max_examples=examples(40), deadline=None)
@given(n=st.integers(1, 200), max_bin=st.integers(2, 255), seed=st.integers(0, 2**16))
def test_one_byte_bins_equal_two_byte_bins(n, max_bin, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    X[rng.random((n, 3)) < 0.1] = np.nan
    b = Binner(max_bin).fit(X)
    small = b.transform(X, dtype=np.uint8)
    assert small.dtype == np.uint8 and np.array_equal(small, b.transform(X))


def test_one_byte_bins_refuse_more_than_256_slots():
    X = np.arange(1000, dtype=np.float64)[:, None]
    b = Binner(256).fit(X)             # 255 thresholds: 257 slots with the missing one
    assert b.n_bins[0] == 257
    with pytest.raises(ValueError, match="cannot hold"):
        b.transform(X, dtype=np.uint8)


@settings(max_examples=examples(40), deadline=None)
@given(n=st.integers(1, 300), F=st.integers(1, 4), max_bin=st.sampled_from([2, 9, 255, 256]),
       wide=st.integers(-1, 3), cat=st.booleans(), subset=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_fit_transform_reads_each_column_once_and_equals_fit_then_transform(n, F, max_bin, wide, cat, subset,
                                                                             seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, F)).round(1)
    if 0 <= wide < F:
        X[:, wide] = rng.permutation(n) + 0.5            # many distinct values: up to 257 slots
    X[rng.random((n, F)) < 0.1] = np.nan
    categorical = None
    if cat:
        X[:, 0] = np.where(np.isnan(X[:, 0]), np.nan, rng.integers(0, 6, n))
        categorical = np.eye(1, F, dtype=bool)[0]
    rows = rng.permutation(n)[:rng.integers(1, n + 1)] if subset else None
    ref = Binner(max_bin, categorical).fit(X, rows)
    want = ref.transform(X, rows, ref.bin_dtype)
    for source in (X, ColumnReader(X)):
        b = Binner(max_bin, categorical)
        got = b.fit_transform(source, rows)
        assert got.dtype == want.dtype == b.bin_dtype and np.array_equal(got, want)
        assert got.flags.f_contiguous or got.shape[1] == 1     # one feature's column is contiguous
        assert all(np.array_equal(s, t) for s, t in zip(b.thresholds_, ref.thresholds_))
        if isinstance(source, ColumnReader):
            assert source.reads == list(range(F))
