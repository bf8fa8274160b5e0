"""A passive party's own features (opt-in): its grouped value split among its features (an Owen
value of the path-dependent TreeSHAP game), computed by the party, never seen by the active party."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import KEY_BITS

from datasets.errors import InputError, PeerError, ProtocolError
from datasets.frames import party_data
from parties import explain_features
from parties.federation import FederationError, parse_federation
from parties.passive_explain import EXPLAIN_DIR
from parties.server import PassiveServer
from protocols import messages as m
from protocols.serialization import dumps, loads
from protocols.transport import InMemoryTransport
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core import explain as explain_core
from vfl.core.explain import _leaf_phi, naive_owen, own_feature_values
from vfl.core.split import goes_left

OBJECTIVES = ("binary", "multiclass", "regression")


def _frames(objective, n=120, seed=0, categorical=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    X[rng.random(X.shape) < 0.1] = np.nan
    z = np.nan_to_num(X)
    score = z[:, 0] + z[:, 2] - z[:, 4] + 0.7 * z[:, 3] * z[:, 5] - 0.6 * z[:, 1]
    ids = np.arange(n)
    a = pd.DataFrame({"id": ids, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})
    c = pd.DataFrame({"id": ids, "c0": X[:, 4], "c1": X[:, 5]})
    if categorical:
        colour = rng.choice(["red", "green", "blue"], size=n).astype(object)
        colour[rng.random(n) < 0.1] = None
        b["colour"] = colour
        score = score + 1.2 * (colour == "red")
    y = {"binary": (score + 0.3 * rng.normal(size=n) > 0).astype(int),
         "multiclass": np.digitize(score, [-0.7, 0.7]),
         "regression": 3 * score + rng.normal(size=n)}[objective]
    a.insert(1, "y", y)
    return a, b, c


def _fit(objective, categorical=False, record=False, n_estimators=3, max_depth=3, allow=("b", "c")):
    a, b, c = _frames(objective, categorical=categorical)
    fed = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)], record=record)
    fed.fit(TrainParams(mode="plain", objective=objective, n_estimators=n_estimators, max_depth=max_depth,
                        key_bits=KEY_BITS))
    for p in allow:
        fed.passives[p].explain_features = True
    return fed, {"a": a.drop(columns="y"), "b": b, "c": c}


def _owen_oracle(fed, frames):
    """The brute-force Owen values of every feature (active ones alone, each passive party's
    together), the passive decisions from the parties' own lookup tables."""
    model = fed.model
    d = party_data(frames["a"], "a", "id", None, None, categories=model.categories)
    XA = d.X[:, [d.feature_names.index(f) for f in model.active_features]]
    nA = len(model.active_features)
    groups = [[j] for j in range(nA)]
    offset, passive_X = {}, {}
    for name in model.passives:
        s = fed.passives[name]._state
        dd = party_data(frames[name], name, "id", None, None, categories=s.categories)
        passive_X[name] = dd.X[:, [dd.feature_names.index(f) for f in s.feature_names]]
        offset[name] = sum(len(g) for g in groups)
        groups.append(list(range(offset[name], offset[name] + len(s.feature_names))))

    def col(nd):
        return int(fed.passives[nd.owner]._state.table.features(np.array([nd.record_id]))[0])

    def feature_of(nd):
        return nd.feature_idx if nd.owner == model.active_party else offset[nd.owner] + col(nd)

    def decide(t, nd):
        if nd.owner == model.active_party:
            return goes_left(XA[:, nd.feature_idx], nd.threshold, nd.default_left, categories=nd.categories)
        table = fed.passives[nd.owner]._state.table
        return table.go_left(np.full(len(XA), nd.record_id), passive_X[nd.owner][:, col(nd)])
    phi = naive_owen(model._flat_trees(None), feature_of, groups, decide, model.n_targets, model.base_score, len(XA))
    return phi, offset


