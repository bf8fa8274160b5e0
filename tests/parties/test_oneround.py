"""One-round batch prediction (--prediction one-round): leaf masks.

What is proved here: one-round and node-by-node prediction give exactly the same
scores (breast cancer, 2 and 3 parties, missing values everywhere, hash and PSI
row matching, a saved and reloaded model), and both match an oracle that
evaluates the trees with every party's thresholds in one place; the passive
party receives only tree shapes and its own record ids, and one message; its
masks do reveal its decisions at nodes off the rows' paths (documented
leakage, measured here); malformed skeletons and dishonest masks are refused
with clear errors.
"""
import numpy as np
import pytest
from support import KEY_BITS, small_frames

from datasets import train_test_split_parties
from parties import passive
from parties.active import ActiveParty
from parties.passive import PassiveParty
from parties.passive_state import LookupTable
from parties.server import PassiveServer
from protocols import alignment, serialization
from protocols import messages as m
from protocols.serialization import dumps, loads
from protocols.transport import frame_handler
from vfl.api import Federation, federation_from_frames
from vfl.core.errors import PeerError, ProtocolError
from vfl.core.leafmask import Skeleton, leaf_masks, resolve_leaves, skeleton_of
from vfl.core.params import TrainParams
from vfl.core.split import goes_left
from vfl.core.tree import Node, Tree


def with_missing(party_frames, frac=0.12, seed=0):
    """A copy with ``frac`` of every feature column set to NaN (ids and labels kept)."""
    rng = np.random.default_rng(seed)
    out = []
    for pf in party_frames:
        f = pf.frame.copy()
        for c in pf.feature_names:
            f.loc[rng.random(len(f)) < frac, c] = np.nan
        out.append(type(pf)(pf.name, f, pf.id_col, pf.label_col, pf.source))
    return out


def trained(party_frames, **params):
    train, test = train_test_split_parties(party_frames, test_size=0.25, seed=0)
    fed = federation_from_frames(train, record=True)
    fed.fit(TrainParams(**{"mode": "plain", "n_estimators": 5, "max_depth": 4, **params}))
    return fed, {pf.name: pf.frame for pf in test}


def final_leaves(fed, frames):
    """The leaf of every (row, tree), walking the trees with every party's thresholds in one
    place (a test-only oracle; rows in the active party's frame order)."""
    model = fed.model
    ids = frames[model.active_party]["id"].to_numpy()
    data = {name: f.set_index("id").loc[ids] for name, f in frames.items()}
    trees = [t for rnd in model.rounds for t in rnd]
    out = np.zeros((len(ids), len(trees)), dtype=np.int64)
    for t, tree in enumerate(trees):
        for i in range(len(ids)):
            node = tree.nodes[0]
            while not node.is_leaf:
                if node.owner == model.active_party:
                    feat, thr, dl = node.feature, node.threshold, node.default_left
                else:
                    rec = fed.passives[node.owner].records[node.record_id]
                    feat, thr, dl = rec["feature"], rec["threshold"], rec["default_left"]
                x = data[node.owner][feat].iloc[i]
                go_left = dl if np.isnan(x) else x <= thr
                node = tree.nodes[node.left if go_left else node.right]
            out[i, t] = node.node_id
    return out


def oracle(fed, frames):
    model = fed.model
    leaves = final_leaves(fed, frames)
    raw = np.tile(np.asarray(model.base_score, dtype=float), (len(leaves), 1))
    flat = [(k, t) for rnd in model.rounds for k, t in enumerate(rnd)]
    for ti, (k, tree) in enumerate(flat):
        raw[:, k] += np.array([n.value for n in tree.nodes])[leaves[:, ti]]
    return raw


def frames_received(fed, start, party):
    return [loads(f) for s, r, f in fed.transport.log[start:] if r == party]


