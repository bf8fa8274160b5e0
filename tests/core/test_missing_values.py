"""Missing values: a learned default direction per split, at active and passive nodes,
used the same way in training (bins) and prediction (raw values); real missing data
(ionosphere: NaN at both parties, one all-NaN column)."""
import numpy as np
import pandas as pd
import pytest
from support import KEY_BITS

from datasets import load_shared
from protocols import alignment
from vfl.api import ActiveParty, Federation, PassiveParty, federation_from_frames


def hash_order(ids, salt_hex):
    """Row order of the training set (the intersection sorted by salted id hash)."""
    keys = alignment.hashes_to_keys(alignment.hash_ids(ids, bytes.fromhex(salt_hex)))
    return np.array(sorted(range(len(keys)), key=keys.__getitem__))


def fit_capturing_raw(fed, **params):
    seen = {}
    fed.fit(on_round=lambda r, info: seen.__setitem__("raw", info["raw"].copy()), **params)
    return seen["raw"]


def split_nodes(fed):
    return [n for rnd in fed.model.rounds for t in rnd for n in t.nodes if not n.is_leaf]


@pytest.mark.parametrize("mode", ["plain", "he"])
def test_ionosphere_training_and_prediction_route_nan_alike(shared_dir, mode):
    parties = load_shared("ionosphere")
    if mode == "he":     # keep the encrypted run small
        parties = [type(p)(p.name, p.frame.iloc[:120].reset_index(drop=True), p.id_col, p.label_col, p.source)
                   for p in parties]
    fed = federation_from_frames(parties)
    n_rounds = 6 if mode == "plain" else 2
    raw_train = fit_capturing_raw(fed, mode=mode, key_bits=KEY_BITS, n_estimators=n_rounds, max_depth=4)
    active, passive = parties
    frames = {"active": active.frame.drop(columns=active.label_col), "passive1": passive.frame}
    raw_pred = fed.predict_raw(frames)
    order = hash_order(active.frame["sid"].to_numpy(), fed.model.salt)
    # the booster routed training rows by bins (missing bin -> default side); prediction routes
    # raw values (NaN -> default side) through both parties: the same leaves, the same scores
    assert np.allclose(raw_pred[order], raw_train, rtol=0, atol=1e-12)
    nodes = split_nodes(fed)
    owners = {n.owner for n in nodes}
    assert owners == {"active", "passive1"}
    assert all(n.feature != "x2" for n in nodes if n.owner == "active")    # all-NaN column never used
    # NaN really reaches split nodes at both parties during training
    passive_records = fed.passives["passive1"].records
    passive_nan = passive.frame.set_index("sid").isna()
    assert any(passive_nan[r["feature"]].any() for r in passive_records)
    assert any(active.frame[n.feature].isna().any() for n in nodes if n.owner == "active")


def _stump_federation(where: str, nan_label: int):
    """One informative feature at ``where`` (active 'a0' or passive 'b0'), NaN in 15% of its
    rows, all with label ``nan_label``."""
    rng = np.random.default_rng(5)
    n = 200
    info, noise = rng.normal(size=n), rng.normal(size=n)
    y = (info > 0).astype(int)
    miss = rng.random(n) < 0.15
    y[miss] = nan_label
    info[miss] = np.nan
    a0, b0 = (info, noise) if where == "active" else (noise, info)
    ids = np.arange(n)
    fed = Federation(ActiveParty("a", pd.DataFrame({"id": ids, "y": y, "a0": a0})),
                     [PassiveParty("b", pd.DataFrame({"id": ids, "b0": b0}))])
    fed.fit(mode="plain", n_estimators=1, max_depth=1)
    return fed


@pytest.mark.parametrize("where", ["active", "passive"])
@pytest.mark.parametrize("nan_label", [0, 1])
def test_nan_goes_to_the_learned_side_in_prediction(where, nan_label):
    fed = _stump_federation(where, nan_label)
    root = fed.model.rounds[0][0].nodes[0]
    assert not root.is_leaf
    if where == "active":
        assert root.owner == "a" and root.feature == "a0"
        default_left = root.default_left
    else:
        assert root.owner == "b" and root.feature is None and root.threshold is None   # opaque at active
        rec = fed.passives["b"].records[root.record_id]
        assert rec["feature"] == "b0"
        default_left = rec["default_left"]
    # NaN rows were labelled nan_label: they must go with the side of that class (right = x > 0 = 1)
    assert default_left == (nan_label == 0)
    probe = np.array([np.nan, -5.0, 5.0])
    frames = {"a": pd.DataFrame({"id": [0, 1, 2], "a0": probe if where == "active" else 0.0}),
              "b": pd.DataFrame({"id": [0, 1, 2], "b0": probe if where == "passive" else 0.0})}
    raw = fed.predict_raw(frames)[:, 0]
    assert raw[0] == (raw[1] if default_left else raw[2])
    assert raw[1] != raw[2]


def test_nan_only_at_prediction_follows_the_default_direction():
    rng = np.random.default_rng(6)
    n = 150
    X = rng.normal(size=(n, 2))
    y = (X[:, 0] + X[:, 1] > 0).astype(int)
    ids = np.arange(n)
    fed = Federation(ActiveParty("a", pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0]})),
                     [PassiveParty("b", pd.DataFrame({"id": ids, "b0": X[:, 1]}))])
    fed.fit(mode="plain", n_estimators=3, max_depth=3)
    Xp = rng.normal(size=(40, 2))
    Xp[::3, 0] = np.nan
    Xp[1::3, 1] = np.nan
    frames = {"a": pd.DataFrame({"id": np.arange(40), "a0": Xp[:, 0]}),
              "b": pd.DataFrame({"id": np.arange(40), "b0": Xp[:, 1]})}
    raw = fed.predict_raw(frames)[:, 0]
    # oracle: walk the trees centrally with the passive party's records and XGBoost's NaN rule
    records = fed.passives["b"].records
    expect = np.full(40, fed.model.base_score[0])
    for rnd in fed.model.rounds:
        for tree in rnd:
            for i in range(40):
                node = tree.nodes[0]
                while not node.is_leaf:
                    if node.owner == "a":
                        x, thr, dl = Xp[i, 0], node.threshold, node.default_left
                    else:
                        r = records[node.record_id]
                        x, thr, dl = Xp[i, 1], r["threshold"], r["default_left"]
                    left = dl if np.isnan(x) else x <= thr
                    node = tree.nodes[node.left if left else node.right]
                expect[i] += node.value
    assert np.allclose(raw, expect, rtol=0, atol=1e-12)


def test_all_nan_passive_column_and_zero_lambda(shared_dir):
    """reg_lambda = 0 with min_child_weight = 0 makes empty bins 0/0: they must not hide the
    real splits (a NaN gain used to win the arg-max and stop the node)."""
    active, passive = load_shared("ionosphere")
    passive = type(passive)(passive.name, passive.frame.assign(empty=np.nan), passive.id_col)
    fed = federation_from_frames([active, passive])
    fed.fit(mode="plain", n_estimators=3, max_depth=3, reg_lambda=0.0, min_child_weight=0.0)
    trees = [t for rnd in fed.model.rounds for t in rnd]
    assert all(not t.nodes[0].is_leaf for t in trees)
    assert all(np.isfinite(n.value) for t in trees for n in t.nodes)
    assert all(r["feature"] != "empty" for r in fed.passives["passive1"].records)
