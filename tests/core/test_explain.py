"""Grouped path-dependent TreeSHAP (issue 32): additivity, the brute-force twin, shap's TreeExplainer
as an external oracle, reason codes, and that an explanation asks the passive parties nothing
that prediction does not."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import KEY_BITS, examples

from datasets.errors import InputError, PeerError
from datasets.frames import party_data
from protocols.serialization import loads
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core.explain import (
    TABLE_PLAYERS,
    ShapPlan,
    explanation_table,
    naive_shapley,
    player_columns,
    players_of,
    reason_codes,
)
from vfl.core.split import goes_left
from vfl.core.tree import Node, Tree

OBJECTIVES = ("binary", "multiclass", "regression")


def _frames(objective, n=160, seed=0, categorical=False, one_feature=False):
    """Active party a (a0, a1), passive parties b and c; NaNs in every party; a categorical
    column at a (``cat_a``) and at b (``colour``) when asked."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    X[rng.random(X.shape) < 0.12] = np.nan
    z = np.nan_to_num(X)
    score = z[:, 0] + z[:, 2] - z[:, 4] + 0.5 * z[:, 1] * z[:, 3]
    ids = np.arange(n)
    a = pd.DataFrame({"id": ids, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2]})
    c = pd.DataFrame({"id": ids, "c0": X[:, 4]})
    if not one_feature:
        b["b1"], c["c1"] = X[:, 3], X[:, 5]
    if categorical:
        colour = rng.choice(["red", "green", "blue", "grey"], size=n).astype(object)
        colour[rng.random(n) < 0.1] = None
        b["colour"] = colour
        a["cat_a"] = rng.choice(["x", "y", "z"], size=n)
        score = score + 1.2 * (colour == "red") - 0.8 * (a["cat_a"] == "z")
    y = {"binary": (score + 0.3 * rng.normal(size=n) > 0).astype(int),
         "multiclass": np.digitize(score, [-0.7, 0.7]),
         "regression": 3 * score + rng.normal(size=n)}[objective]
    a.insert(1, "y", y)
    return a, b, c


def _fit(objective, mode="plain", categorical=False, one_feature=False, n_estimators=3, max_depth=3, seed=0,
         record=False, **kw):
    a, b, c = _frames(objective, seed=seed, categorical=categorical, one_feature=one_feature)
    fed = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)], record=record)
    fed.fit(TrainParams(mode=mode, objective=objective, n_estimators=n_estimators, max_depth=max_depth,
                        key_bits=KEY_BITS, **kw))
    return fed, {"a": a.drop(columns="y"), "b": b, "c": c}


def _truth(fed, frames):
    """Every node's decision for the rows of ``frames``, the passive ones from their own lookup
    tables (not from masks): what the naive twin and the oracle are given."""
    model = fed.model
    a = fed.active
    d = party_data(frames["a"], "a", "id", None, None, categories=model.categories)
    X = d.X[:, [d.feature_names.index(f) for f in model.active_features]]
    passive_X = {}
    for name, p in fed.passives.items():
        st = p._state
        dd = party_data(frames[name], name, "id", None, None, categories=st.categories)
        passive_X[name] = dd.X[:, [dd.feature_names.index(f) for f in st.feature_names]]

    def decide(t, nd):
        if nd.owner == model.active_party:
            return goes_left(X[:, nd.feature_idx], nd.threshold, nd.default_left, categories=nd.categories)
        table = fed.passives[nd.owner]._state.table
        col = table.features(np.array([nd.record_id]))[0]
        return table.go_left(np.full(len(X), nd.record_id), passive_X[nd.owner][:, col])
    assert a.name == model.active_party
    return X, passive_X, decide


def _player_of(model):
    index = {p: len(model.active_features) + i for i, p in enumerate(model.passives)}
    return lambda nd: nd.feature_idx if nd.owner == model.active_party else index[nd.owner]