# --- agreement -------------------------------------------------------------------
@pytest.mark.slow
def test_one_round_equals_node_by_node_breast_cancer_with_missing(breast2):
    fed, test = trained(with_missing(breast2))
    max_leaves = max(len(t.leaves()) for rnd in fed.model.rounds for t in rnd)
    assert max_leaves > 8                                  # masks span several bytes
    for frames in (None, test):   # training rows, then new rows
        node = fed.predict_raw(frames, prediction="node")
        one = fed.predict_raw(frames, prediction="one-round")
        assert np.array_equal(node, one)
    assert np.allclose(fed.predict_raw(test), oracle(fed, test), rtol=0, atol=1e-12)
    # the default is one-round
    start = len(fed.transport.log)
    fed.predict_raw(test)
    assert [type(x).__name__ for x in frames_received(fed, start, "passive1")] == ["PredictStart", "LeafMaskRequest"]


@pytest.mark.slow
@pytest.mark.parametrize("align, scheme", [("hash", "paillier"), ("psi", "paillier"), ("hash", "ou")])
def test_one_round_equals_node_by_node_three_parties(breast3, align, scheme):
    fed, test = trained(with_missing(breast3, seed=3), mode="he", key_bits=KEY_BITS, n_estimators=3,
                        max_depth=3, align=align, scheme=scheme)
    owners = {n.owner for rnd in fed.model.rounds for t in rnd for n in t.nodes if not n.is_leaf}
    assert owners == {"active", "passive1", "passive2"}           # every party decides some nodes
    node = fed.predict_raw(test, prediction="node")
    one = fed.predict_raw(test, prediction="one-round")
    assert np.array_equal(node, one)
    assert np.allclose(one, oracle(fed, test), rtol=0, atol=1e-12)


@pytest.mark.slow
def test_saved_model_and_n_rounds(breast3, tmp_path):
    fed, test = trained(with_missing(breast3, seed=5))
    fed.save(tmp_path)
    fed2 = Federation.load(tmp_path)
    assert np.array_equal(fed2.predict_raw(test, prediction="one-round"), fed.predict_raw(test, prediction="node"))
    # BoostedModel level: a prefix of the rounds, through the same callbacks the parties use
    model, p1 = fed.model, fed.passives["passive1"]
    fed.predict_raw(test, prediction="node")               # loads the prediction data at the passives
    X = test["active"][model.active_features].to_numpy(dtype=float)
    hashes = alignment.hash_ids(test["active"]["id"], p1.salt)
    for name, p in fed.passives.items():
        for session in ("route", "masks"):
            p.handle(m.PredictStart(model.model_id, f"{session}-{name}", hashes))

    def route(owner, rec, rows):
        return fed.passives[owner].handle(m.RouteRequest(f"route-{owner}", rec, rows)).go_left

    def fetch(owner, sk):
        return fed.passives[owner].handle(m.LeafMaskRequest(f"masks-{owner}", **sk.to_fields())).masks

    assert np.array_equal(model.predict_raw_one_round(X, fetch, n_rounds=2), model.predict_raw(X, route, n_rounds=2))


def test_active_only_model_sends_no_mask_request(breast2):
    g = breast2[0]
    active = federation_from_frames([g]).active
    fed = Federation(active, [], record=True)
    fed.fit(TrainParams(mode="plain", n_estimators=2, max_depth=3))
    assert np.array_equal(fed.predict_raw(prediction="one-round"), fed.predict_raw(prediction="node"))
    assert fed.transport.log == []


