"""Issue 31, items 1, 2 and 8: split candidates the active party cannot target, min_node_rows on both
children of every split, and first rounds on the label holder's features only.

In memory (the same PassiveParty code a server runs, every message serialized to bytes); the same
attacks over real gRPC + mutual TLS processes are in test_attacks_network.py. Each attack here was
served by the code before issue 31 (per-bin sums, splits named by (feature, bin))."""
import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.datasets import load_breast_cancer
from support import KEY_BITS, small_frames

from parties import passive_splits
from parties.federation import FederationError, load_federation
from parties.passive_splits import CandidateExchange
from parties.remote import RemoteSource
from protocols import messages as m
from protocols.serialization import loads
from protocols.transport import frame_handler
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core.binning import Binner
from vfl.core.errors import PeerError
from vfl.estimators import VerticalBoostingClassifier

PARAMS = dict(mode="plain", n_estimators=2, max_depth=3, learning_rate=0.5)


def _fed(tamper=None, record=False, **passive):
    a, b, _ = small_frames(200, seed=4)
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b, **passive)], record=record)
    if tamper is not None:
        real = fed.passives["telco"].handle
        seen = []

        def wrap(req):
            seen.append(req)
            return real(tamper(req, seen))
        fed.transport.handlers["telco"] = frame_handler(wrap)
    return fed


def _to(log, party):
    return [loads(f) for _, r, f in log if r == party]


# -- what the active party receives ----------------------------------------------------------------
def test_the_active_party_receives_only_shuffled_running_sums_per_node(monkeypatch):
    """Per node: a CandidateResponse (never per-bin sums), its fields, no feature id; the values are
    exactly the left sums of the passive party's candidate splits (lossless), in a random order."""
    seen = []
    real = RemoteSource._candidates

    def spy(self, reply, tree_idx, node_ids):
        out = real(self, reply, tree_idx, node_ids)
        seen.append((self.channel.current.round_idx, np.asarray(tree_idx), np.asarray(node_ids), out))
        return out
    monkeypatch.setattr(RemoteSource, "_candidates", spy)
    grads = {}
    real_start = RemoteSource.start_round

    def start(self, gradients):
        grads[gradients.round_idx] = gradients.as_float()
        return real_start(self, gradients)
    monkeypatch.setattr(RemoteSource, "start_round", start)
    fed = _fed(record=True)
    fed.fit(TrainParams(**{**PARAMS, "mode": "he", "key_bits": KEY_BITS}))
    replies = _to(fed.transport.log, "bank")
    kinds = {type(r).__name__ for r in replies}
    assert "CandidateResponse" in kinds and "HistogramResponse" not in kinds
    to_telco = {type(q).__name__ for q in _to(fed.transport.log, "telco")}
    assert "CandidatePick" in to_telco and "SplitRequest" not in to_telco
    for r in replies:
        if isinstance(r, m.CandidateResponse):
            assert set(vars(r)) == {"n_candidates", "n_values", "values", "monotone", "cat_features", "compute_us"}
            assert r.n_values == int(r.n_candidates.sum())       # no categorical feature: candidates only
            assert len(r.cat_features) == 0 and len(r.monotone) == 0

    st = fed.passives["telco"]._state
    bins, binner = st.train.bin_idx, st.train.binner
    ex = st.train.candidates
    rnd, tree_idx, node_ids, out = seen[0]            # the root of round 0
    g = grads[rnd][0][:, 0]
    assert node_ids.tolist() == [0]
    expect = []
    for c in range(len(ex.cf)):
        f, b, d = int(ex.cf[c]), int(ex.cb[c]), int(ex.cd[c])
        miss = bins[:, f] == binner.missing_bin(f)
        left = (bins[:, f] <= b) & ~miss | (d == 1) & miss
        if min(left.sum(), (~left).sum()) >= 2:
            expect.append(g[left].sum())
    got = out[0].gl
    assert len(got) == len(expect) > 20
    np.testing.assert_allclose(np.sort(got), np.sort(expect), rtol=0, atol=1e-9)     # lossless
    assert not np.allclose(got, expect)                   # but not in the canonical order