# -- the brute-force twin ---------------------------------------------------------------------------
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_grouped_values_equal_the_naive_twin_with_missing_and_categorical(objective):
    fed, frames = _fit(objective, categorical=True)
    model = fed.model
    assert model.categories, "the active party has a categorical split feature"
    ids, ex = fed.explanation(frames)
    X, _, decide = _truth(fed, frames)
    base, phi = naive_shapley(model._flat_trees(None), _player_of(model), decide, len(players_of(model)),
                              model.n_targets, model.base_score, len(X))
    assert ex.values.shape == (len(X), model.n_targets, len(players_of(model)))
    np.testing.assert_allclose(ex.base, base, rtol=0, atol=1e-9)
    np.testing.assert_allclose(ex.values, phi, rtol=0, atol=1e-9)
    assert np.abs(ex.values).max() > 0.01
    # additivity: base + values = the raw margin, which is prediction's
    assert ex.additivity_error() < 1e-9
    np.testing.assert_array_equal(ex.margin, fed.predict_raw(frames))


def test_deep_paths_beyond_the_table_use_the_direct_polynomial_and_agree_with_the_twin():
    """A leaf with more players on its path than the pattern table holds is computed per row."""
    rng = np.random.default_rng(1)
    depth = TABLE_PLAYERS + 2
    nodes = []

    def grow(nid, d, parent):        # a chain on features 0..depth-1 (one player each), leaves off it
        node = Node(nid, d, parent, is_leaf=d == depth, value=float(rng.normal()), n_samples=100 - 7 * d)
        nodes.append(node)
        return node
    root = grow(0, 0, -1)
    cur = root
    while cur.depth < depth:
        cur.is_leaf = False
        cur.owner, cur.feature_idx, cur.feature = "a", cur.depth, f"f{cur.depth}"
        cur.threshold, cur.default_left = 0.0, bool(cur.depth % 2)
        left = grow(len(nodes), cur.depth + 1, cur.node_id)
        right = grow(len(nodes), cur.depth + 1, cur.node_id)
        right.n_samples = 3 + cur.depth
        right.is_leaf = True
        cur.left, cur.right = left.node_id, right.node_id
        cur = left
    tree = Tree(nodes)
    plan = ShapPlan([(0, tree)], "a", depth, [], 1, [0.25])
    assert plan.big_leaves and not plan.small.all()
    X = rng.normal(size=(64, depth))
    X[rng.random(X.shape) < 0.1] = np.nan
    go = np.stack([goes_left(X[:, nd.feature_idx], nd.threshold, nd.default_left)
                   for nd in tree.nodes if not nd.is_leaf], axis=1)
    values = plan.values(go, {})
    base, phi = naive_shapley([(0, tree)], lambda nd: nd.feature_idx,
                              lambda t, nd: goes_left(X[:, nd.feature_idx], nd.threshold, nd.default_left),
                              depth, 1, [0.25], len(X))
    np.testing.assert_allclose(plan.base, base, atol=1e-12)
    np.testing.assert_allclose(values, phi, atol=1e-9)