# --- what the parties see -------------------------------------------------------
@pytest.mark.slow
def test_passive_gets_one_message_with_shapes_and_its_record_ids_only(breast3):
    fed, test = trained(breast3)
    start = len(fed.transport.log)
    fed.predict_raw(test, prediction="one-round")
    for name, p in fed.passives.items():
        got = frames_received(fed, start, name)
        assert [type(x).__name__ for x in got] == ["PredictStart", "LeafMaskRequest"]
        req = got[1]
        for field in ("tree_sizes", "left", "right", "record_ids"):
            assert getattr(req, field).dtype.kind == "i"            # no threshold, no leaf value
        mine = {n.record_id for rnd in fed.model.rounds for t in rnd for n in t.nodes
                if not n.is_leaf and n.owner == name}
        assert set(req.record_ids[req.record_ids >= 0].tolist()) == mine
        # the other parties' internal nodes look the same to it: children, record id -1
        others = sum(1 for rnd in fed.model.rounds for t in rnd for n in t.nodes
                     if not n.is_leaf and n.owner != name)
        assert int(np.sum((req.left >= 0) & (req.record_ids < 0))) == others
        reply = [loads(f) for s, r, f in fed.transport.log[start:] if s == name][-1]
        width = int(Skeleton(req.tree_sizes, req.left, req.right, req.record_ids).mask_bytes().sum())
        assert reply.masks.shape == (len(test["active"]), width) and width > 0
    # node-by-node: more round trips, and the passive learns which rows reach its nodes
    start = len(fed.transport.log)
    fed.predict_raw(test, prediction="node")
    got = frames_received(fed, start, "passive1")
    assert len(got) > 3 and all(isinstance(x, m.RouteRequest) for x in got[1:-1])
    assert isinstance(got[-1], m.PredictEnd)          # the session ends (its rows are freed)


@pytest.mark.slow
def test_masks_reveal_passive_decisions_off_the_path(breast2):
    """Documented leakage: from the masks the active party reads the passive party's decision
    at every one of its nodes that its own higher decisions do not cut off, on or off the path."""
    fed, test = trained(with_missing(breast2, seed=7))
    start = len(fed.transport.log)
    fed.predict_raw(test, prediction="one-round")
    req = [x for x in frames_received(fed, start, "passive1") if isinstance(x, m.LeafMaskRequest)][0]
    masks = [loads(f) for s, r, f in fed.transport.log[start:] if s == "passive1"][-1].masks
    sk = Skeleton(req.tree_sizes, req.left, req.right, req.record_ids)
    p1 = fed.passives["passive1"]
    data = test["passive1"].set_index("id").loc[test["active"]["id"].to_numpy()]
    trees = [t for rnd in fed.model.rounds for t in rnd]
    leaves_all = final_leaves(fed, test)
    off = sk.offsets()
    nb = sk.mask_bytes()
    read, off_path, queried_by_node = 0, 0, 0
    for t, tree in enumerate(trees):
        bits = np.unpackbits(masks[:, int(nb[:t].sum()):int(nb[:t + 1].sum())], axis=1,
                             count=len(tree.leaves())).astype(bool)
        leaf_ids = [n.node_id for n in tree.leaves()]
        for node in tree.nodes:
            if node.is_leaf or node.owner != "passive1":
                continue
            rec = p1.records[node.record_id]
            x = data[rec["feature"]].to_numpy()
            truth = np.where(np.isnan(x), rec["default_left"], x <= rec["threshold"])
            under_left = np.isin(leaf_ids, _subtree(tree, node.left))
            under_right = np.isin(leaf_ids, _subtree(tree, node.right))
            visible = bits[:, under_left].any(axis=1) | bits[:, under_right].any(axis=1)
            inferred = bits[:, under_left].any(axis=1)
            assert np.array_equal(inferred[visible], truth[visible])   # the mask gives it away
            on_path = np.isin(leaves_all[:, t], _subtree(tree, node.node_id))
            read += int(visible.sum())
            off_path += int((visible & ~on_path).sum())
            queried_by_node += int(on_path.sum())
    assert off_path > 0 and read > queried_by_node         # more than node-by-node reveals
    assert int(off[-1]) == sum(len(t.nodes) for t in trees)


def _subtree(tree, nid):
    out, stack = [], [nid]
    while stack:
        v = stack.pop()
        out.append(v)
        n = tree.nodes[v]
        if not n.is_leaf:
            stack += [n.left, n.right]
    return out


