"""The active party's plaintext histograms (vfl.core.sources.LocalSource) are summed one feature at a
time, against their naive twin: one bincount over every (row, feature) slot at once."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from support import ColumnReader, examples

from vfl.core.sources import LocalSource


def naive_sums(src: LocalSource, rows, g, h):
    flat = src.bin_idx[rows].astype(np.int64) + src.bin_offsets[:-1][None, :]
    F, n_flat = src.bin_idx.shape[1], int(src.bin_offsets[-1])
    return (np.bincount(flat.ravel(), np.repeat(g, F), minlength=n_flat),
            np.bincount(flat.ravel(), np.repeat(h, F), minlength=n_flat))


@settings(max_examples=examples(40), deadline=None)
@given(n=st.integers(1, 300), F=st.integers(1, 5), max_bin=st.sampled_from([2, 7, 255, 256]),
       seed=st.integers(0, 2**31 - 1))
def test_per_feature_sums_equal_the_one_bincount_twin_to_the_last_bit(n, F, max_bin, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, F)).round(rng.integers(0, 4))
    X[rng.random((n, F)) < 0.1] = np.nan
    src = LocalSource("a", X, [f"x{j}" for j in range(F)], max_bin)
    assert src.bin_idx.dtype == (np.uint8 if src.n_bins.max() <= 256 else np.uint16)
    g, h = rng.normal(size=(n, 1)), rng.random((n, 1))
    src._g, src._h = g, h
    assignment = rng.integers(0, 3, size=(1, n)).astype(np.int32)
    sg, sh = src.build(0, np.array([0, 0]), np.array([1, 2]), assignment)
    for i, nid in enumerate([1, 2]):
        rows = np.flatnonzero(assignment[0] == nid)
        ng, nh = naive_sums(src, rows, g[rows, 0], h[rows, 0])
        assert sg[i].tobytes() == ng.tobytes() and sh[i].tobytes() == nh.tobytes()


@settings(max_examples=examples(30), deadline=None)
@given(n=st.integers(1, 200), F=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_a_root_of_every_row_sums_without_an_index_as_the_twin_does(n, F, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, F)).round(1)
    X[rng.random((n, F)) < 0.1] = np.nan
    src = LocalSource("a", X, [f"x{j}" for j in range(F)], 16)
    g, h = rng.normal(size=(n, 2)), rng.random((n, 2))
    src._g, src._h = g, h
    assignment = np.zeros((2, n), dtype=np.int32)            # both trees' roots hold every row
    assignment[1, rng.random(n) < 0.3] = -1                  # the second tree's rows not sampled
    sg, sh = src.build(0, np.array([0, 1]), np.array([0, 0]), assignment)
    for i in range(2):
        rows = np.flatnonzero(assignment[i] == 0)
        ng, nh = naive_sums(src, rows, g[rows, i], h[rows, i])
        assert sg[i].tobytes() == ng.tobytes() and sh[i].tobytes() == nh.tobytes()


def test_a_column_reader_gives_the_bins_of_its_matrix():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(120, 3)).round(2)
    X[rng.random((120, 3)) < 0.1] = np.nan
    rows = rng.permutation(120)[:90]
    a = LocalSource("a", ColumnReader(X), ["x0", "x1", "x2"], 32, rows=rows)
    b = LocalSource("a", X, ["x0", "x1", "x2"], 32, rows=rows)
    assert np.array_equal(a.bin_idx, b.bin_idx) and a.bin_idx.dtype == np.uint8
    assert [a.binner.threshold(f, 3) for f in range(3)] == [b.binner.threshold(f, 3) for f in range(3)]


def test_more_than_256_slots_keep_two_byte_bins():
    X = np.arange(1000, dtype=float)[:, None]
    X[::7] = np.nan                     # 256 bins and the missing slot: index 256
    src = LocalSource("a", X, ["x"], 256)
    assert src.n_bins.max() == 257 and src.bin_idx.dtype == np.uint16
    assert src.bin_idx.max() == 256


@settings(max_examples=examples(30), deadline=None)
@given(n=st.integers(1, 200), F=st.integers(1, 4), seed=st.integers(0, 2**31 - 1), cat=st.booleans())
def test_binning_the_rows_of_x_equals_binning_the_copy_x_rows(n, F, seed, cat):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, F)).round(1)
    X[rng.random((n, F)) < 0.1] = np.nan
    categorical = np.zeros(F, dtype=bool)
    if cat:
        X[:, 0] = np.where(np.isnan(X[:, 0]), np.nan, rng.integers(0, 5, n))
        categorical[0] = True
    rows = rng.permutation(n)[:rng.integers(1, n + 1)]
    a = LocalSource("a", X, [f"x{j}" for j in range(F)], 16, categorical, rows=rows)
    b = LocalSource("a", X[rows], [f"x{j}" for j in range(F)], 16, categorical)
    assert np.array_equal(a.bin_idx, b.bin_idx) and a.bin_idx.dtype == b.bin_idx.dtype
    assert all(np.array_equal(s, t) for s, t in zip(a.binner.thresholds_, b.binner.thresholds_))
