"""Monotone constraints (issue 15, item 3): partial dependence monotone on a dense grid for
active and passive features, XGBoost's accuracy with the same constraints, bad input."""
import numpy as np
import pandas as pd
import pytest

from datasets import load_shared
from datasets.errors import InputError
from datasets.split import train_test_split_parties
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams, federation_from_frames
from vfl.core.split import Constraints, find_best_split


def _wiggly(n=600, seed=0):
    """y rises with a0 and b0 on the whole, with a strong wiggle an unconstrained model follows."""
    rng = np.random.default_rng(seed)
    a0, a1, b0, b1 = rng.uniform(-3, 3, size=(4, n))
    score = a0 + 1.5 * np.sin(3 * a0) + b0 - 1.5 * np.cos(3 * b0) + a1 + 0.3 * rng.normal(size=n)
    y = (score > 0).astype(int)
    ids = np.arange(n)
    return (pd.DataFrame({"id": ids, "y": y, "a0": a0, "a1": a1}),
            pd.DataFrame({"id": ids, "b0": b0, "b1": b1}))


def _partial_dependence(fed, a, b, party_frame: str, feature: str, grid):
    """Raw scores ``(rows, grid)``: each of 25 rows with ``feature`` set to every grid value."""
    rows = np.arange(25)
    rep_rows, rep_grid = np.repeat(rows, len(grid)), np.tile(grid, len(rows))
    ids = np.arange(len(rep_rows))
    fa = a.drop(columns="y").iloc[rep_rows].assign(id=ids).reset_index(drop=True)
    fb = b.iloc[rep_rows].assign(id=ids).reset_index(drop=True)
    (fa if party_frame == "a" else fb)[feature] = rep_grid
    raw = fed.predict_raw({"bank": fa, "bureau": fb})[:, 0]
    return raw.reshape(len(rows), len(grid))


@pytest.mark.parametrize("mode", ["plain"])
def test_partial_dependence_is_monotone_for_active_and_passive_features(mode):
    a, b = _wiggly()
    grid = np.linspace(-3.5, 3.5, 201)
    params = dict(mode=mode, n_estimators=12, max_depth=4, learning_rate=0.3, max_bin=64)
    free = Federation(ActiveParty("bank", a), [PassiveParty("bureau", b)])
    free.fit(TrainParams(**params))
    fed = Federation(ActiveParty("bank", a), [PassiveParty("bureau", b, monotone={"b0": +1})])
    fed.fit(TrainParams(**params, monotone_constraints={"a0": 1}))
    for side, feature in (("a", "a0"), ("b", "b0")):
        unconstrained = np.diff(_partial_dependence(free, a, b, side, feature, grid), axis=1)
        assert unconstrained.min() < -1e-3           # without the constraint the wiggle shows
        steps = np.diff(_partial_dependence(fed, a, b, side, feature, grid), axis=1)
        assert steps.min() >= -1e-12, (feature, steps.min())
        assert steps.max() > 0.1                      # and the feature is used
    # a decreasing constraint on the unconstrained active feature a1 holds too
    dec = Federation(ActiveParty("bank", a), [PassiveParty("bureau", b, monotone={"b1": -1})])
    dec.fit(TrainParams(**params, monotone_constraints={"a1": "decreasing"}))
    for side, feature in (("a", "a1"), ("b", "b1")):
        assert np.diff(_partial_dependence(dec, a, b, side, feature, grid), axis=1).max() <= 1e-12


def test_a_split_against_the_constraint_is_rejected_and_weights_are_clipped():
    g = np.array([-4.0, 4.0, 0.0])                     # left child wants +, right child wants -
    h = np.array([4.0, 4.0, 0.0])
    off = np.array([0, 3])
    assert find_best_split(g, h, off, 0.0, 8.0, 1.0, 0.0, monotone=np.array([-1]),
                           constraints=Constraints(active=True)).bin_idx == 0
    assert find_best_split(g, h, off, 0.0, 8.0, 1.0, 0.0, monotone=np.array([1]),
                           constraints=Constraints(active=True)) is None
    clipped = find_best_split(g, h, off, 0.0, 8.0, 1.0, 0.0, monotone=np.array([-1]),
                              constraints=Constraints(-0.2, 0.3, True))
    assert (clipped.weight_left, clipped.weight_right) == (0.3, -0.2)


@pytest.mark.slow
def test_accuracy_within_001_of_xgboost_with_the_same_constraints(shared_dir):
    xgb = pytest.importorskip("xgboost")
    parties = load_shared("default_credit")
    p1 = parties[1].name
    train, test = train_test_split_parties(parties, test_size=0.2, seed=0)
    cons = {f"x{k}": 1 for k in range(5, 10)}
    p = TrainParams(mode="plain", n_estimators=20, max_depth=4, learning_rate=0.3, max_bin=32)
    fed = federation_from_frames(train, monotone={f"{p1}:{f}": c for f, c in cons.items()})
    fed.fit(p)
    proba = fed.predict_proba({pf.name: pf.frame.drop(columns=[pf.label_col] if pf.label_col else [])
                               for pf in test})
    y_test = test[0].frame[test[0].label_col].to_numpy().astype(float)
    ours = np.mean((proba > 0.5) == y_test)

    def joined(pfs):
        X = pfs[0].frame.set_index("id")[pfs[0].feature_names].add_prefix("g:")
        X = X.join(pfs[1].frame.set_index("id")[pfs[1].feature_names].add_prefix("h:"), how="inner")
        return X, pfs[0].frame.set_index("id").loc[X.index, "y"].to_numpy().astype(float)

    Xtr, ytr = joined(train)
    Xte, yte = joined(test)
    mono = tuple(cons.get(c[2:], 0) if c.startswith("h:") else 0 for c in Xtr.columns)
    ref = xgb.XGBClassifier(n_estimators=20, max_depth=4, learning_rate=0.3, max_bin=32, reg_lambda=1.0,
                            min_child_weight=1.0, tree_method="hist", n_jobs=1, base_score=ytr.mean(),
                            monotone_constraints=mono).fit(Xtr, ytr)
    theirs = np.mean((ref.predict_proba(Xte)[:, 1] > 0.5) == yte)
    assert abs(ours - theirs) <= 0.01, (ours, theirs)


def test_bad_constraints_get_clear_errors():
    a, b = _wiggly(60)
    fed = Federation(ActiveParty("bank", a), [PassiveParty("bureau", b)])
    with pytest.raises(InputError, match="monotone constraint on 'b0': not a feature column of the active party"):
        fed.fit(TrainParams(mode="plain", monotone_constraints={"b0": 1}))
    with pytest.raises(InputError, match="must be \\+1 \\(increasing\\), -1 \\(decreasing\\) or 0, got 2"):
        TrainParams(monotone_constraints={"a0": 2})
    with pytest.raises(InputError, match="party 'bureau'.*'zz', which is not one of its feature columns"):
        PassiveParty("bureau", b, monotone={"zz": 1})
    cat = b.assign(region=np.where(b["b1"] > 0, "north", "south"))
    with pytest.raises(InputError, match="'region': a categorical feature cannot be constrained"):
        PassiveParty("bureau", cat, monotone={"region": 1})
    active_cat = Federation(ActiveParty("bank", a.assign(kind=np.where(a["a1"] > 0, "x", "y"))),
                            [PassiveParty("bureau", b)])
    with pytest.raises(InputError, match="'kind': a categorical feature cannot be constrained"):
        active_cat.fit(TrainParams(mode="plain", monotone_constraints={"kind": -1}))