# --- the mask logic on a hand-built tree ------------------------------------------
def test_leaf_masks_by_hand():
    # node 0 (B) -> 1, 2 ; node 1 (A) -> 3, 4 ; leaves 2, 3, 4 (in that bit order)
    tree = Tree()
    tree.add(Node(0, 0, is_leaf=False, left=1, right=2, owner="B", record_id=7))
    tree.add(Node(1, 1, parent=0, is_leaf=False, left=3, right=4, owner="A", feature_idx=0, threshold=0.5,
                  default_left=True))
    for nid, depth in ((2, 1), (3, 2), (4, 2)):
        tree.add(Node(nid, depth, parent=0 if nid == 2 else 1))
    sk_b, sk_a = skeleton_of([tree], "B"), skeleton_of([tree], "A")
    assert sk_b.record_ids.tolist() == [7, -1, -1, -1, -1] and sk_a.record_ids.tolist() == [-1] * 5
    sk_b.validate(n_records=8)
    mb = leaf_masks(sk_b, np.array([0]), np.array([[True], [False]]))       # B decides node 0
    ma = leaf_masks(sk_a, np.array([1]), np.array([[False], [True]]))       # A decides node 1
    assert np.unpackbits(mb, axis=1, count=3).tolist() == [[0, 1, 1], [1, 0, 0]]
    assert np.unpackbits(ma, axis=1, count=3).tolist() == [[1, 0, 1], [1, 1, 0]]
    assert resolve_leaves(ma & mb, sk_a, ["A", "B"]).tolist() == [[4], [2]]
    with pytest.raises(PeerError, match=r"inconsistent: 2 row\(s\) of tree 0 reach \[2\] leaves"):
        resolve_leaves(ma, sk_a, ["A"])                                    # B's node left open
    i32 = lambda *v: np.array(v, dtype=np.int32)                          # noqa: E731
    no_rec = np.full(5, -1, dtype=np.int64)
    with pytest.raises(ProtocolError, match="exactly one parent"):             # nodes 3, 4: two parents
        Skeleton(i32(5), i32(1, 3, 3, -1, -1), i32(2, 4, 4, -1, -1), no_rec).validate()
    with pytest.raises(ProtocolError, match="exactly one parent"):             # nodes 3, 4: no parent
        Skeleton(i32(5), i32(1, -1, -1, -1, -1), i32(2, -1, -1, -1, -1), no_rec).validate()


# --- bad input --------------------------------------------------------------------
@pytest.fixture
def served(breast2):
    """A trained federation and a way to open prediction session 's' at passive1 (training rows)."""
    fed, test = trained(breast2, n_estimators=2, max_depth=3)
    p1 = fed.passives["passive1"]
    handler = frame_handler(p1.handle)

    def start():
        p1.handle(m.PredictStart(fed.model.model_id, "s",
                                   alignment.hash_ids(fed.active.ids, p1.salt)))

    return fed, p1, handler, start