def test_a_position_is_a_fresh_random_candidate_in_every_node():
    """What a deviating active party can still name: a position. Over many nodes, position 0 is every
    candidate about equally often (the order is fresh per node), so it targets no feature or bin."""
    X = np.random.default_rng(0).normal(size=(300, 3))
    binner = Binner(8).fit(X)
    bins = binner.transform(X)
    ex = CandidateExchange(binner, np.zeros(3, dtype=bool), 1, None, False)
    n_flat = int(ex.offsets[-1])
    counts = np.concatenate([np.bincount(bins[:, f], minlength=int(binner.n_bins[f])) for f in range(3)])
    sums = {(0, 0): list(range(1, n_flat + 1))}
    hits = np.zeros(len(ex.cf), dtype=np.int64)
    for _ in range(3000):
        picks = ex.answer([(0, 0)], sums, {(0, 0): counts}, None, passive_splits.shuffle_rng())[3]
        hits[picks[(0, 0)][0]] += 1
    assert len(ex.cf) == int(np.sum(binner.n_bins - 1))     # every threshold of every feature (no missing values)
    sent = hits > 0       # all but each feature's last threshold (it leaves no row on the right)
    assert sent.sum() == len(ex.cf) - 3 == len(picks[(0, 0)])
    k = int(sent.sum())
    # about uniform: no position stands for a feature
    assert hits[sent].min() > 3000 / k / 3 and hits.max() < 3 * 3000 / k


# -- the targeted split requests of the second review -------------------------------------------------
def test_a_split_request_naming_a_feature_and_bin_is_refused():
    """The binary search of issue 31 (1.): the active party asked for splits on (feature 0, bin b) of its
    choosing and read each row's bin from the answers. Now splits are named only by position."""
    def tamper(req, seen):
        if isinstance(req, m.CandidatePick):
            return m.SplitRequest(req.round_idx, req.node_ids, req.tree_idx, np.zeros(len(req.node_ids), np.int32),
                                  np.full(len(req.node_ids), 3, np.int32), np.zeros(len(req.node_ids), bool))
        return req
    with pytest.raises(PeerError, match="telco.*refuses SplitRequest: rule 'shuffled candidates'"):
        _fed(tamper).fit(TrainParams(**PARAMS))


def test_a_pick_outside_the_sent_candidates_is_refused():
    def tamper(req, seen):
        if isinstance(req, m.CandidatePick):
            pos = np.full(len(req.positions), 10 ** 6, np.int32)
            return m.CandidatePick(req.round_idx, req.node_ids, req.tree_idx, req.n_positions, pos,
                                   req.feature_idx, req.default_left, req.n_left_bins, req.left_bins)
        return req
    with pytest.raises(PeerError, match="telco.*refuses CandidatePick of round 0: rule 'shuffled candidates': "
                                        "positions"):
        _fed(tamper).fit(TrainParams(**PARAMS))


def test_parent_minus_a_one_row_child_is_refused():
    """Issue 31 (1.): the active party split the root {row 7} | rest on its own, asked only for "rest",
    and read row 7's bins as root minus rest (min_node_rows applied to histograms built only)."""
    def tamper(req, seen):
        if isinstance(req, m.HistogramRequest) and not np.all(req.node_ids == 0):
            a = req.assignment.copy()
            a[0] = np.where(a[0] >= 0, 2, -2 - 2)
            a[0, 7] = 1
            return m.HistogramRequest(req.round_idx, np.zeros(1, np.int32), np.array([2], np.int32), a)
        return req
    with pytest.raises(PeerError, match="telco.*rule 'min_node_rows': tree 0: node 0 is divided leaving child 1 "
                                        "with 1 rows"):
        _fed(tamper).fit(TrainParams(**PARAMS))


def test_every_split_leaves_both_children_at_the_floor():
    fed = _fed()
    model = fed.fit(TrainParams(**{**PARAMS, "min_node_rows": 15, "max_depth": 5, "n_estimators": 3}))
    sizes = [n.n_samples for r in model.rounds for t in r for n in t.nodes]
    assert min(sizes) >= 15
    assert any(not n.is_leaf and n.owner == "telco" for r in model.rounds for t in r for n in t.nodes)


# -- categorical features ------------------------------------------------------------------------
def _categorical_fed(record=True, **passive):
    rng = np.random.default_rng(5)
    n = 300
    city = rng.integers(0, 6, n)
    x = rng.normal(size=n)
    y = ((city % 3 == 0) ^ (x > 0.5)).astype(int)
    a = pd.DataFrame({"id": np.arange(n), "y": y, "x": x})
    b = pd.DataFrame({"id": np.arange(n), "city": pd.Categorical([f"c{v}" for v in city]),
                      "z": rng.normal(size=n)})
    return Federation(ActiveParty("bank", a), [PassiveParty("telco", b, **passive)], record=record)


def test_categorical_features_send_per_category_sums_unless_the_party_orders_them():
    """Default: a categorical feature's per-category sums reach the active party (named by position);
    with categorical_ordered the party treats it as ordered bins: shuffled candidates only."""
    out = {}
    for ordered in (False, True):
        fed = _categorical_fed(categorical_ordered=ordered)
        fed.fit(TrainParams(mode="plain", n_estimators=2, max_depth=3, min_data_per_group=5, cat_smooth=1.0))
        replies = [r for r in _to(fed.transport.log, "bank") if isinstance(r, m.CandidateResponse)]
        out[ordered] = {tuple(r.cat_features.tolist()) for r in replies}
        info = [r for r in _to(fed.transport.log, "bank") if isinstance(r, m.BinningInfo)][0]
        assert bool(np.any(info.categorical)) is (not ordered)
        assert any(rec["feature"] == "city" for rec in fed.passives["telco"].records) or ordered
    assert out[False] == {(0,)} and out[True] == {()}


