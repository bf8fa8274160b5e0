"""PSI alignment (--align psi): ECDH over X25519.

What is proved here: the blinding commutes; PSI and hash alignment give the same
rows in the same order (hence the same model); it works across three parties;
the messages carry no hash, no curve point and no raw form of any id, and the
blinded values of ids outside the intersection cannot be matched without the
other party's secret scalar (while they can with it: the check can fail); bad
input and malformed messages get clear errors.
"""
import json
import re
import sys

import mmh3
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from support import KEY_BITS

from parties.active import ActiveParty
from parties.passive import PassiveParty
from protocols import alignment, psi
from protocols import messages as m
from protocols.serialization import dumps, loads
from protocols.transport import InMemoryTransport, frame_handler
from vfl.api import Federation, federation_from_frames
from vfl.core.errors import InputError, PeerError, ProtocolError
from vfl.core.params import TrainParams


def frames_with_ids(active_ids, passive_ids: dict, seed=0):
    """Active frame (label + 2 features) and passive frames (2 features) over the given ids."""
    rng = np.random.default_rng(seed)
    a = pd.DataFrame({"id": active_ids, "y": rng.integers(0, 2, len(active_ids)),
                      "a0": rng.normal(size=len(active_ids)), "a1": rng.normal(size=len(active_ids))})
    ps = {name: pd.DataFrame({"id": ids, f"{name}0": rng.normal(size=len(ids)),
                              f"{name}1": rng.normal(size=len(ids))})
          for name, ids in passive_ids.items()}
    return a, ps


def wire(active_frame, passive_frames: dict, record=False):
    active = ActiveParty("bank", active_frame)
    passives = [PassiveParty(n, f) for n, f in passive_frames.items()]
    transport = InMemoryTransport("bank", {p.name: frame_handler(p.handle) for p in passives}, record=record)
    return active, {p.name: p for p in passives}, transport


def three_party_ids(kind=str):
    rng = np.random.default_rng(1)
    mk = (lambda i: f"cust-{i:05d}") if kind is str else (lambda i: i)
    a = [mk(i) for i in rng.permutation(100)]                                     # 0..99
    p1 = [mk(i) for i in rng.permutation(np.arange(20, 120))]                     # 20..119
    p2 = [mk(i) for i in rng.permutation(np.r_[0:60, 80:100, 200:230])]          # 0..59, 80..99, 200..229
    common = {mk(i) for i in np.r_[20:60, 80:100]}
    return a, {"telco": p1, "shop": p2}, common


# --- the math -----------------------------------------------------------------
def test_blinding_commutes_and_points_are_salted():
    salt = b"s" * 16
    pts = psi.hash_to_points(["a", "b", "3"], salt)
    assert pts.shape == (3, 32) and pts.dtype == np.uint8
    # ids normalized as in hash alignment: 3, 3.0 and "3" are the same id
    assert np.array_equal(psi.hash_to_points(np.array([3.0]), salt)[0], pts[2])
    assert np.array_equal(psi.hash_to_points(np.array([3]), salt)[0], pts[2])
    assert not np.array_equal(pts[0], pts[1])
    assert not np.array_equal(pts[0], psi.hash_to_points(["a"], b"t" * 16)[0])
    for row in pts:                                            # on Curve25519, not its twist
        assert psi._on_curve(int.from_bytes(bytes(row), "little"))
    a, b = psi.BlindingKey(), psi.BlindingKey()
    ab, ba = b.blind(a.blind(pts)), a.blind(b.blind(pts))
    assert np.array_equal(ab, ba)
    assert not np.array_equal(a.blind(pts), b.blind(pts))
    assert not np.array_equal(ab, a.blind(pts))


def test_low_order_point_and_bad_shapes_are_refused():
    key = psi.BlindingKey()
    with pytest.raises(ProtocolError, match="small order"):
        key.blind(np.zeros((1, 32), dtype=np.uint8), "peer values")
    with pytest.raises(ProtocolError, match=r"\(n, 32\) uint8"):
        key.blind(np.zeros((2, 16), dtype=np.uint8), "peer values")
    with pytest.raises(ProtocolError, match="at least 16 bytes"):
        psi.hash_to_points(["a"], b"short")
    with pytest.raises(ProtocolError, match="repeat"):
        psi.check_positions(np.array([1, 1]), 3)
    with pytest.raises(ProtocolError, match="out of range"):
        psi.check_positions(np.array([3]), 3)