def test_malformed_skeletons_are_refused(served):
    fed, p1, handler, start = served
    good = fed.model.skeleton("passive1")
    n = int(good.tree_sizes[0])
    first_internal = int(np.flatnonzero(good.left >= 0)[0])
    mine = int(np.flatnonzero(good.record_ids >= 0)[0])
    first_leaf = int(np.flatnonzero(good.left < 0)[0])

    def variant(**change):
        f = {k: v.copy() for k, v in good.to_fields().items()}
        for k, fn in change.items():
            fn(f[k])
        return f

    def set_at(i, v):
        def fn(a):
            a[i] = v
        return fn

    cases = [
        (variant(left=set_at(first_internal, first_internal)), "children are not later nodes"),
        (variant(right=set_at(first_internal, n + 5)), "children are not later nodes"),
        (variant(right=set_at(first_internal, int(good.left[first_internal]))), "children are not later"),
        (variant(record_ids=set_at(mine, len(p1.records))), "not in the lookup table"),
        (variant(record_ids=set_at(first_leaf, 0)), "record id at a leaf"),
        (variant(record_ids=set_at(mine, -3)), "negative record id|record_ids: value -3 is out of range"),
        ({**good.to_fields(), "left": good.left[:-1]}, "do not match|must have the same length"),
        ({**good.to_fields(), "tree_sizes": np.r_[good.tree_sizes, 0].astype(np.int32)},
         "at least one node|tree_sizes: value 0 is out of range"),
        ({**good.to_fields(), "left": good.left.astype(np.float64)}, "1-d integer array"),
    ]
    # a node with two parents: point a second internal node's child at the first's child
    internal = np.flatnonzero(good.left[:n] >= 0)
    if len(internal) > 1:
        cases.append((variant(left=set_at(int(internal[1]), int(good.left[internal[-1]]))),
                      "one parent|not later nodes"))
    import re
    for fields, pattern in cases:
        start()
        reply = loads(handler(dumps(m.LeafMaskRequest("s", **fields))))
        assert isinstance(reply, m.ErrorReply) and reply.kind == "protocol", pattern
        assert re.search(pattern, reply.message), (pattern, reply.message)
    start()
    ok = loads(handler(dumps(m.LeafMaskRequest("s", **good.to_fields()))))
    assert isinstance(ok, m.LeafMaskResponse)
    again = loads(handler(dumps(m.LeafMaskRequest("s", **good.to_fields()))))   # one round only
    assert isinstance(again, m.ErrorReply) and "unknown prediction session" in again.message


@pytest.mark.parametrize("cheat, pattern", [
    (lambda k: k[:, :-1], r"party 'passive1' sent leaf masks of shape"),
    (lambda k: k.astype(np.int16), r"party 'passive1' sent (leaf masks of shape|a malformed reply)"),
    (lambda k: np.zeros_like(k), r"party 'passive1' sent leaf masks that exclude every leaf"),
    (lambda k: np.full_like(k, 255), r"inconsistent"),
])
def test_dishonest_masks_are_refused(breast2, cheat, pattern):
    fed, test = trained(breast2, n_estimators=2, max_depth=3)
    honest = fed.passives["passive1"]

    def handle(req):
        reply = honest.handle(req)
        if isinstance(reply, m.LeafMaskResponse):
            return m.LeafMaskResponse(cheat(reply.masks))
        return reply

    fed.transport.handlers["passive1"] = frame_handler(handle)
    with pytest.raises(PeerError, match=pattern):
        fed.predict_raw(test, prediction="one-round")


def test_passive_policy_on_prediction(breast2):
    fed, test = trained(breast2, n_estimators=2, max_depth=3)
    p1 = fed.passives["passive1"]
    p1.allowed_prediction = ("node",)
    with pytest.raises(PeerError, match="does not allow prediction by 'one-round'"):
        fed.predict_raw(test)
    node = fed.predict_raw(test, prediction="node")
    p1.allowed_prediction = ("one-round",)
    with pytest.raises(PeerError, match="does not allow prediction by 'node'"):
        fed.predict_raw(test, prediction="node")
    assert np.array_equal(fed.predict_raw(test), node)


def test_cli_simulate_prediction_flag(tmp_path):
    import json

    from click.testing import CliRunner

    from cli import main
    outs = {}
    for pred in ("one-round", "node"):
        out = tmp_path / f"{pred}.csv"
        res = CliRunner().invoke(main, ["simulate", "--mode", "plain", "--rounds", "3", "--depth", "3", "--quiet",
                                        "--prediction", pred, "--predictions", str(out),
                                        "--output-json", str(tmp_path / f"{pred}.json")])
        assert res.exit_code == 0, res.output
        assert json.loads((tmp_path / f"{pred}.json").read_text())["prediction"] == pred
        outs[pred] = out.read_text()
    assert outs["one-round"] == outs["node"]


