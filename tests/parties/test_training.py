"""End-to-end SecureBoost: accuracy, persistence, privacy (he == plain: tests/test_he_equals_plain.py)."""
import json
import struct

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score
from support import KEY_BITS, small_frames, streamed_gradients

from crypto.packing import PackingLayout, pack
from datasets import join_parties, train_test_split_parties
from protocols import messages as m
from protocols.serialization import BigInts, loads
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams, federation_from_frames
from vfl.core.errors import InputError
from vfl.core.fixedpoint import encode_fixed
from vfl.core.objectives import get_objective


def _fit(frames, mode, **kw):
    train, test = train_test_split_parties(frames, test_size=0.2, seed=0)
    fed = federation_from_frames(train)
    params = TrainParams(mode=mode, key_bits=KEY_BITS, **kw)
    model = fed.fit(params)
    proba = fed.predict_proba({pf.name: pf.frame for pf in test})
    y_test = test[0].frame[test[0].label_col].to_numpy()
    return fed, model, proba, y_test


def _structures(model):
    return [t.structure() for rnd in model.rounds for t in rnd]


def test_breast_cancer_trees_use_passive_splits_and_predict_well(breast2):
    """Accuracy of the 4x4 model (he grows the same trees: tests/test_he_equals_plain.py)."""
    _, model, proba, y = _fit(breast2, "plain", n_estimators=4, max_depth=4)
    owners = {n.owner for rnd in model.rounds for t in rnd for n in t.nodes if not n.is_leaf}
    assert owners == {"active", "passive1"}
    assert roc_auc_score(y, proba) > 0.97


def test_auc_matches_xgboost_hist_on_breast_cancer(breast2):
    xgb = pytest.importorskip("xgboost")
    params = dict(n_estimators=10, max_depth=4, learning_rate=0.3, max_bin=32, reg_lambda=1.0,
                  min_child_weight=1.0)
    _, _, proba, y_test = _fit(breast2, "plain", **params)
    train, test = train_test_split_parties(breast2, test_size=0.2, seed=0)

    Xtr, ytr, _ = join_parties(train)
    Xte, yte, _ = join_parties(test)
    clf = xgb.XGBClassifier(tree_method="hist", **params)
    clf.fit(Xtr, ytr.astype(int))
    auc_xgb = roc_auc_score(yte.astype(int), clf.predict_proba(Xte)[:, 1])
    auc_ours = roc_auc_score(y_test, proba)
    assert abs(auc_ours - auc_xgb) <= 0.01, (auc_ours, auc_xgb)


def test_plaintext_training_equals_a_centralised_run_of_the_same_algorithm():
    """The federated model equals the same algorithm run by one party holding every column."""
    a, b, c = small_frames()
    fed = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)])
    fed.fit(TrainParams(mode="plain", n_estimators=3, max_depth=3))
    central = a.merge(b, on="id").merge(c, on="id")
    solo = Federation(ActiveParty("a", central), [])
    solo.fit(TrainParams(mode="plain", n_estimators=3, max_depth=3))
    assert np.allclose(fed.predict_proba(), solo.predict_proba(), rtol=0, atol=1e-12)
    # and the same splits: feature names and thresholds line up node by node
    fed_nodes = [(n.is_leaf, n.n_samples, n.gain, n.value) for r in fed.model.rounds for t in r for n in t.nodes]
    solo_nodes = [(n.is_leaf, n.n_samples, n.gain, n.value) for r in solo.model.rounds for t in r for n in t.nodes]
    assert fed_nodes == solo_nodes