# -- an external oracle: shap's TreeExplainer ------------------------------------------------------
def _shap_model(fed):
    """The ensemble as shap's custom tree model over the global feature matrix
    ``[active features..., b's feature, c's feature]`` (each passive party holds one)."""
    model = fed.model
    F, K = len(model.active_features), model.n_targets
    col = {p: F + i for i, p in enumerate(model.passives)}
    trees = []
    for k, tree in model._flat_trees(None):
        n = len(tree.nodes)
        cl, cr, cd = (np.full(n, -1, dtype=np.int64) for _ in range(3))
        feat = np.full(n, -2, dtype=np.int64)
        thr = np.zeros(n)
        val = np.zeros((n, K))
        cover = np.array([float(nd.n_samples) for nd in tree.nodes])
        for nd in tree.nodes:
            if nd.is_leaf:
                val[nd.node_id, k] = nd.value
                continue
            cl[nd.node_id], cr[nd.node_id] = nd.left, nd.right
            if nd.owner == model.active_party:
                feat[nd.node_id], t, dl = nd.feature_idx, nd.threshold, nd.default_left
            else:
                rec = fed.passives[nd.owner]._state.table.records[nd.record_id]
                assert rec["feature_idx"] == 0
                feat[nd.node_id], t, dl = col[nd.owner], rec["threshold"], rec["default_left"]
            thr[nd.node_id] = t
            cd[nd.node_id] = nd.left if dl else nd.right
        for nd in reversed(tree.nodes):      # internal values: the cover-weighted mean (shap reads the root's)
            if not nd.is_leaf:
                wl, wr = cover[nd.left], cover[nd.right]
                val[nd.node_id] = (wl * val[nd.left] + wr * val[nd.right]) / (wl + wr)
        trees.append({"children_left": cl, "children_right": cr, "children_default": cd, "features": feat,
                      "thresholds": thr, "values": val, "node_sample_weight": cover})
    return {"trees": trees, "base_offset": np.asarray(model.base_score, dtype=np.float64)}


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_with_one_feature_per_passive_party_the_values_equal_shap_tree_explainer(objective):
    shap = pytest.importorskip("shap", reason="shap is in the test extra (pip install -e '.[test]')")
    fed, frames = _fit(objective, one_feature=True, n_estimators=4, max_depth=4, seed=2)
    ids, ex = fed.explanation(frames)
    X, passive_X, _ = _truth(fed, frames)
    full = np.column_stack([X] + [passive_X[p] for p in fed.model.passives])
    explainer = shap.TreeExplainer(_shap_model(fed), feature_perturbation="tree_path_dependent")
    theirs = np.asarray(explainer.shap_values(full))
    expected = np.atleast_1d(np.asarray(explainer.expected_value, dtype=np.float64))
    if fed.model.n_targets == 1:
        theirs = theirs.reshape(len(full), 1, -1)
    else:
        theirs = theirs.transpose(0, 2, 1)          # (n, features, classes) -> (n, classes, players)
    np.testing.assert_allclose(ex.values, theirs, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ex.base, expected, rtol=0, atol=1e-6)


# -- modes ------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_he_and_plain_give_the_same_attributions_exactly_and_both_add_up(objective):
    got = {}
    for mode in ("plain", "he"):
        fed, frames = _fit(objective, mode=mode, categorical=True, n_estimators=2)
        ids, ex = fed.explanation(frames)
        assert ex.additivity_error() < 1e-9
        np.testing.assert_array_equal(ex.margin, fed.predict_raw(frames))
        got[mode] = ex
    np.testing.assert_array_equal(got["he"].values, got["plain"].values)
    np.testing.assert_array_equal(got["he"].base, got["plain"].base)


# -- the table and reason codes --------------------------------------------------------------------
def test_table_has_base_one_column_per_player_margin_and_reason_codes():
    fed, frames = _fit("binary")
    table = fed.explain(frames, top=2)
    assert list(table.columns[:7]) == ["id", "base", "a0", "a1", "b", "c", "margin"]
    assert list(table.columns[7:]) == ["reason_1", "reason_1_value", "reason_2", "reason_2_value"]
    players = table[["a0", "a1", "b", "c"]].to_numpy()
    np.testing.assert_allclose(table["base"] + players.sum(axis=1), table["margin"], atol=1e-9)
    for r, row in table.iterrows():
        pushes = sorted(((v, p) for p, v in zip(["a0", "a1", "b", "c"], players[r]) if v > 0), reverse=True)
        want = [p for _, p in pushes[:2]]
        got = [x for x in (row["reason_1"], row["reason_2"]) if isinstance(x, str)]
        assert got == want
        if want:
            assert row["reason_1_value"] == pushes[0][0]
    low = fed.explain(frames, top=1, adverse="low")
    assert (low["reason_1_value"].dropna() < 0).all() and low["reason_1_value"].notna().any()


def test_multiclass_table_has_one_line_per_row_and_class():
    fed, frames = _fit("multiclass")
    table = fed.explain(frames, top=1)
    K = fed.model.n_targets
    assert len(table) == K * len(frames["a"])
    assert table["class"].tolist()[:K] == (fed.model.classes or list(range(K)))
    assert table["id"].tolist()[:K] == [0] * K
    raw = fed.predict_raw(frames)
    np.testing.assert_allclose(table["margin"].to_numpy().reshape(-1, K), raw, atol=0)