def _own(fed, party, n_targets):
    """The party's kept per-feature values as ``(n, K, F)``."""
    t = fed.passives[party].feature_explanation()
    feats = list(fed.passives[party].feature_names)
    assert list(t.columns) == ["id"] + (["target"] if n_targets > 1 else []) + feats
    return t, t[feats].to_numpy().reshape(-1, n_targets, len(feats))


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_per_feature_values_add_up_to_the_group_value_and_equal_the_brute_force_owen_value(objective):
    # regression: five trees, as with three (since every split keeps min_node_rows rows on both
    # sides, issue 31) no passive party splits on two of its features, and the last assertion
    # would exercise nothing
    fed, frames = _fit(objective, categorical=objective == "binary",
                       n_estimators=5 if objective == "regression" else 3)
    model = fed.model
    ids, ex = fed.explanation(frames, passive_features=True)
    assert ex.feature_splits == {"b": len(ids), "c": len(ids)}
    phi, offset = _owen_oracle(fed, frames)
    nA = len(model.active_features)
    used = []
    # the active features' Owen values are their Shapley values (singleton groups)
    np.testing.assert_allclose(ex.values[:, :, :nA], phi[:, :, :nA], rtol=0, atol=1e-9)
    for i, party in enumerate(model.passives):
        table, own = _own(fed, party, model.n_targets)
        np.testing.assert_array_equal(table["id"].to_numpy()[::model.n_targets], ids)
        group = ex.values[:, :, nA + i]
        np.testing.assert_allclose(own.sum(axis=2), group, rtol=0, atol=1e-9)
        F = own.shape[2]
        np.testing.assert_allclose(own, phi[:, :, offset[party]:offset[party] + F], rtol=0, atol=1e-9)
        used.append(int(np.count_nonzero(np.abs(own).max(axis=(0, 1)) > 1e-6)))
    assert max(used) >= 2, "a passive party splits its value among two features or more"


def test_a_passive_party_refuses_by_default_naming_the_rule():
    fed, frames = _fit("binary", allow=())
    with pytest.raises(PeerError, match="rule 'explain_features'"):
        fed.explanation(frames, passive_features=True)
    assert fed.passives["b"].feature_explanation() is None
    # a party that allows it is served; one that does not is never asked unless named
    fed.passives["b"].explain_features = True
    _, ex = fed.explanation(frames, passive_features=["b"])
    assert set(ex.feature_splits) == {"b"} and fed.passives["c"].feature_explanation() is None
    with pytest.raises(PeerError, match="rule 'explain_features'"):
        fed.explanation(frames, passive_features=["c"])


def _exchange(log):
    return [(s, r, type(loads(f)).__name__, loads(f)) for s, r, f in log]


