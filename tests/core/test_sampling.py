"""vfl.core.sampling: RowSampler draws (subsample, GOSS) and the assignment codes of sampled/riding rows."""
import math

import numpy as np
import pytest

from vfl.core.params import TrainParams
from vfl.core.sampling import RowSampler, leaf_positions, node_members, riding


def params(**kw):
    return TrainParams(mode="plain", **kw)


def grads(n, K=1, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, K)), rng.uniform(0.05, 0.25, size=(n, K))


# --------------------------------------------------------------------------- assignment codes


def test_riding_codes():
    assert riding(0) == -2 and riding(5) == -7
    assert riding(np.array([0, 1, 4])).tolist() == [-2, -3, -6]
    assert np.all(riding(np.arange(50)) < -1)       # never -1 (outside every node) nor a node id


def test_node_members_takes_sampled_and_riding_rows_in_order():
    a = np.array([2, riding(2), -1, 0, riding(0), 2, riding(1), 1])
    assert node_members(a, 2).tolist() == [0, 1, 5]
    assert node_members(a, 0).tolist() == [3, 4]
    assert node_members(a, 1).tolist() == [6, 7]
    assert node_members(a, 3).tolist() == []
    # histograms select ``assignment == node_id``: riding rows are not in them
    assert np.flatnonzero(a == 2).tolist() == [0, 5]


def test_leaf_positions_ignores_the_sampling_code():
    a = np.array([[2, riding(2), -1, 0], [riding(0), 1, riding(6), 6]])
    assert leaf_positions(a).tolist() == [[2, 2, -1, 0], [0, 1, 6, 6]]
    assert leaf_positions(a).dtype == np.int64


# --------------------------------------------------------------------------- no sampling


def test_no_sampling_by_default():
    g, h = grads(50)
    assert RowSampler(params()).draw(3, g, h) == (None, None, 1.0)


# --------------------------------------------------------------------------- subsample


@pytest.mark.parametrize("n, rate, K", [(100, 0.5, 1), (101, 0.3, 3), (7, 0.01, 1), (40, 0.999, 2)])
def test_subsample_draws_the_rate_per_tree(n, rate, K):
    g, h = grads(n, K)
    in_sample, weight, amp = RowSampler(params(subsample=rate, seed=3)).draw(0, g, h)
    assert weight is None and amp == 1.0
    assert in_sample.shape == (K, n) and in_sample.dtype == bool
    assert in_sample.sum(axis=1).tolist() == [max(1, int(round(rate * n)))] * K
    if K > 1 and 0 < round(rate * n) < n:
        assert not np.array_equal(in_sample[0], in_sample[1])   # each class tree its own draw


def test_subsample_is_uniform_over_rounds():
    n, rate, rounds = 200, 0.3, 200
    g, h = grads(n)
    sampler = RowSampler(params(subsample=rate, seed=1))
    freq = np.mean([sampler.draw(r, g, h)[0][0] for r in range(rounds)], axis=0)
    assert freq.mean() == pytest.approx(rate)
    assert np.max(np.abs(freq - rate)) < 0.15            # ~4.6 sd of one row's frequency
    assert np.corrcoef(freq, g[:, 0])[0, 1] ** 2 < 0.05  # independent of the gradients


def test_draws_are_deterministic_per_seed_round_and_row_key():
    n = 60
    g, h = grads(n, K=2)
    keys = np.random.default_rng(5).permutation(1000)[:n]       # row keys: any distinct non-negative ints
    for kw in ({"subsample": 0.4}, {"goss": True, "learning_rate": 0.5, "top_rate": 0.2, "other_rate": 0.3}):
        draw = RowSampler(params(seed=11, **kw), keys).draw(4, g, h)
        again = RowSampler(params(seed=11, **kw), keys.copy()).draw(4, g.copy(), h.copy())
        assert np.array_equal(draw[0], again[0])
        # rows listed in another order (another salt): each row keeps its draw
        perm = np.random.default_rng(6).permutation(n)
        moved = RowSampler(params(seed=11, **kw), keys[perm]).draw(4, g[perm], h[perm])
        assert np.array_equal(moved[0], draw[0][:, perm])
        if draw[1] is not None:
            assert np.array_equal(moved[1], draw[1][perm])
        # another seed or another round: another draw
        assert not np.array_equal(RowSampler(params(seed=12, **kw), keys).draw(4, g, h)[0], draw[0])
        assert not np.array_equal(RowSampler(params(seed=11, **kw), keys).draw(5, g, h)[0], draw[0])