def test_saved_models_round_trip_and_active_file_has_no_passive_threshold(breast2, tmp_path):
    fed, model, proba, _ = _fit(breast2, "plain", n_estimators=5, max_depth=4)
    paths = fed.save(tmp_path)
    assert sorted(p.name for p in paths) == ["active.json", "passive1.json"]
    active_text = (tmp_path / "active.json").read_text()
    active = json.loads(active_text)
    passive = json.loads((tmp_path / "passive1.json").read_text())
    assert passive["records"], "the passive party owns some splits"
    for rnd in active["rounds"]:
        for tree in rnd:
            for node in tree["nodes"]:
                if node["owner"] == "passive1":
                    assert node["threshold"] is None and node["feature"] is None
    def numbers(obj):
        if isinstance(obj, dict):
            return [x for v in obj.values() for x in numbers(v)]
        if isinstance(obj, list):
            return [x for v in obj for x in numbers(v)]
        return [float(obj)] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []

    in_active = set(numbers(active))
    assert not {float(rec["threshold"]) for rec in passive["records"]} & in_active
    loaded = Federation.load(tmp_path)
    _, test = train_test_split_parties(breast2, test_size=0.2, seed=0)
    again = loaded.predict_proba({pf.name: pf.frame for pf in test})
    assert np.array_equal(again, proba)


def _received(log, party):
    return [(sender, loads(frame), frame) for sender, receiver, frame in log if receiver == party]


def _first_round_patterns(y, msg: m.GradientsStart):
    """What the first round's gradients of binary labels ``y`` look like in clear, in the layout of
    ``msg`` (the header of round 0's gradient stream): the packed plaintexts (and their compression shifts) and
    the fixed-point g and h as 8-byte integers. Binary logloss from the base score has one (g, h)
    pair per label value, so the set is small."""
    layout = PackingLayout.from_dict(msg.layout)
    loss = get_objective("binary")
    raw = np.tile(loss.base_score(y), (len(y), 1))
    g, h = loss.gradients(y, raw)
    g_int = encode_fixed(g, layout.precision_bits)
    h_int = encode_fixed(h, layout.precision_bits)
    pairs = sorted({(int(a), int(b)) for a, b in zip(g_int[:, 0], h_int[:, 0])})
    assert len(pairs) == 2
    packed = pack(np.array([[a] for a, _ in pairs]), np.array([[b] for _, b in pairs]), layout)
    values = {v << (s * layout.value_bits) for v in packed for s in range(msg.shifts)}
    patterns = set()
    for v in values:    # the significant bytes: a suffix of any fixed-width big-endian encoding
        patterns.add(v.to_bytes(max(1, (v.bit_length() + 7) // 8), "big") if v >= 0
                     else v.to_bytes(v.bit_length() // 8 + 1, "big", signed=True))
    for a, b in pairs:
        patterns |= {struct.pack(fmt, x) for fmt in (">q", "<q") for x in (a, b)}
    return values, patterns


def _clear_first_round_gradients(got, y) -> list:
    """Each first-round gradient that a party's received messages ``got`` carry in clear."""
    first = [(start, vals) for start, vals in streamed_gradients(msg for _, msg, _ in got) if start.round_idx == 0]
    assert first
    values, patterns = _first_round_patterns(y, first[0][0])
    frames = b"".join(f for _, _, f in got)
    found = [f"value {v}" for _, vals in first for v in set(vals) & values]
    return found + [f"bytes {p.hex()}" for p in patterns if p in frames]


def test_clear_gradient_check_sees_plain_mode():
    """In ``plain`` mode the gradients travel in clear: the check of test_what_each_party_receives
    finds them (so it can fail), both as values and as bytes."""
    a, b, _ = small_frames(n=80)
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)], record=True)
    fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=2))
    found = _clear_first_round_gradients(_received(fed.transport.log, "telco"), a["y"].to_numpy())
    assert any(f.startswith("value") for f in found) and any(f.startswith("bytes") for f in found)


def _ciphertext(x, n, scheme) -> bool:
    """A Paillier ciphertext lies above n (mod n^2, all but never below); an OU one in (1, n), of
    about n's size (never a small fixed-point plaintext)."""
    if scheme == "ou":
        return 1 < x < n and x.bit_length() > n.bit_length() - 64
    return n < x < n * n