def test_categorical_ordered_he_equals_plain():
    models = {}
    for mode in ("plain", "he"):
        fed = _categorical_fed(record=False, categorical_ordered=True)
        fed.fit(TrainParams(mode=mode, key_bits=KEY_BITS, n_estimators=2, max_depth=3))
        models[mode] = ([t.structure() for r in fed.model.rounds for t in r], fed.passives["telco"].records)
    assert models["he"] == models["plain"]


# -- label-holder-only first rounds ----------------------------------------------------------------
def test_active_only_rounds_send_nothing_of_those_rounds_to_a_passive_party():
    fed = _fed(record=True)
    model = fed.fit(TrainParams(**{**PARAMS, "n_estimators": 4, "active_only_rounds": 2}))
    got = _to(fed.transport.log, "telco")
    rounds = {q.round_idx for q in got if isinstance(q, (m.GradientsStart, m.GradientShard, m.HistogramRequest,
                                                           m.CandidatePick))}
    assert rounds and min(rounds) == 2
    owners = [{n.owner for t in r for n in t.nodes if not n.is_leaf} for r in model.rounds]
    assert owners[0] <= {"bank"} and owners[1] <= {"bank"}
    assert any("telco" in o for o in owners[2:])
    setup = [q for q in got if isinstance(q, m.TrainSetup)][0]
    assert setup.active_only_rounds == 2


def test_a_passive_party_may_require_active_only_rounds():
    fed = _fed()
    fed.passives["telco"].require_active_only_rounds = 2
    with pytest.raises(PeerError, match="rule 'active-only rounds'.*1 first round.*at least 2"):
        fed.fit(TrainParams(**{**PARAMS, "n_estimators": 3, "active_only_rounds": 1}))
    fed = _fed()
    fed.passives["telco"].require_active_only_rounds = 2
    fed.fit(TrainParams(**{**PARAMS, "n_estimators": 3, "active_only_rounds": 2}))


def test_gradients_of_an_active_only_round_are_refused():
    """A deviating active party that agreed 2 active-only rounds and streams gradients of round 0."""
    def tamper(req, seen):
        if isinstance(req, m.GradientsStart):
            return m.GradientsStart(0, req.encrypted, req.layout, req.values_per_ciphertext, req.shifts, req.groups,
                                    req.n_samples, req.width, req.signed)
        return req
    with pytest.raises(PeerError, match="telco.*rule 'active-only rounds'"):
        _fed(tamper).fit(TrainParams(**{**PARAMS, "n_estimators": 3, "active_only_rounds": 2}))


def test_the_estimators_take_active_only_rounds():
    X, y = load_breast_cancer(return_X_y=True)
    est = VerticalBoostingClassifier(n_estimators=3, max_depth=2, mode="plain", n_parties=2, active_only_rounds=2)
    assert clone(est).get_params()["active_only_rounds"] == 2
    est.fit(X[:200], y[:200])
    owners = [{n.owner for t in r for n in t.nodes if not n.is_leaf} for r in est.model_.rounds]
    label_holder = est.model_.active_party
    assert owners[0] <= {label_holder} and owners[1] <= {label_holder} and owners[2] - {label_holder}


def test_a_federation_entry_may_require_active_only_rounds_and_ordered_categories(tmp_path):
    path = tmp_path / "federation.toml"
    body = ('[federation]\nactive = "bank"\n\n[parties.bank]\n\n[parties.telco]\naddress = "127.0.0.1:5000"\n'
            'require_active_only_rounds = 3\ncategorical_ordered = true\n')
    path.write_text(body)
    entry = load_federation(path).parties["telco"]
    assert entry.require_active_only_rounds == 3 and entry.categorical_ordered is True
    for bad, key in (("require_active_only_rounds = -1", "require_active_only_rounds"),
                     ('categorical_ordered = "yes"', "categorical_ordered")):
        path.write_text(body.replace("require_active_only_rounds = 3\ncategorical_ordered = true\n", bad + "\n"))
        with pytest.raises(FederationError, match=rf"\[parties.telco\] {key}"):
            load_federation(path)
    path.write_text(body.replace('[parties.bank]\n', '[parties.bank]\nrequire_active_only_rounds = 1\n'))
    with pytest.raises(FederationError, match=r"\[parties.bank\] require_active_only_rounds: a passive party"):
        load_federation(path)