def test_reason_codes_pick_the_strongest_adverse_pushes_and_refuse_bad_k():
    v = np.array([[0.3, -0.5, 0.1, 0.0], [-0.1, -0.2, -0.3, -0.4]])
    names = ["p", "q", "r", "s"]
    assert reason_codes(v, names, 2) == [[("p", 0.3), ("r", 0.1)], []]
    assert reason_codes(v, names, 2, sign=-1) == [[("q", -0.5)], [("s", -0.4), ("r", -0.3)]]
    assert reason_codes(v, names, 10)[0] == [("p", 0.3), ("r", 0.1)]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InputError, match="positive integer"):
            reason_codes(v, names, bad)
    with pytest.raises(InputError, match="adverse"):
        fed, frames = _fit("binary", n_estimators=1)
        explanation_table(fed.explanation(frames)[1], np.arange(len(frames["a"])), adverse="sideways")


def test_a_passive_party_named_like_a_feature_gets_a_party_prefix():
    assert player_columns(["x", "base", "x", "margin", "ok"], 2) == ["x", "feature:base", "party:x",
                                                                     "party:margin", "ok"]


# -- no new leakage ---------------------------------------------------------------------------------
def _exchange(log):
    """(sender, receiver, message type, field names, frame size) of every frame."""
    out = []
    for sender, receiver, frame in log:
        msg = loads(frame)
        fields = tuple(sorted(vars(msg))) if hasattr(msg, "__dict__") else ()
        out.append((sender, receiver, type(msg).__name__, fields, len(frame)))
    return out


@pytest.mark.parametrize("align", ["hash", "psi"])
def test_an_explanation_sends_exactly_the_messages_of_a_one_round_prediction(align):
    fed, frames = _fit("binary", categorical=True, record=True)
    fed.transport.log.clear()
    fed.predict_raw(frames, prediction="one-round", align=align)
    predicted = _exchange(fed.transport.log)
    fed.transport.log.clear()
    fed.explanation(frames, align=align)
    explained = _exchange(fed.transport.log)
    assert explained == predicted
    kinds = {k for _, _, k, _, _ in explained}
    assert "LeafMaskRequest" in kinds and "LeafMaskResponse" in kinds


def test_a_passive_party_that_allows_node_prediction_only_refuses_explanations():
    fed, frames = _fit("binary", n_estimators=1)
    fed.passives["b"]._state.allowed_prediction = ("node",)
    with pytest.raises(PeerError, match="does not allow prediction by 'one-round'"):
        fed.explanation(frames)


def test_a_model_without_counts_weighs_both_children_equally_and_still_adds_up():
    """A model released with --dp-model keeps no counts or hessian sums: the absent players'
    average is then a plain one, the values are still exact for that value function."""
    nodes = [Node(0, 0, -1, is_leaf=False, left=1, right=2, owner="a", feature_idx=0, feature="x", threshold=0.0,
                  default_left=True),
             Node(1, 1, 0, is_leaf=False, left=3, right=4, owner="b", record_id=0),
             Node(2, 1, 0, value=1.0), Node(3, 2, 1, value=-2.0), Node(4, 2, 1, value=4.0)]
    tree = Tree(nodes)
    plan = ShapPlan([(0, tree)], "a", 1, ["b"], 1, [0.5])
    np.testing.assert_allclose(plan.base, [0.5 + 0.5 * 1.0 + 0.25 * (-2.0) + 0.25 * 4.0])
    go = np.array([[True], [True], [False]])
    bits = np.zeros((3, plan.n_leaves_total), dtype=bool)        # b's masks: leaves 2, 3, 4 in node order
    bits[0] = [True, True, False]       # b sends row 0 left at node 1: leaf 3 (and leaf 2, not b's)
    bits[1] = [True, False, True]
    bits[2] = [True, True, False]
    values = plan.values(go, {"b": bits})
    margin = 0.5 + np.array([-2.0, 4.0, 1.0])
    np.testing.assert_allclose(plan.base + values[:, 0, :].sum(axis=1), margin, atol=1e-12)
    base, phi = naive_shapley([(0, tree)], lambda nd: 0 if nd.owner == "a" else 1,
                              lambda t, nd: go[:, 0] if nd.owner == "a" else np.array([True, False, True]),
                              2, 1, [0.5], 3)
    np.testing.assert_allclose(values, phi, atol=1e-12)


