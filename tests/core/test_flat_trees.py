"""The flat trees of online scoring (vfl.core.flat_trees) give bit for bit the scores of one-round
leaf-mask prediction (BoostedModel.predict_raw_one_round) for the same decisions: binary and
multiclass, missing values, a categorical active feature, any passive decisions."""
import numpy as np
import pandas as pd
import pytest
from support import small_frames

from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core.flat_trees import FlatTrees
from vfl.core.leafmask import leaf_masks


def _fit(objective, n=150, **params):
    a, b, c = small_frames(n, seed=3)
    if objective == "multiclass":
        a["y"] = (np.arange(n) % 3).astype(float)
    a["grade"] = pd.Series(np.arange(n) % 4).astype(float)
    a.loc[::7, "a0"] = np.nan
    fed = Federation(ActiveParty("bank", a, categorical=["grade"]), [PassiveParty("telco", b),
                                                                   PassiveParty("shop", c)])
    fed.fit(TrainParams(mode="plain", objective=objective, n_estimators=6, max_depth=4, min_data_per_group=5,
                        cat_smooth=1.0, **params))
    return fed.model, a


@pytest.mark.parametrize("objective", ["binary", "multiclass"])
def test_flat_trees_score_exactly_as_leaf_masks(objective):
    model, a = _fit(objective)
    trees = FlatTrees(model)
    X = a[model.active_features].to_numpy(dtype=float)
    rng = np.random.default_rng(7)
    decisions = {p: rng.random((len(X), len(trees.nodes[p]))) < 0.5 for p in model.node_owners()}

    def fetch(owner, sk):
        return leaf_masks(sk, np.flatnonzero(sk.record_ids >= 0), decisions[owner])
    want = model.predict_raw_one_round(X, fetch)
    got = trees.raw({**decisions, model.active_party: trees.active_decisions(X)})
    assert got.shape == want.shape and np.array_equal(got, want)
    defaults = {p: np.repeat(trees.default_left[p][None], len(X), 0) for p in decisions}
    want = model.predict_raw_one_round(X, lambda o, sk: leaf_masks(sk, np.flatnonzero(sk.record_ids >= 0),
                                                                   defaults[o]))
    assert np.array_equal(trees.raw({**defaults, model.active_party: trees.active_decisions(X)}), want)