def test_the_active_party_receives_no_per_feature_value():
    fed, frames = _fit("multiclass", record=True)
    fed.transport.log.clear()
    fed.explanation(frames)                      # the default: exactly a prediction's messages
    plain = _exchange(fed.transport.log)
    assert "FeatureSplitRequest" not in {k for _, _, k, _ in plain}
    assert fed.passives["b"].feature_explanation() is None
    fed.transport.log.clear()
    ids, ex = fed.explanation(frames, passive_features=True)
    got = _exchange(fed.transport.log)
    replies = [(s, k, msg) for s, r, k, msg in got if r == "a"]
    assert {k for _, k, _ in replies} <= {"Ack", "LeafMaskResponse", "FeatureSplitDone"}
    done = [msg for _, k, msg in replies if k == "FeatureSplitDone"]
    assert len(done) == 2 and all(vars(d) == {"n_rows": len(ids)} for d in done)
    for s, k, msg in replies:                   # no reply holds a float beyond prediction's
        floats = [v for v in vars(msg).values() if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
        assert not floats, (s, k)
    # each passive party kept its own values; the requests carry weights, no leaf value as such
    for p in ("b", "c"):
        assert fed.passives[p].feature_explanation() is not None
    reqs = [msg for _, r, k, msg in got if k == "FeatureSplitRequest"]
    assert {r for _, r, k, _ in got if k == "FeatureSplitRequest"} == {"b", "c"}
    assert all(msg.weights.shape[0] == len(ids) for msg in reqs)


def test_a_request_with_rows_or_records_that_do_not_match_is_refused():
    fed, frames = _fit("binary", n_estimators=1)
    s = fed.passives["b"]._state
    good = m.FeatureSplitRequest("x1", 1, np.array([0]), np.array([0, 1]), np.array([0]), np.array([True]),
                                 np.array([0.5]), np.ones((3, 1)))
    with pytest.raises(ProtocolError, match="unknown prediction session"):
        fed.passives["b"].handle(good)
    s.sessions["x1"], s.session_ids["x1"] = np.zeros((2, len(s.feature_names))), np.arange(2)
    with pytest.raises(ProtocolError, match="weights of 3 rows for a session of 2 rows"):
        fed.passives["b"].handle(good)
    bad = m.FeatureSplitRequest("x1", 1, np.array([0]), np.array([0, 1]), np.array([10 ** 6]), np.array([True]),
                                np.array([0.5]), np.ones((2, 1)))
    with pytest.raises(ProtocolError, match="unknown record id"):
        fed.passives["b"].handle(bad)
    assert s.max_depth == 3 and len(np.unique(s.table.tree_keys())) == 1
    L = 2 ** 3 + 1                      # one tree of depth 3 holds 8 leaves
    many = m.FeatureSplitRequest("x1", 1, np.zeros(L, int), np.arange(L + 1), np.zeros(L, int), np.ones(L, bool),
                                 np.full(L, 0.5), np.ones((2, L)))
    with pytest.raises(ProtocolError, match="rule 'leaf budget': 9 leaves, more than its 1 tree"):
        fed.passives["b"].handle(many)
    for kw, match in (({"path_z": np.array([1.5])}, "cover fractions"),
                      ({"path_start": np.array([0, 2])}, "offsets"),
                      ({"weights": np.array([[np.nan], [1.0]])}, "not finite")):
        fields = {**vars(good), "weights": np.ones((2, 1)), **kw}
        with pytest.raises(ProtocolError, match=match):
            loads(dumps(m.FeatureSplitRequest(**fields)))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 31 - 1), st.integers(1, 5), st.integers(1, 4))
def test_own_feature_values_add_up_to_the_weighted_group_difference(seed, n_nodes, n_features):
    """Random leaves: per row, sum over features = sum over leaves of w * (o_G - z_G) (efficiency
    of the within-group Shapley split), a feature on several nodes one player."""
    rng = np.random.default_rng(seed)
    n, L = 7, 3
    sizes = rng.integers(1, n_nodes + 1, size=L)
    start = np.r_[0, np.cumsum(sizes)]
    feat = rng.integers(0, n_features, size=start[-1])
    agree = rng.random((n, start[-1])) < 0.6
    z = rng.uniform(0.05, 1.0, size=start[-1])
    w = rng.normal(size=(n, L))
    out = own_feature_values(w, np.zeros(L, dtype=int), start, feat, agree, z, 1, n_features)
    expect = sum(w[:, li] * (agree[:, start[li]:start[li + 1]].all(axis=1) - np.prod(z[start[li]:start[li + 1]]))
                 for li in range(L))
    np.testing.assert_allclose(out[:, 0, :].sum(axis=1), expect, rtol=0, atol=1e-12)
    assert np.all(out[:, 0, np.setdiff1d(np.arange(n_features), feat)] == 0)
    one = _leaf_phi(1.0, np.array([0.3]), np.array([[1.0], [0.0]]))
    np.testing.assert_allclose(one[:, 0], [0.7, -0.3])