@pytest.mark.parametrize("scheme", ["paillier", "ou"])
def test_what_each_party_receives(scheme):
    a, b, c = small_frames(n=80)
    active = ActiveParty("bank", a)
    passives = [PassiveParty("telco", b), PassiveParty("shop", c)]
    fed = Federation(active, passives, record=True)
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=2, max_depth=3, scheme=scheme))
    fed.predict_proba({"bank": a, "telco": b, "shop": c})
    log = fed.transport.log
    y = a["y"].to_numpy()

    allowed_to_passive = {"AlignRequest", "AlignResult", "TrainSetup", "PublicKey", "GradientsStart", "GradientShard",
                          "HistogramRequest", "CandidatePick", "TrainEnd", "PredictStart", "RouteRequest",
                          "LeafMaskRequest", "PredictEnd"}      # splits by opaque position (issue 31), never by bin
    label_patterns = [y.astype(dt).tobytes() for dt in (np.uint8, np.int32, np.int64, np.float64)]
    for p in passives:
        got = _received(log, p.name)
        assert {type(msg).__name__ for _, msg, _ in got} <= allowed_to_passive
        grads = streamed_gradients(msg for _, msg, _ in got)
        assert grads and all(g.encrypted for g, _ in grads)
        n = int(fed.active.channel.public_key.n)
        for _, values in grads:   # ciphertexts: big numbers, never small fixed-point plaintexts
            assert all(_ciphertext(int(v), n, scheme) for v in values)
        for _, msg, frame in got:
            for pat in label_patterns:
                assert pat not in frame
            for v in vars(msg).values():
                if isinstance(v, np.ndarray):
                    assert v.dtype.kind != "f", f"{type(msg).__name__} carries floats to a passive party"
        # the first round's gradients never appear in clear: neither as packed plaintexts nor as
        # fixed-point integers (test_clear_gradient_check_sees_plain_mode shows this check can fail)
        assert _clear_first_round_gradients(got, y) == []

    got = _received(log, "bank")
    allowed_to_active = {"IdHashes", "AlignAck", "BinningInfo", "Ack", "CandidateResponse",
                         "SplitResponse", "RouteResponse", "LeafMaskResponse"}     # no per-bin sums (issue 31)
    assert {type(msg).__name__ for _, msg, _ in got} <= allowed_to_active
    frames_to_active = b"".join(f for _, _, f in got)
    for p, frame in zip(passives, (b, c)):
        raw = frame.drop(columns="id").to_numpy(dtype=np.float64)
        for v in np.unique(raw):
            assert struct.pack("<d", v) not in frames_to_active
            assert struct.pack(">d", v) not in frames_to_active
        for rec in p.records:
            t = rec["threshold"]
            assert struct.pack("<d", t) not in frames_to_active
            assert repr(t).encode() not in frames_to_active
        assert p.records
    for _, msg, _ in got:
        for v in vars(msg).values():
            if isinstance(v, np.ndarray):
                assert v.dtype.kind != "f", f"{type(msg).__name__} carries floats to the active party"
            if isinstance(v, BigInts) and isinstance(msg, m.CandidateResponse):
                assert all(_ciphertext(int(x), n, scheme) or int(x) == 1 for x in v)   # (1: empty bins)


def test_predicting_training_rows_after_new_data_uses_training_rows_again():
    a, b, c = small_frames(n=60)
    fed = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)])
    fed.fit(mode="plain", n_estimators=2, max_depth=2)
    before = fed.predict_proba()
    fed.predict_proba({"a": a.iloc[:10], "b": b.iloc[:10], "c": c.iloc[:10]})
    assert np.array_equal(fed.predict_proba(), before)


def test_loading_a_directory_with_an_unreadable_json_names_the_file(tmp_path):
    a, b, _ = small_frames(40)
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    fed.fit(mode="plain", n_estimators=1, max_depth=1)
    fed.save(tmp_path)
    (tmp_path / "zz.json").write_bytes(b"\xff\xfe\x00garbage")
    assert Federation.load(tmp_path).model.model_id == fed.model.model_id   # the manifest lists what to read
    (tmp_path / "manifest.json").unlink()       # a directory saved before manifests: every *.json is read
    with pytest.raises(InputError, match="cannot read model file .*zz.json"):
        Federation.load(tmp_path)
    (tmp_path / "zz.json").unlink()
    (tmp_path / "telco.json").write_bytes(b"\xff\xfe\x00garbage")
    fed.save(tmp_path / "again")
    (tmp_path / "again" / "telco.json").write_bytes(b"")
    with pytest.raises(InputError, match=r"telco\.json is not the file .*manifest\.json lists"):
        Federation.load(tmp_path / "again")
