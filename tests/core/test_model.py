"""vfl.core.model: BoostedModel persistence and prediction, node by node and by one-round leaf masks."""
import json
import math
import stat

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import examples

from vfl.core.errors import InputError
from vfl.core.leafmask import leaf_masks
from vfl.core.model import MODEL_FORMAT, MODEL_VERSION, BoostedModel
from vfl.core.split import goes_left
from vfl.core.tree import Node, Tree

ACTIVE = "bank"
PASSIVES = ("telco", "shop")


class World:
    """A random federated model with every party's data and lookup tables in one place (test only)."""

    def __init__(self, seed, n_rows=40, n_rounds=3, n_targets=1, max_depth=4, missing=0.15):
        rng = np.random.default_rng(seed)
        self.rng = rng
        n_feat = {ACTIVE: 3, "telco": 2, "shop": 2}
        self.X = {}
        for party, nf in n_feat.items():
            X = rng.normal(size=(n_rows, nf))
            X[rng.random(X.shape) < missing] = np.nan
            self.X[party] = X
        self.records = {p: [] for p in PASSIVES}     # record_id -> (feature, threshold, default_left)
        rounds = [[self._tree(max_depth) for _ in range(n_targets)] for _ in range(n_rounds)]
        objective = "binary" if n_targets == 1 else "multiclass"
        self.model = BoostedModel(objective, n_targets, list(rng.normal(size=n_targets)), 0.3, ACTIVE,
                                  [f"a{j}" for j in range(n_feat[ACTIVE])], list(PASSIVES), "model-1",
                                  "00ff", rounds, {"max_depth": max_depth}, {"train": {"logloss": [0.5]}})

    def _threshold(self, X, f):
        r = self.rng.random()
        if r < 0.1:
            return float("inf")                           # "every present value left"
        col = X[:, f]
        col = col[~np.isnan(col)]
        return float(self.rng.choice(col)) if col.size and r < 0.6 else float(self.rng.normal())

    def _tree(self, max_depth):
        tree = Tree()
        tree.add(Node(0, 0))
        queue = [0]
        while queue:
            nid = queue.pop(0)
            node = tree.nodes[nid]
            if node.depth >= max_depth or self.rng.random() < 0.25:
                node.value = float(self.rng.normal())
                continue
            owner = [ACTIVE, *PASSIVES][self.rng.integers(3)]
            f = int(self.rng.integers(self.X[owner].shape[1]))
            thr, dl = self._threshold(self.X[owner], f), bool(self.rng.integers(2))
            node.is_leaf, node.owner = False, owner
            if owner == ACTIVE:
                node.feature_idx, node.feature, node.threshold, node.default_left = f, f"a{f}", thr, dl
            else:
                node.record_id = len(self.records[owner])
                self.records[owner].append((f, thr, dl))
            node.left, node.right = len(tree.nodes), len(tree.nodes) + 1
            for child in (node.left, node.right):
                tree.add(Node(child, node.depth + 1, parent=nid))
                queue.append(child)
        return tree

    # the passive parties' side of prediction, written as they do it
    def _go_left(self, owner, record_ids, rows):
        recs = [self.records[owner][r] for r in np.asarray(record_ids).tolist()]
        X = self.X[owner]
        x = np.array([X[i, f] for i, (f, _, _) in zip(np.asarray(rows).tolist(), recs)])
        thr = np.array([t for _, t, _ in recs])
        dl = np.array([d for _, _, d in recs], dtype=bool)
        return np.where(np.isnan(x), dl, goes_left(x, thr, False))

    def route(self, owner, record_ids, rows):
        assert owner in PASSIVES and len(record_ids) == len(rows)
        return self._go_left(owner, record_ids, rows)

    def fetch_masks(self, owner, skeleton):
        n = self.X[owner].shape[0]
        own = np.flatnonzero(skeleton.record_ids >= 0)
        rec = skeleton.record_ids[own]
        go = np.stack([self._go_left(owner, np.full(n, r), np.arange(n)) for r in rec.tolist()], axis=1) \
            if own.size else np.zeros((n, 0), dtype=bool)
        return leaf_masks(skeleton, own, go)

    def oracle(self, n_rounds=None):
        """Raw scores by walking every tree row by row with every party's thresholds."""
        model = self.model
        rounds = model.rounds[: model.default_rounds if n_rounds is None else n_rounds]
        n = self.X[ACTIVE].shape[0]
        raw = np.tile(np.asarray(model.base_score), (n, 1))
        for rnd in rounds:
            for k, tree in enumerate(rnd):
                for i in range(n):
                    node = tree.nodes[0]
                    while not node.is_leaf:
                        if node.owner == ACTIVE:
                            f, thr, dl = node.feature_idx, node.threshold, node.default_left
                        else:
                            f, thr, dl = self.records[node.owner][node.record_id]
                        x = self.X[node.owner][i, f]
                        left = dl if math.isnan(x) else x <= thr
                        node = tree.nodes[node.left if left else node.right]
                    raw[i, k] += node.value
        return raw


# --------------------------------------------------------------------------- persistence


@pytest.mark.parametrize("n_targets", [1, 3])
def test_save_load_round_trip(tmp_path, n_targets):
    model = World(1, n_targets=n_targets).model
    model.best_iteration = 1
    model.classes = ["a", "b", "c"] if n_targets == 3 else None
    path = tmp_path / "bank.json"
    model.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600                       # private, via vfl.core.files
    d = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in the model file"))
    assert d["format"] == MODEL_FORMAT and d["version"] == MODEL_VERSION and d["role"] == "active"
    loaded = BoostedModel.load(path)
    assert loaded == model
    assert loaded.to_dict() == model.to_dict()
    assert [t.structure() for r in loaded.rounds for t in r] == [t.structure() for r in model.rounds for t in r]


