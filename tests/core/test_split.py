"""vfl.core.split: the split rule (goes_left) and find_best_split against a naive twin."""
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support import examples

from vfl.core.split import MIN_GAIN, SplitInfo, find_best_split, goes_left

SCALE = 2.0 ** 8     # gradients are fixed-point multiples (as in training), so every sum is exact


# --------------------------------------------------------------------------- goes_left


def test_goes_left_on_values():
    x = np.array([-1.0, 0.5, 0.5000001, np.nan, 2.0, -np.inf, np.inf])
    assert goes_left(x, 0.5, False).tolist() == [True, True, False, False, False, True, False]
    assert goes_left(x, 0.5, True).tolist() == [True, True, False, True, False, True, False]
    # threshold +inf (Binner.threshold of the last ordinary bin): every present value goes left
    assert goes_left(x, np.inf, False).tolist() == [True, True, True, False, True, True, True]
    assert goes_left(x, 0.5, np.bool_(True)).dtype == bool


def test_goes_left_on_bins():
    bins = np.array([0, 1, 2, 3, 4, 2], dtype=np.uint16)
    missing = bins == 4                                  # the missing bin of a feature with 3 cuts
    assert goes_left(bins, 1, False, missing=missing).tolist() == [True, True, False, False, False, False]
    assert goes_left(bins, 1, True, missing=missing).tolist() == [True, True, False, False, True, False]
    # the missing mask decides, not the bin index: a row may be marked missing whatever its bin
    assert goes_left(bins, 3, False, missing=np.array([True, False, False, False, False, False])).tolist() \
        == [False, True, True, True, False, True]


def test_goes_left_on_an_empty_batch():
    out = goes_left(np.empty(0), 1.0, True)
    assert out.shape == (0,) and out.dtype == bool


# --------------------------------------------------------------------------- find_best_split


def naive_best_split(sum_g, sum_h, offsets, G, H, lam, mcw, source_idx=0):
    """Enumerate every feature, ordinary bin and missing direction; XGBoost gain; first best wins
    (order: feature, bin, missing right before missing left)."""
    best = None
    parent = G * G / (H + lam)
    for f in range(len(offsets) - 1):
        g = [float(v) for v in sum_g[offsets[f]:offsets[f + 1]]]
        h = [float(v) for v in sum_h[offsets[f]:offsets[f + 1]]]
        nb = len(g)
        gm, hm = g[-1], h[-1]                     # the missing bin is the last slot
        for b in range(nb - 1):                   # "bin <= b", b an ordinary bin
            for default_left in (False, True):
                if default_left and b == nb - 2:
                    continue                      # everything left: no split
                GL, HL = sum(g[:b + 1]), sum(h[:b + 1])
                if default_left:
                    GL, HL = GL + gm, HL + hm
                GR, HR = G - GL, H - HL
                if HL < mcw or HR < mcw or HL + lam == 0 or HR + lam == 0:
                    continue
                gain = GL * GL / (HL + lam) + GR * GR / (HR + lam) - parent
                if best is None or gain > best.gain:
                    best = SplitInfo(gain, source_idx, f, b, default_left, GL, HL)
    return best if best is not None and best.gain > MIN_GAIN else None


@st.composite
def nodes(draw):
    """Rows of one node binned on a few features (missing bin last), with fixed-point g and h."""
    n = draw(st.integers(1, 60))
    n_bins = draw(st.lists(st.integers(2, 7), min_size=1, max_size=4))
    g = np.array(draw(st.lists(st.integers(-1024, 1024), min_size=n, max_size=n))) / SCALE
    h = np.array(draw(st.lists(st.integers(0, 512), min_size=n, max_size=n))) / SCALE
    bins = np.array([draw(st.lists(st.integers(0, nb - 1), min_size=n, max_size=n)) for nb in n_bins]).T
    offsets = np.concatenate([[0], np.cumsum(n_bins)]).astype(np.int64)
    sum_g, sum_h = np.zeros(offsets[-1]), np.zeros(offsets[-1])
    for f in range(len(n_bins)):
        np.add.at(sum_g, offsets[f] + bins[:, f], g)
        np.add.at(sum_h, offsets[f] + bins[:, f], h)
    return sum_g, sum_h, offsets, float(g.sum()), float(h.sum())


@settings(max_examples=examples(100), deadline=None)
@given(node=nodes(), lam=st.sampled_from([0.0, 0.5, 1.0, 4.0]), mcw=st.sampled_from([0.0, 0.25, 1.0, 3.0]),
       source_idx=st.integers(0, 3))
