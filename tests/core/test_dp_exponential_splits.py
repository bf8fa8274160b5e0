"""dp_trees = "exponential" (vfl.core.dp_mechanisms.TreeMechanisms.choose_split): every node's split
by the exponential mechanism over every party's candidates. With an unbounded level budget the
mechanism is the argmax, so the chosen split must be the exact best split (find_best_split, the
non-private search, as the oracle); at a finite budget it draws once per node among all parties'
candidates."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from vfl.core.dp_mechanisms import TreeMechanisms
from vfl.core.dp_model import plan_dp_model
from vfl.core.dp_noise import SeededNoise
from vfl.core.params import TrainParams
from vfl.core.split import find_best_split

LAMBDA = 1.0


def _histograms(seed):
    """Two parties: the first with features of 4 and 1 (unsplittable) bins, the second of 3 and 5."""
    rng = np.random.default_rng(seed)
    out = []
    for sizes in ((4, 1), (3, 5)):
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        sg, sh = rng.normal(size=offsets[-1]), rng.uniform(0.5, 2.0, size=offsets[-1])
        out.append(((sg, sh), offsets))
    return out


def _node(hists):
    (sg, sh), _ = hists[0]
    return SimpleNamespace(sum_gradients=float(sg.sum()), sum_hessians=float(sh.sum()), parent=-1, node_id=0)


def _mechanisms(trees="exponential", level_epsilon=math.inf, seed=0):
    plan = plan_dp_model(TrainParams(dp_model=1.0, dp_trees=trees, n_estimators=2, max_depth=2), 1, 2)
    plan.level_epsilon = level_epsilon
    return TreeMechanisms(plan, LAMBDA, noise=SeededNoise(seed))


@pytest.mark.parametrize("seed", range(8))
def test_an_unbounded_budget_chooses_the_exact_best_split(seed):
    hists = _histograms(seed)
    for i, ((sg, sh), off) in enumerate(hists[1:], 1):       # every party sees the same node totals
        sg += (hists[0][0][0].sum() - sg.sum()) / sg.size
        sh *= hists[0][0][1].sum() / sh.sum()
    node = _node(hists)
    mech = _mechanisms()
    got = mech.choose_split(node, [h for h, _ in hists], [o for _, o in hists])
    best = max((find_best_split(sg, sh, off, node.sum_gradients, node.sum_hessians, LAMBDA, 0.0, source_idx=i)
                for i, ((sg, sh), off) in enumerate(hists)), key=lambda s: s.gain)
    assert (got.source_idx, got.feature_idx, got.bin_idx, got.default_left) == \
        (best.source_idx, best.feature_idx, best.bin_idx, best.default_left)
    assert got.gain == pytest.approx(best.gain) and got.sum_gradients_left == pytest.approx(best.sum_gradients_left)
    assert mech.count["split"] == 1


def test_a_finite_budget_draws_among_every_partys_candidates():
    hists = _histograms(1)
    node = _node(hists)
    chosen = set()
    mech = _mechanisms(level_epsilon=1e-9, seed=5)      # next to uniform
    for _ in range(300):
        s = mech.choose_split(node, [h for h, _ in hists], [o for _, o in hists])
        chosen.add((s.source_idx, s.feature_idx))
    assert chosen == {(0, 0), (1, 0), (1, 1)}             # never the feature of a single bin
    assert mech.count["split"] == 300


def test_cyclic_trees_with_a_split_budget_search_only_the_trees_feature():
    hists = _histograms(2)
    node = _node(hists)
    mech = _mechanisms(trees="cyclic", level_epsilon=math.inf)
    offsets = [o for _, o in hists]
    for r in range(4):
        want = mech.tree_feature(offsets, (r, 0))
        s = mech.choose_split(node, [h for h, _ in hists], offsets, tree=(r, 0))
        if want == (0, 1):                                # one bin: nothing to split on
            assert s is None
        else:
            assert (s.source_idx, s.feature_idx) == want


def test_no_candidate_at_all_is_no_split():
    offsets = np.array([0, 1, 2])
    hists = [(np.ones(2), np.ones(2))]
    node = SimpleNamespace(sum_gradients=2.0, sum_hessians=2.0, parent=-1, node_id=0)
    assert _mechanisms().choose_split(node, hists, [offsets]) is None
