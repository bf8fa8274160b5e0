"""Row subsampling per tree and GOSS."""
import numpy as np
import pandas as pd
import pytest
from support import KEY_BITS, gradient_messages

from protocols import alignment
from protocols import messages as m
from protocols.serialization import loads
from vfl.api import ActiveParty, Federation, PassiveParty
from vfl.core.errors import InputError
from vfl.core.objectives import get_objective
from vfl.core.params import TrainParams
from vfl.core.sampling import leaf_positions, node_members, riding


def frames(n=200, seed=0, objective="binary"):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    z = X[:, 0] + X[:, 2] - 0.5 * X[:, 3] + 0.5 * rng.normal(size=n)
    y = {"binary": (z > 0).astype(int), "regression": 5 * z, "multiclass": np.digitize(z, [-0.7, 0.7])}[objective]
    ids = np.arange(n)
    return (pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]}),
            pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]}))


def federation(fr, record=False):
    return Federation(ActiveParty("a", fr[0]), [PassiveParty("b", fr[1])], record=record)


def fit(fed, **params):
    raws = []
    fed.fit(on_round=lambda r, info: raws.append(info["raw"].copy()), **params)
    return raws


def hash_order(fed, ids):
    """Active-frame row of each training row, in the booster's (salted hash) order."""
    keys = alignment.hashes_to_keys(alignment.hash_ids(ids, bytes.fromhex(fed.model.salt)))
    return np.array(sorted(range(len(keys)), key=keys.__getitem__))


def trees(fed):
    return [t.structure() for rnd in fed.model.rounds for t in rnd]


def test_assignment_codes():
    a = np.array([0, riding(0), 3, riding(3), -1])
    assert node_members(a, 0).tolist() == [0, 1] and node_members(a, 3).tolist() == [2, 3]
    assert leaf_positions(a[:4]).tolist() == [0, 0, 3, 3]


@pytest.mark.parametrize("objective", ["binary", "multiclass", "regression"])
def test_subsample_grows_on_a_sample_and_updates_every_row(objective):
    fr = frames(objective=objective)
    fed = federation(fr)
    raws = fit(fed, mode="plain", objective=objective, n_estimators=4, max_depth=3, subsample=0.6)
    roots = [t.nodes[0] for rnd in fed.model.rounds for t in rnd]
    assert all(r.n_samples == 120 for r in roots)
    if objective == "multiclass":      # each class tree draws its own sample
        assert len({t.nodes[0].sum_hessians for t in fed.model.rounds[1]}) == 3
    # rows outside a tree's sample still reach its leaves: the training scores after the last
    # round equal federated prediction on the training rows
    raw_pred = fed.predict_raw({"a": fr[0].drop(columns="y"), "b": fr[1]})
    assert np.allclose(raw_pred[hash_order(fed, fr[0]["id"].to_numpy())], raws[-1], rtol=0, atol=1e-12)
    full = federation(fr)
    full.fit(mode="plain", objective=objective, n_estimators=4, max_depth=3)
    assert trees(full) != trees(fed)


def test_subsample_is_reproducible_by_seed():
    fr = frames()
    out = []
    for seed in (1, 1, 2):
        fed = federation(fr)
        fed.fit(mode="plain", n_estimators=3, max_depth=3, subsample=0.5, seed=seed)
        out.append(trees(fed))
    assert out[0] == out[1] != out[2]


def test_goss_keeps_the_largest_gradients_and_amplifies_the_rest():
    fr = frames(n=300, objective="regression")          # continuous gradients: no ties at the cut
    fed = federation(fr, record=True)
    lr = 0.5
    raws = fit(fed, mode="plain", objective="regression", n_estimators=4, max_depth=2, goss=True,
               top_rate=0.2, other_rate=0.1, learning_rate=lr)
    roots = [rnd[0].nodes[0] for rnd in fed.model.rounds]
    warm = int(1 / lr)
    assert [r.n_samples for r in roots] == [300] * warm + [60 + 30] * (4 - warm)
    # the passive party's depth-0 histogram requests show the sample (code 0) of each round
    samples = [loads(f).assignment[0] == 0 for s, r, f in fed.transport.log
               if r == "b" and isinstance(loads(f), m.HistogramRequest) and not loads(f).node_ids.any()]
    loss = get_objective("regression")
    # training rows are in the booster's order (hash order); rebuild g, h from its raw scores
    y = fr[0]["y"].to_numpy()[hash_order(fed, fr[0]["id"].to_numpy())].astype(float)
    for r in range(warm, 4):
        g, h = loss.gradients(y, raws[r - 1])
        score = np.abs(g * h)[:, 0]
        in_sample = samples[r]
        assert in_sample.sum() == 90
        top = np.argsort(-score, kind="stable")[:60]
        assert in_sample[top].all()                                      # every large gradient kept
        other = np.flatnonzero(in_sample & ~np.isin(np.arange(300), top))
        amp = (300 - 60) / 30
        assert roots[r].sum_hessians == pytest.approx(h[top, 0].sum() + amp * h[other, 0].sum(), rel=1e-9)
        assert roots[r].sum_gradients == pytest.approx(g[top, 0].sum() + amp * g[other, 0].sum(),
                                                       rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("kw", [dict(subsample=0.5), dict(goss=True, learning_rate=1.0)])
def test_only_sampled_rows_are_encrypted(kw):
    """(he == plain with sampling: tests/test_he_equals_plain.py, {subsample,goss}-multiclass-*)"""
    fr = frames(n=80, objective="multiclass")
    fed = federation(fr, record=True)
    fed.fit(mode="he", key_bits=KEY_BITS, objective="multiclass", n_estimators=2, max_depth=2, **kw)
    grads = gradient_messages(loads(f) for s, r, f in fed.transport.log if r == "b")
    hist0 = [loads(f) for s, r, f in fed.transport.log
             if r == "b" and isinstance(loads(f), m.HistogramRequest) and not loads(f).node_ids.any()]
    assert grads and len(grads) == len(hist0)
    for g, h in zip(grads, hist0):
        used = (h.assignment >= 0).any(axis=0)          # rows some class tree uses
        real = np.array([int(v) != 1 for v in g.values]).reshape(-1, len(used))
        assert (real == used).all()                     # the others: trivial placeholders
        #                                                 (in every pre-shifted copy too)
    assert not used.all()


@pytest.mark.parametrize("kw, match", [
    (dict(subsample=0), r"parameter subsample must be > 0, got 0"),
    (dict(subsample=1.2), r"parameter subsample must be <= 1, got 1.2"),
    (dict(subsample="half"), r"parameter subsample must be a number"),
    (dict(goss=True, subsample=0.5), r"goss and subsample < 1 cannot be combined"),
    (dict(goss=True, top_rate=0.7, other_rate=0.4), r"top_rate \+ other_rate must be <= 1"),
    (dict(goss="yes"), r"parameter goss must be True or False"),
    (dict(top_rate=0), r"parameter top_rate must be > 0"),
])
def test_bad_sampling_parameters(kw, match):
    with pytest.raises(InputError, match=match):
        TrainParams(**kw)