@pytest.mark.slow
def test_find_best_split_equals_the_naive_twin(node, lam, mcw, source_idx):
    sum_g, sum_h, offsets, G, H = node
    assume(H + lam > 0)     # G^2 / (H + lambda) is undefined: no training node has H = 0 and lambda = 0
    got = find_best_split(sum_g, sum_h, offsets, G, H, lam, mcw, source_idx=source_idx)
    want = naive_best_split(sum_g, sum_h, offsets, G, H, lam, mcw, source_idx=source_idx)
    assert got == want
    if got is not None:
        assert got.sum_hessians_left >= mcw and H - got.sum_hessians_left >= mcw
        assert got.gain > MIN_GAIN


def test_the_naive_twin_is_not_trivial():
    """The twin and the real thing agree on a hand-made node, and both find its obvious split."""
    # one feature, bins 0..2 ordinary, 3 missing: negative gradients low, positive high, missing negative
    sum_g = np.array([-4.0, -2.0, 3.0, -1.0])
    sum_h = np.array([2.0, 1.0, 2.0, 1.0])
    offsets = np.array([0, 4])
    got = find_best_split(sum_g, sum_h, offsets, -4.0, 6.0, 1.0, 0.0)
    assert (got.feature_idx, got.bin_idx, got.default_left) == (0, 1, True)
    assert got.sum_gradients_left == -7.0 and got.sum_hessians_left == 4.0
    assert got.gain == pytest.approx(49 / 5 + 9 / 3 - 16 / 7)
    assert naive_best_split(sum_g, sum_h, offsets, -4.0, 6.0, 1.0, 0.0) == got


def test_min_child_weight_is_respected():
    sum_g = np.array([-4.0, -2.0, 3.0, -1.0])
    sum_h = np.array([2.0, 1.0, 2.0, 1.0])
    offsets = np.array([0, 4])
    # the best split puts hessian 2 on the right: not allowed with min_child_weight 2.5
    got = find_best_split(sum_g, sum_h, offsets, -4.0, 6.0, 1.0, 2.5)
    assert got is not None
    assert got.sum_hessians_left >= 2.5 and 6.0 - got.sum_hessians_left >= 2.5
    assert (got.bin_idx, got.default_left) != (1, True)
    assert find_best_split(sum_g, sum_h, offsets, -4.0, 6.0, 1.0, 3.5) is None   # no child can hold 3.5


def test_ties_are_broken_by_feature_then_bin_then_missing_right():
    one = np.array([-3.0, 3.0, 0.0])                       # two ordinary bins, empty missing bin
    hess = np.array([1.0, 1.0, 0.0])
    # identical features: the first wins; empty missing bin: both directions tie, missing right wins
    got = find_best_split(np.tile(one, 3), np.tile(hess, 3), np.array([0, 3, 6, 9]), 0.0, 2.0, 1.0, 0.0,
                          source_idx=7)
    assert got == SplitInfo(got.gain, 7, 0, 0, False, -3.0, 1.0)
    # equal gains at two bins of one feature: the lower bin wins
    got = find_best_split(np.array([-3.0, 0.0, 3.0, 0.0]), np.array([1.0, 0.0, 1.0, 0.0]), np.array([0, 4]),
                          0.0, 2.0, 1.0, 0.0)
    assert (got.feature_idx, got.bin_idx, got.default_left) == (0, 0, False)
    # a strictly better later feature does win
    better = np.concatenate([one, one * 2])
    got2 = find_best_split(better, np.tile(hess, 2), np.array([0, 3, 6]), 0.0, 2.0, 1.0, 0.0)
    assert got2.feature_idx == 1


def test_no_split_when_nothing_gains():
    # all rows in one ordinary bin, or gradients that no cut separates
    assert find_best_split(np.array([2.0, 0.0, 0.0]), np.array([1.0, 0.0, 0.0]), np.array([0, 3]),
                           2.0, 1.0, 1.0, 0.0) is None
    assert find_best_split(np.array([1.0, 1.0, 0.0]), np.array([1.0, 1.0, 0.0]), np.array([0, 3]),
                           2.0, 2.0, 1.0, 0.0) is None
    assert find_best_split(np.zeros(0), np.zeros(0), np.array([0]), 0.0, 0.0, 1.0, 0.0) is None


def test_lambda_zero_with_empty_children_is_not_a_nan_split():
    # lambda = 0 and an empty side: 0/0 must not be taken for a gain
    got = find_best_split(np.array([-1.0, 0.0, 1.0, 0.0]), np.array([1.0, 0.0, 1.0, 0.0]), np.array([0, 4]),
                          0.0, 2.0, 0.0, 0.0)
    assert got == SplitInfo(2.0, 0, 0, 0, False, -1.0, 1.0)