# --- PSI and hash alignment agree ------------------------------------------------
@pytest.mark.parametrize("kind", [str, int])
def test_psi_and_hash_give_same_rows_in_same_order(kind):
    a_ids, p_ids, common = three_party_ids(kind)
    af, pfs = frames_with_ids(a_ids, p_ids)
    salt = alignment.new_salt()
    got = {}
    for method in ("hash", "psi"):
        active, passives, tr = wire(af, pfs)
        align = active.align if method == "hash" else active.align_psi
        rows = align(tr, list(passives), salt, "s1")
        got[method] = (rows, {n: p._state.train.rows for n, p in passives.items()}, active.alignment_report)
        # the rows are the intersection, the same sample at the same position for every party
        kept = af["id"].to_numpy()[rows]
        assert set(kept.tolist()) == common and len(kept) == len(common)
        for n, p in passives.items():
            assert np.array_equal(pfs[n]["id"].to_numpy()[p._state.train.rows], kept)
    assert np.array_equal(got["hash"][0], got["psi"][0])
    for n in pfs:
        assert np.array_equal(got["hash"][1][n], got["psi"][1][n])
    assert got["hash"][2] == got["psi"][2] == {
        "bank": {"n_rows": 100, "n_kept": 60}, "telco": {"n_rows": 100, "n_kept": 60},
        "shop": {"n_rows": 110, "n_kept": 60}}


@pytest.mark.slow
def test_psi_and_hash_train_identical_models(monkeypatch, breast3):
    salt = alignment.new_salt()
    monkeypatch.setattr(alignment, "new_salt", lambda: salt)
    # the active party lacks some ids, each passive party holds its rows in its own order, passive2 lacks some
    g, h1, h2 = (pf.frame for pf in breast3)
    g = g.iloc[:540]
    h1 = h1.sample(frac=1.0, random_state=1)
    h2 = h2.sample(frac=1.0, random_state=2).iloc[10:]
    frames = [type(pf)(pf.name, f, pf.id_col, pf.label_col) for pf, f in zip(breast3, (g, h1, h2))]
    common = set(g["id"]) & set(h2["id"])
    new = {"active": g[g["id"].isin(common)], "passive1": h1, "passive2": h2}
    models, preds = {}, {}
    for method in ("hash", "psi"):
        fed = federation_from_frames(frames)
        fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=2, max_depth=3, align=method))
        assert fed.model.params["align"] == method
        models[method] = [[t.structure() for t in rnd] for rnd in fed.model.rounds]
        preds[method] = fed.predict_raw(new, prediction="node")
        assert fed.active.alignment_report["active"]["n_kept"] == len(common)
    assert models["hash"] == models["psi"]
    assert np.array_equal(preds["hash"], preds["psi"])


def test_three_party_psi_each_passive_learns_only_the_intersection():
    a_ids, p_ids, common = three_party_ids()
    af, pfs = frames_with_ids(a_ids, p_ids)
    active, passives, tr = wire(af, pfs, record=True)
    rows = active.align_psi(tr, list(passives), alignment.new_salt(), "s1")
    assert len(rows) == len(common) == 60
    # what each passive party receives: one PsiRequest, then only the positions of the 60 rows
    for name, p in passives.items():
        received = [loads(f) for s, r, f in tr.log if r == name]
        assert [type(x).__name__ for x in received] == ["PsiRequest", "PsiResult"]
        assert received[0].blinded.shape == (100, 32)          # |S_active| is revealed
        assert len(received[1].positions) == 60                 # |intersection| is revealed
        assert set(pfs[name]["id"].to_numpy()[p._state.train.rows].tolist()) == common
    # "telco" holds 80 ids of the active party, but learns only the 60 of the full intersection
    assert passives["telco"].n_aligned == 60