def test_through_passive_servers_the_party_writes_its_own_file_and_a_party_without_the_rule_refuses(tmp_path):
    """In-process passive servers (every message as bytes through ``handle_frame``): b's policy
    says explain_features (as its federation entry would), c's does not."""
    a, b, c = _frames("binary", n=90)
    servers = {"b": PassiveServer("b", b, "id", tmp_path / "b",
                                  policy={"explain_features": True, "explain_dir": str(tmp_path / "b" / EXPLAIN_DIR)}),
               "c": PassiveServer("c", c, "id", tmp_path / "c")}
    transport = InMemoryTransport("a", {p: s.handle_frame for p, s in servers.items()}, record=True)
    active = ActiveParty("a", a)
    active.fit(transport, ["b", "c"], TrainParams(mode="plain", n_estimators=3, max_depth=3))
    rows = a.drop(columns="y")
    transport.log.clear()
    ids, ex = active.explain(transport, rows, passive_features=["b"])
    assert ex.feature_splits == {"b": 90}
    files = list((tmp_path / "b" / EXPLAIN_DIR).glob("*.csv"))
    assert len(files) == 1 and files[0].name.startswith(active.model.model_id)
    assert files[0].stat().st_mode & 0o777 == 0o600
    own = pd.read_csv(files[0])
    assert list(own.columns) == ["id", "b0", "b1"] and own["id"].tolist() == ids.tolist()
    nB = ex.players.index("b")
    np.testing.assert_allclose(own[["b0", "b1"]].sum(axis=1), ex.values[:, 0, nB], rtol=0, atol=1e-9)
    replies = [loads(f) for s, r, f in transport.log if r == "a"]
    assert [vars(x) for x in replies if isinstance(x, m.FeatureSplitDone)] == [{"n_rows": 90}]
    with pytest.raises(PeerError, match="party 'c' refuses FeatureSplitRequest: rule 'explain_features'"):
        active.explain(transport, rows, passive_features=["c"])
    assert not (tmp_path / "c" / EXPLAIN_DIR).exists()
    assert servers["c"].open_sessions() == 0 and servers["b"].open_sessions() == 0
    with pytest.raises(InputError, match="needs align 'hash'"):
        active.explain(transport, rows, align="psi", passive_features=True)


def test_the_federation_file_says_explain_features_for_a_passive_party_only(tmp_path):
    base = {"federation": {"active": "a"}, "parties": {"a": {}, "b": {"address": "127.0.0.1:5000"},
                                                       "c": {"address": "127.0.0.1:5001"}}}
    fed = parse_federation(base, "f.toml")
    assert not fed.party("b").explain_features
    base["parties"]["b"]["explain_features"] = True
    fed = parse_federation(base, "f.toml")
    assert fed.party("b").explain_features and not fed.party("c").explain_features
    base["parties"]["c"]["explain_features"] = "yes"
    with pytest.raises(FederationError, match=r"f.toml.*parties.c.*explain_features.*expected true or false"):
        parse_federation(base, "f.toml")
    del base["parties"]["c"]["explain_features"]
    base["parties"]["a"]["explain_features"] = True
    with pytest.raises(FederationError, match=r"parties.a.*explain_features.*only a passive party"):
        parse_federation(base, "f.toml")


def test_many_rows_go_in_several_sessions_and_still_add_up(monkeypatch):
    fed, frames = _fit("regression", n_estimators=2, max_depth=2, allow=("b",), record=True)
    monkeypatch.setattr(explain_features, "MAX_WEIGHT_BYTES", 8 * 40)       # a few rows per request
    fed.transport.log.clear()
    ids, ex = fed.explanation(frames, passive_features=["b"])
    kinds = [type(loads(f)).__name__ for s, r, f in fed.transport.log if r == "b"]
    assert kinds.count("FeatureSplitRequest") > 3
    _, own = _own(fed, "b", 1)
    assert len(own) == len(ids) and ex.feature_splits == {"b": len(ids)}
    np.testing.assert_allclose(own.sum(axis=2)[:, 0], ex.values[:, 0, ex.players.index("b")], rtol=0, atol=1e-9)
    assert not fed.passives["b"]._state.sessions and not fed.passives["b"]._state.session_ids


def test_without_pattern_tables_the_direct_polynomials_give_the_same_owen_values(monkeypatch):
    """Leaves with more players than the pattern tables hold are computed per row (both sides)."""
    monkeypatch.setattr(explain_core, "TABLE_PLAYERS", 0)
    fed, frames = _fit("regression")
    ids, ex = fed.explanation(frames, passive_features=True)
    phi, offset = _owen_oracle(fed, frames)
    for party in fed.model.passives:
        _, own = _own(fed, party, 1)
        np.testing.assert_allclose(own, phi[:, :, offset[party]:offset[party] + own.shape[2]], rtol=0, atol=1e-9)
    np.testing.assert_allclose(ex.values[:, :, :len(fed.model.active_features)],
                               phi[:, :, :len(fed.model.active_features)], rtol=0, atol=1e-9)