def test_without_row_keys_the_position_is_the_key():
    g, h = grads(30)
    p = params(subsample=0.5, seed=2)
    assert np.array_equal(RowSampler(p).draw(1, g, h)[0], RowSampler(p, np.arange(30)).draw(1, g, h)[0])


# --------------------------------------------------------------------------- GOSS


def test_goss_keeps_the_top_rows_and_amplifies_a_uniform_draw_of_the_rest():
    n, K = 200, 2
    g, h = grads(n, K, seed=9)
    p = params(goss=True, learning_rate=0.5, top_rate=0.2, other_rate=0.1, seed=4)
    in_sample, weight, amp = RowSampler(p).draw(2, g, h)
    n_top, n_other = math.floor(n * 0.2), math.floor(n * 0.1)
    assert in_sample.shape == (K, n) and np.all(in_sample == in_sample[0])   # shared by the class trees
    mask = in_sample[0]
    assert mask.sum() == n_top + n_other
    score = np.abs(g * h).sum(axis=1)
    top = np.argsort(-score, kind="stable")[:n_top]
    assert mask[top].all()
    assert amp == (n - n_top) / n_other
    expected = np.ones(n)
    other = mask.copy()
    other[top] = False
    expected[other] = amp
    assert np.array_equal(weight, expected)             # amplified: the drawn rows outside the top only
    assert other.sum() == n_other


def test_goss_other_rows_are_uniform_over_rounds():
    n = 200
    g, h = grads(n, seed=3)
    p = params(goss=True, learning_rate=1.0, top_rate=0.2, other_rate=0.3, seed=8)
    sampler = RowSampler(p)
    score = np.abs(g * h).sum(axis=1)
    rest = np.argsort(-score, kind="stable")[40:]
    freq = np.mean([sampler.draw(r, g, h)[0][0][rest] for r in range(1, 201)], axis=0)
    assert freq.mean() == pytest.approx(60 / 160)
    assert np.max(np.abs(freq - 60 / 160)) < 0.16


def test_goss_ties_are_broken_by_the_keyed_random_order():
    n = 50
    g, h = np.ones((n, 1)), np.ones((n, 1))       # every score ties
    p = params(goss=True, learning_rate=1.0, top_rate=0.2, other_rate=0.2, seed=0)
    a = RowSampler(p).draw(1, g, h)
    b = RowSampler(p).draw(2, g, h)
    assert a[0].sum() == b[0].sum() == 20
    assert not np.array_equal(a[1], b[1])          # which rows count as "top" varies with the round


@pytest.mark.parametrize("round_idx, n, lr, top, other", [
    (0, 100, 0.1, 0.2, 0.1),     # the first 1 / learning_rate rounds are not sampled
    (9, 100, 0.1, 0.2, 0.1),
    (3, 2, 0.5, 0.2, 0.1),       # fewer than 3 rows
    (3, 10, 0.5, 0.5, 0.5),      # top + other cover every row
])
def test_goss_does_not_sample(round_idx, n, lr, top, other):
    g, h = grads(n)
    p = params(goss=True, learning_rate=lr, top_rate=top, other_rate=other)
    assert RowSampler(p).draw(round_idx, g, h) == (None, None, 1.0)


def test_goss_starts_after_one_over_learning_rate_rounds():
    g, h = grads(100)
    p = params(goss=True, learning_rate=0.1, top_rate=0.2, other_rate=0.1)
    assert RowSampler(p).draw(10, g, h)[0] is not None