# --- privacy: nothing about ids outside the intersection ---------------------
@pytest.fixture
def captured_keys(monkeypatch):
    keys = []

    class Recording(psi.BlindingKey):
        def __init__(self):
            super().__init__()
            keys.append(self)

    monkeypatch.setattr(psi, "BlindingKey", Recording)
    return keys


def _hash_keys(ids, salt):
    return [mmh3.hash_bytes(salt + str(i).encode()) for i in ids]


def test_psi_messages_reveal_no_id_outside_the_intersection(captured_keys):
    a_ids, p_ids, common = three_party_ids()
    af, pfs = frames_with_ids(a_ids, p_ids)
    active, passives, tr = wire(af, pfs, record=True)
    fed_params = TrainParams(mode="plain", n_estimators=1, max_depth=2, align="psi")
    active.fit(tr, list(passives), fed_params)
    salt = bytes.fromhex(active.model.salt)
    frames = [f for _, _, f in tr.log]
    wire_bytes = b"".join(frames)
    all_ids = set(a_ids) | set(p_ids["telco"]) | set(p_ids["shop"])
    outside = sorted(all_ids - common)
    # no raw id, no salted mmh3 hash, no curve point of any id is ever sent
    assert b"cust-" not in wire_bytes
    for h in _hash_keys(sorted(all_ids), salt):
        assert h not in wire_bytes
    points = psi.hash_to_points(sorted(all_ids), salt)
    for row in psi.point_keys(points):
        assert row not in wire_bytes

    key_active, key_telco, key_shop = captured_keys
    msgs = [(s, r, loads(f)) for s, r, f in tr.log]
    to_telco = [x for s, r, x in msgs if r == "telco" and isinstance(x, m.PsiRequest)][0]
    from_telco = [x for s, r, x in msgs if s == "telco" and isinstance(x, m.PsiResponse)][0]
    received_by_telco = set(psi.point_keys(to_telco.blinded))
    received_by_bank = set(psi.point_keys(from_telco.blinded)) | set(psi.point_keys(from_telco.double_blinded))

    # telco guesses the active party's ids it does not hold (the strongest guess: the true ones)
    guesses = [i for i in a_ids if i not in set(p_ids["telco"])]
    g = psi.hash_to_points(guesses, salt)
    telco_can_compute = set(psi.point_keys(g)) | set(psi.point_keys(key_telco.blind(g)))
    assert not telco_can_compute & received_by_telco
    # ... it would match them with the active party's secret scalar (the check can fail)
    assert set(psi.point_keys(key_active.blind(g))) <= received_by_telco

    # the active party guesses telco's ids it does not hold
    guesses = [i for i in p_ids["telco"] if i not in set(a_ids)]
    g = psi.hash_to_points(guesses, salt)
    bank_can_compute = set(psi.point_keys(g)) | set(psi.point_keys(key_active.blind(g)))
    assert not bank_can_compute & received_by_bank
    assert set(psi.point_keys(key_telco.blind(g))) <= received_by_bank

    # telco never gets the double-blinded values of its own ids, so it cannot tell which of
    # them the active party holds (80) beyond the full intersection it is told about (60)
    to_telco_bytes = b"".join(f for s, r, f in tr.log if r == "telco")
    own_double = key_active.blind(key_telco.blind(psi.hash_to_points(p_ids["telco"], salt)))
    assert not any(v in to_telco_bytes for v in psi.point_keys(own_double))
    assert len(outside) > 50


def test_hash_alignment_does_reveal_testable_hashes():
    """The contrast (and a check that the detector above works): hash alignment sends them."""
    a_ids, p_ids, common = three_party_ids()
    af, pfs = frames_with_ids(a_ids, p_ids)
    active, passives, tr = wire(af, pfs, record=True)
    salt = alignment.new_salt()
    active.align(tr, list(passives), salt, "s1")
    wire_bytes = b"".join(f for _, _, f in tr.log)
    outside = sorted(set(p_ids["telco"]) - set(a_ids))
    assert all(h in wire_bytes for h in _hash_keys(outside, salt))