def test_round_trip_keeps_infinite_thresholds(tmp_path):
    w = World(2)
    active = [n for r in w.model.rounds for t in r for n in t.nodes if n.owner == ACTIVE]
    assert active
    for node in active[::2]:
        node.threshold = float("inf")
    w.model.save(tmp_path / "m.json")
    back = BoostedModel.load(tmp_path / "m.json")
    assert [n.threshold for r in back.rounds for t in r for n in t.nodes if n.owner == ACTIVE] == \
        [n.threshold for n in active]
    X = w.X[ACTIVE]
    assert np.array_equal(back.predict_raw(X, w.route), w.oracle())


@pytest.mark.parametrize("change, message", [
    ({"format": "other"}, "not an active-party model file"),
    ({"role": "passive"}, "not an active-party model file"),
    ({"version": 2}, "model format version 2 is not supported"),
])
def test_from_dict_refuses_other_files(change, message):
    d = {**World(3, n_rounds=1).model.to_dict(), **change}
    with pytest.raises(InputError, match=message):
        BoostedModel.from_dict(d)


def test_load_names_an_unreadable_file(tmp_path):
    bad = tmp_path / "bank.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match=r"model file .*bank\.json is damaged: not valid JSON"):
        BoostedModel.load(bad)
    with pytest.raises(InputError, match=r"cannot read model file .*absent\.json"):
        BoostedModel.load(tmp_path / "absent.json")


# --------------------------------------------------------------------------- prediction


def test_missing_values_follow_default_left():
    """One active split on feature 0 at 0.5: NaN goes to the learned side."""
    def model(default_left):
        t = Tree()
        t.add(Node(0, 0, is_leaf=False, left=1, right=2, owner=ACTIVE, feature_idx=0, feature="a0",
                   threshold=0.5, default_left=default_left))
        t.add(Node(1, 1, parent=0, value=-1.0))
        t.add(Node(2, 1, parent=0, value=1.0))
        return BoostedModel("binary", 1, [0.0], 0.3, ACTIVE, ["a0"], [], "m", "00", [[t]])

    X = np.array([[0.0], [0.5], [0.7], [np.nan]])
    def no_route(*_):
        raise AssertionError("no passive node to route")
    assert model(True).predict_raw(X, no_route)[:, 0].tolist() == [-1.0, -1.0, 1.0, -1.0]
    assert model(False).predict_raw(X, no_route)[:, 0].tolist() == [-1.0, -1.0, 1.0, 1.0]
    for dl in (True, False):
        assert np.array_equal(model(dl).predict_raw_one_round(X, no_route), model(dl).predict_raw(X, no_route))


@settings(max_examples=examples(30), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_targets=st.sampled_from([1, 3]), n_rounds=st.integers(1, 4),
       max_depth=st.integers(0, 5))
def test_node_by_node_equals_one_round_equals_the_oracle(seed, n_targets, n_rounds, max_depth):
    w = World(seed, n_rounds=n_rounds, n_targets=n_targets, max_depth=max_depth)
    X = w.X[ACTIVE]
    node = w.model.predict_raw(X, w.route)
    one = w.model.predict_raw_one_round(X, w.fetch_masks)
    assert node.shape == (X.shape[0], n_targets)
    assert np.array_equal(node, one)
    assert np.allclose(node, w.oracle(), rtol=0, atol=1e-12)


def test_prefix_of_rounds_and_best_iteration():
    w = World(7, n_rounds=4)
    X = w.X[ACTIVE]
    full = w.model.predict_raw(X, w.route)
    two = w.model.predict_raw(X, w.route, n_rounds=2)
    assert not np.array_equal(full, two)
    assert np.allclose(two, w.oracle(n_rounds=2), rtol=0, atol=1e-12)
    assert np.array_equal(w.model.predict_raw_one_round(X, w.fetch_masks, n_rounds=2), two)
    w.model.best_iteration = 1                       # early stopping: predict with rounds 0 and 1
    assert w.model.default_rounds == 2
    assert np.array_equal(w.model.predict_raw(X, w.route), two)
    assert np.array_equal(w.model.predict_raw_one_round(X, w.fetch_masks), two)


def test_one_round_asks_each_split_owner_once_and_node_by_node_per_level():
    w = World(11, n_rounds=3, max_depth=4)
    X = w.X[ACTIVE]
    owners = w.model.node_owners()
    assert owners, "seed 11 should give passive splits"
    fetched, routed = [], []
    w.model.predict_raw_one_round(X, lambda o, sk: fetched.append(o) or w.fetch_masks(o, sk))
    w.model.predict_raw(X, lambda o, r, rows: routed.append(o) or w.route(o, r, rows))
    assert fetched == owners                                    # one message per passive party
    assert set(routed) == set(owners) and len(routed) > len(owners)


def test_a_wrong_number_of_routing_answers_is_refused():
    w = World(11, n_rounds=2)
    with pytest.raises(InputError, match=r"party '(telco|shop)' answered \(\d+,\) routing decisions"):
        w.model.predict_raw(w.X[ACTIVE], lambda o, r, rows: w.route(o, r, rows)[:-1])