def _random_tree(rng, depth, n_features, passives):
    """A random tree: each split owned by an active feature or a passive party (players repeat on
    paths), random covers (zero included), random leaf values."""
    nodes = [Node(0, 0, -1, n_samples=int(rng.integers(0, 50)))]
    frontier = [0]
    while frontier:
        nid = frontier.pop()
        nd = nodes[nid]
        if nd.depth >= depth or rng.random() < 0.2:
            nd.value = float(rng.normal())
            continue
        nd.is_leaf = False
        owner = int(rng.integers(0, n_features + len(passives)))
        if owner < n_features:
            nd.owner, nd.feature_idx, nd.feature = "a", owner, f"f{owner}"
            nd.threshold, nd.default_left = float(rng.normal()), bool(rng.random() < 0.5)
        else:
            nd.owner, nd.record_id = passives[owner - n_features], nid
        for side in ("left", "right"):
            child = Node(len(nodes), nd.depth + 1, nid, n_samples=int(rng.integers(0, 30)))
            nodes.append(child)
            setattr(nd, side, child.node_id)
            frontier.append(child.node_id)
    return Tree(nodes)


@settings(max_examples=examples(25), deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 6), st.integers(1, 3))
def test_random_ensembles_equal_the_naive_twin(seed, depth, n_trees):
    """Random trees, random decisions: the grouped values (from leaf masks) equal brute force."""
    rng = np.random.default_rng(seed)
    passives, F, n = ["b", "c"], 2, 24
    trees = [(int(rng.integers(0, 2)), _random_tree(rng, depth, F, passives)) for _ in range(n_trees)]
    X = rng.normal(size=(n, F))
    X[rng.random(X.shape) < 0.15] = np.nan
    secret = {(t, nd.node_id): rng.random(n) < 0.5 for t, (_, tree) in enumerate(trees) for nd in tree.nodes
              if not nd.is_leaf and nd.owner != "a"}

    def decide(t, nd):
        if nd.owner == "a":
            return goes_left(X[:, nd.feature_idx], nd.threshold, nd.default_left)
        return secret[(t, nd.node_id)]
    plan = ShapPlan(trees, "a", F, passives, 2, [0.1, -0.2])
    go, bits = [], {p: [] for p in passives}
    for t, (_, tree) in enumerate(trees):
        for nd in tree.nodes:
            if not nd.is_leaf and nd.owner == "a":
                go.append(decide(t, nd))
        for p in passives:          # p's leaf mask: the leaves whose path agrees with p's decisions
            reach = {0: np.ones(n, dtype=bool)}
            for nd in tree.nodes:
                r = reach.pop(nd.node_id)
                if nd.is_leaf:
                    bits[p].append(r)
                elif nd.owner == p:
                    g = decide(t, nd)
                    reach[nd.left], reach[nd.right] = r & g, r & ~g
                else:
                    reach[nd.left] = reach[nd.right] = r
    go = np.stack(go, axis=1) if go else np.zeros((n, 0), dtype=bool)
    values = plan.values(go, {p: np.stack(b, axis=1) for p, b in bits.items()})
    player = {"b": F, "c": F + 1}
    base, phi = naive_shapley(trees, lambda nd: nd.feature_idx if nd.owner == "a" else player[nd.owner], decide,
                              F + 2, 2, [0.1, -0.2], n)
    np.testing.assert_allclose(plan.base, base, rtol=0, atol=1e-9)
    np.testing.assert_allclose(values, phi, rtol=0, atol=1e-9)


@pytest.mark.slow
def test_the_passive_partys_prediction_rules_refuse_an_explanation_as_they_refuse_a_prediction():
    """Mode dp: a passive party refuses to route the rows it released in training; an explanation
    of them is refused with the very same error (the rule sits on PredictStart, which both send)."""
    fed, frames = _fit("binary", mode="dp", n_estimators=1, max_depth=2, epsilon=1.0)
    errors = []
    for ask in (fed.predict_raw, fed.explanation):
        with pytest.raises(PeerError, match="released in its DP-only training") as info:
            ask(frames)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