# --- prediction under PSI --------------------------------------------------------
def test_psi_model_predicts_with_a_fresh_psi_per_batch(breast2):
    fed = federation_from_frames(breast2, record=True)
    fed.fit(TrainParams(mode="plain", n_estimators=3, max_depth=3, align="psi"))
    new = {pf.name: pf.frame.iloc[::7] for pf in breast2}
    n_log = len(fed.transport.log)
    p_psi = fed.predict_proba(new)                       # default: as trained (psi), one-round
    sent = [type(loads(f)).__name__ for s, r, f in fed.transport.log[n_log:] if s == "active"]
    assert sent == ["PsiRequest", "PsiResult", "LeafMaskRequest"]
    first_salt = loads(fed.transport.log[n_log][2]).salt
    assert first_salt != bytes.fromhex(fed.model.salt)  # fresh salt, unlinkable to training
    p_hash = fed.predict_proba(new, align="hash", prediction="node")
    assert np.array_equal(p_psi, p_hash)
    # a row the passive party lacks: a clear error naming it
    short = dict(new)
    short["passive1"] = new["passive1"].iloc[1:]
    with pytest.raises(InputError, match=r"party 'passive1' has no row for 1 of the"):
        fed.predict_proba(short)


def test_passive_policy_psi_only(breast2):
    fed = federation_from_frames(breast2)
    fed.passives["passive1"].allowed_align = ("psi",)
    with pytest.raises(PeerError, match="does not allow alignment by 'hash'"):
        fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=2))
    fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=2, align="psi"))
    with pytest.raises(PeerError, match="does not allow alignment by 'hash'"):
        fed.predict_proba(align="hash")
    assert fed.predict_proba().shape == (569,)


# --- bad input and malformed messages ------------------------------------------
def test_bad_input_duplicates_empty_and_params():
    # duplicate ids are refused when a party is built (frame validation); PSI checks again
    # itself on both sides (a party object built another way)
    af, pfs = frames_with_ids(["a", "b", "c"], {"telco": ["b", "c", "d"]})
    with pytest.raises(InputError, match="party 'telco'.*duplicated ids"):
        PassiveParty("telco", pd.DataFrame({"id": ["b", "c", "c"], "t": [1.0, 2.0, 3.0]}))
    active, passives, tr = wire(af, pfs)
    passives["telco"]._state.ids = np.array(["b", "b", "d"], dtype=object)
    with pytest.raises(InputError, match="party 'telco' has 1 duplicate ids"):
        active.align_psi(tr, ["telco"], alignment.new_salt(), "s")
    active, passives, tr = wire(af, pfs)
    active.ids = np.array([7.0, 7.0, 8.0])
    with pytest.raises(InputError, match="party 'bank' has 1 duplicate ids"):
        active.align_psi(tr, ["telco"], alignment.new_salt(), "s")
    af, pfs = frames_with_ids(["a", "b"], {"telco": ["c", "d", "e"]})
    active, passives, tr = wire(af, pfs)
    with pytest.raises(InputError, match=r"no sample id in common.*'telco': 3"):
        active.align_psi(tr, ["telco"], alignment.new_salt(), "s")
    with pytest.raises(InputError, match="parameter align"):
        TrainParams(align="bloom")
    af, pfs = frames_with_ids(list(range(40)), {"telco": list(range(40))})
    fed = Federation(ActiveParty("bank", af), [PassiveParty("telco", pfs["telco"])])
    fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=2))
    with pytest.raises(InputError, match="align must be one of"):
        fed.predict_proba(align="bloom")
    with pytest.raises(InputError, match="prediction must be one of"):
        fed.predict_proba(prediction="bulk")


def test_missing_cryptography_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.asymmetric.x25519", None)
    af, pfs = frames_with_ids(list(range(30)), {"telco": list(range(30))})
    active, passives, tr = wire(af, pfs)
    with pytest.raises(InputError, match=r"needs the 'cryptography' package.*vfl-boost\[net\]"):
        active.fit(tr, ["telco"], TrainParams(mode="plain", n_estimators=1, align="psi"))