# --- the passive party's dispatcher -------------------------------------------------------------
#: registered messages that only ever travel to the active party (replies)
REPLIES = {m.Ack, m.ErrorReply, m.IdHashes, m.AlignAck, m.BinningInfo, m.HistogramResponse, m.CandidateResponse,
           m.SplitResponse, m.RouteResponse, m.PsiResponse, m.LeafMaskResponse, m.DPRelease, m.DPSplitRecords,
           m.DriftReply, m.ScreenBins, m.ScreenResponse, m.ScoreResponse, m.ScoreRefused,
           m.FeatureSplitDone}
#: requests a passive server answers itself (it owns the lookup-table files)
SERVER_ONLY = {m.TrainResume, m.ServeOpen, m.ScoreRequest}   # online scoring: the server's own


def test_dispatch_table_covers_every_request_of_the_protocol():
    """Every registered message type is a reply, a server-only request, or has a passive handler:
    a new request type without a handler (or a new reply not listed here) fails this test."""
    registered = set(serialization._REGISTRY.values())
    assert REPLIES | SERVER_ONLY <= registered
    assert set(passive.HANDLERS) == registered - REPLIES - SERVER_ONLY
    assert all(callable(h) for h in passive.HANDLERS.values())
    for t in registered:
        assert PassiveParty.accepts(t) == (t in passive.HANDLERS)


@pytest.mark.parametrize("request_", [m.Ack({"x": 1}), m.TrainResume("m", 1, 0),
                                      m.IdHashes(np.zeros((1, 16), np.uint8))])
def test_a_message_without_handler_is_refused(request_, tmp_path):
    party = PassiveParty("telco", small_frames(20)[1])
    name = type(request_).__name__
    with pytest.raises(ProtocolError, match=f"^party 'telco' does not accept {name}$"):
        party.handle(request_)
    reply = loads(frame_handler(party.handle)(dumps(request_)))
    assert isinstance(reply, m.ErrorReply) and reply.message == f"party 'telco' does not accept {name}"
    if name != "TrainResume":       # the server answers TrainResume itself
        server = PassiveServer("telco", small_frames(20)[1], "id", tmp_path)
        with pytest.raises(ProtocolError, match=f"^party 'telco' does not accept {name}$"):
            server.handle(request_)


def test_lookup_table_routes_by_the_one_split_rule():
    """Records route raw values by vfl.core.split.goes_left: value <= threshold, NaN to the record's side."""
    recs = [{"threshold": t, "default_left": d, "feature_idx": f} for t, d, f in
            ((0.5, True, 1), (float("inf"), False, 0), (-1.0, False, 1))]
    table = LookupTable(recs)
    x = np.array([[0.5, np.nan, -2.0], [np.nan, 3.0, np.nan], [0.7, np.inf, -1.0]])
    rec = np.array([[0, 1, 2]])
    want = np.array([[goes_left(x[i, j], recs[j]["threshold"], recs[j]["default_left"]) for j in range(3)]
                     for i in range(3)])
    assert np.array_equal(table.go_left(rec, x), want)
    assert want.tolist() == [[True, False, True], [True, True, False], [False, True, True]]
    assert table.features(np.array([2, 0])).tolist() == [1, 1]
    table.records.append({"threshold": 9.0, "default_left": True, "feature_idx": 0})    # the columns follow
    assert table.go_left(np.array([3]), np.array([np.nan])).tolist() == [True]


def test_passive_model_file_is_written_privately(tmp_path):
    a, b, _ = small_frames(60)
    fed = Federation(ActiveParty("a", a), [PassiveParty("b", b)])
    fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=2))
    p = fed.passives["b"]
    p.save_model(tmp_path / "b.json")
    assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o600
    again = PassiveParty.load_model(tmp_path / "b.json")
    assert again.model_dict() == p.model_dict() and again.records == p.records