def test_malformed_psi_messages_are_refused():
    af, pfs = frames_with_ids(list(range(30)), {"telco": list(range(30))})
    p = PassiveParty("telco", pfs["telco"])
    handler = frame_handler(p.handle)

    def ask(message):
        return loads(handler(dumps(message)))

    good = psi.BlindingKey().blind(psi.hash_to_points(list(range(5)), b"s" * 16))
    bad_cases = [
        (m.PsiRequest("s", b"s" * 16, "train", "", np.zeros((3, 16), np.uint8)), r"\(n, 32\) uint8"),
        (m.PsiRequest("s", b"s" * 16, "train", "", np.zeros((3, 32), np.int16)), r"\(n, 32\) uint8"),
        (m.PsiRequest("s", b"s" * 16, "train", "", np.zeros((1, 32), np.uint8)), "small order"),
        (m.PsiRequest("s", b"short", "train", "", good), "at least 16 bytes"),
        (m.PsiRequest("s", b"s" * 16, "peek", "", good), r"PsiRequest\.purpose: 'peek' is not one of"),
        (m.PsiRequest("s", b"s" * 16, "predict", "nope", good), "holds no model"),
        (m.PsiResult("unknown", np.array([0])), "unknown PSI session"),
    ]
    for message, pattern in bad_cases:
        reply = ask(message)
        assert isinstance(reply, m.ErrorReply) and reply.kind == "protocol", message
        assert re.search(pattern, reply.message), reply.message
    reply = ask(m.PsiRequest("s1", b"s" * 16, "train", "", good))
    assert isinstance(reply, m.PsiResponse) and reply.double_blinded.shape == (5, 32)
    assert reply.blinded.shape == (30, 32)
    for positions, pattern in ((np.array([0, 0]), "repeat"), (np.array([30]), "out of range"),
                               (np.array([[0]]), "1-d integer")):
        p.handle(m.PsiRequest("s2", b"s" * 16, "train", "", good))
        reply = ask(m.PsiResult("s2", positions))
        assert isinstance(reply, m.ErrorReply) and pattern in reply.message
    # the passive party keeps serving after all of that
    p.handle(m.PsiRequest("s3", b"s" * 16, "train", "", good))
    assert ask(m.PsiResult("s3", np.array([4, 2]))) == m.AlignAck(30, 2)


def test_a_misbehaving_passive_is_named():
    af, pfs = frames_with_ids(list(range(30)), {"telco": list(range(30))})
    active = ActiveParty("bank", af)
    honest = PassiveParty("telco", pfs["telco"])

    def short_reply(req):
        r = honest.handle(req)
        if isinstance(r, m.PsiResponse):
            return m.PsiResponse(r.double_blinded[:-1], r.blinded)
        return r

    def repeated(req):
        r = honest.handle(req)
        if isinstance(r, m.PsiResponse):
            return m.PsiResponse(r.double_blinded, np.concatenate([r.blinded, r.blinded[:1]]))
        return r

    for handle, pattern in ((short_reply, "returned 29 double-blinded ids for 30"),
                            (repeated, "blinded ids of party .telco. contains 1 repeated")):
        tr = InMemoryTransport("bank", {"telco": frame_handler(handle)})
        with pytest.raises((PeerError, ProtocolError), match=pattern):
            active.align_psi(tr, ["telco"], alignment.new_salt(), "s")


@pytest.mark.slow
def test_cli_simulate_align_psi(tmp_path):
    from cli import main
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["simulate", "--mode", "plain", "--rounds", "2", "--depth", "2", "--parties", "3",
                                    "--align", "psi", "--prediction", "node", "--quiet",
                                    "--output-json", str(out)])
    assert res.exit_code == 0, res.output
    assert "alignment: psi; prediction: node" in res.output
    d = json.loads(out.read_text())
    assert d["align"] == "psi" and d["prediction"] == "node" and d["params"]["align"] == "psi"
    assert d["test_auc"] > 0.9
    res = CliRunner().invoke(main, ["simulate", "--align", "bloom"])
    assert res.exit_code != 0 and "bloom" in res.output
