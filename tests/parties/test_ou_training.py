"""Okamoto-Uchiyama through training: he(OU) grows the trees of plain with categorical features,
weights, monotone constraints and multiclass target groups; resume; the key message on the wire;
a key of the wrong scheme refused by the passive party."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import KEY_BITS, small_frames

from crypto import ou, schemes
from crypto.keys import WeakKeyWarning, generate_keypair
from datasets.errors import InputError, ProtocolError
from parties.active import ActiveParty as NetActiveParty
from parties.checkpoint import Checkpoint
from parties.passive import PassiveParty as RawPassive
from parties.server import PassiveServer
from protocols import messages as m
from protocols.serialization import dumps, loads
from protocols.transport import InMemoryTransport
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams


@pytest.fixture(scope="module")
def oukey():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakKeyWarning)
        return ou.generate_keypair(KEY_BITS)


def _sent(fed, cls):
    """The messages of type ``cls`` the passive party received (the recorded frames, decoded)."""
    return [msg for msg in (loads(f) for _, receiver, f in fed.transport.log if receiver == "telco")
            if isinstance(msg, cls)]


def _structures(model):
    return [t.structure() for rnd in model.rounds for t in rnd]


def _frames(n=160, seed=7):
    a, b, _ = small_frames(n=n, seed=seed)
    rng = np.random.default_rng(seed)
    b["colour"] = rng.choice(["red", "green", "blue", "grey"], size=n)      # a categorical passive feature
    a["y"] = ((a["a0"] + b["b0"] + (b["colour"] == "red") * 1.0) > 0.3).astype(int)
    return a, b


def _fed(a, b, record=False):
    return Federation(ActiveParty("bank", a),
                      [PassiveParty("telco", b, categorical=["colour"], monotone={"b0": +1})], record=record)


def test_ou_with_categorical_weights_and_monotone_sends_ou_keys_and_splits_at_the_passive():
    """(OU == plain here: tests/test_he_equals_plain.py, passive-categorical-weights-monotone-ou-*)"""
    a, b = _frames()
    w = np.random.default_rng(3).uniform(0.5, 3.0, size=len(a))
    fed = _fed(a, b, record=True)
    fed.fit(TrainParams(mode="he", scheme="ou", key_bits=KEY_BITS, n_estimators=3, max_depth=3,
                        monotone_constraints={"a0": 1}), sample_weight=w)
    keys = _sent(fed, m.PublicKey)
    assert keys and all(k.scheme == "ou" and k.g and k.h for k in keys)
    assert fed.active.channel.plain_bits == KEY_BITS // 3
    owners = {n[5] for t in _structures(fed.model) for n in t if not n[1]}
    assert "telco" in owners                          # passive splits happen (on b0 or the categories)


def test_ou_multiclass_travels_in_more_target_groups():
    """Ten classes of 108-bit slots do not fit one 341-bit OU plaintext: the targets travel in groups
    (more of them than with Paillier; here with uniform, not short, randomness:
    ``encryption="standard"``). OU == plain here: tests/test_he_equals_plain.py,
    multiclass10-target-groups-standard-randomness-ou-inline."""
    rng = np.random.default_rng(4)
    a, b, _ = small_frames(n=50, seed=4)
    y = rng.integers(0, 10, size=50)
    y[:10] = np.arange(10)
    a["y"] = y
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)], record=True)
    fed.fit(TrainParams(mode="he", scheme="ou", key_bits=KEY_BITS, precision_bits=48, objective="multiclass",
                        n_estimators=1, max_depth=2, min_child_weight=0.01, encryption="standard"))
    starts = _sent(fed, m.GradientsStart)
    assert starts[0].groups >= 4 and starts[0].layout["n_targets"] <= 3


def _server_fit(active, b, tmp, params, **kw):
    server = PassiveServer("telco", b, "id", tmp / "telco")
    t = InMemoryTransport(active.name, {"telco": server.handle_frame})
    return active.fit(t, ["telco"], params, **kw)


class _Dies(Exception):
    pass


@pytest.mark.parametrize("first", ["ou", "paillier"])
def test_resume_with_ou(tmp_path, first):
    """A training stopped after two rounds resumes with a fresh OU key (a Paillier checkpoint may
    resume as OU: the checkpoint holds no key) and ends with the model of the uninterrupted run."""
    a, b = _frames(n=120)
    params = TrainParams(mode="he", scheme="ou", key_bits=KEY_BITS, n_estimators=4, max_depth=2)
    full = _server_fit(NetActiveParty("bank", a), b, tmp_path / "full", params)
    saved = []

    def die(r, info):
        if r == 1:
            raise _Dies()

    first_params = TrainParams(**{**params.to_dict(), "scheme": first})
    with pytest.raises(_Dies):
        _server_fit(NetActiveParty("bank", a), b, tmp_path, first_params, on_round=die, checkpoint=saved.append)
    saved[-1].save(tmp_path / "ck.json")
    ck = Checkpoint.load(tmp_path / "ck.json")
    assert ck.n_rounds == 2 and ck.params["scheme"] == first
    resumed = _server_fit(NetActiveParty("bank", a), b, tmp_path, params, resume=ck)
    assert _structures(resumed) == _structures(full)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["paillier", "ou"]), st.data())
def test_key_message_round_trips_and_garbage_is_refused(oukey, scheme, data):
    pub = oukey[0] if scheme == "ou" else generate_keypair(KEY_BITS)[0]
    msg = m.PublicKey(**schemes.public_key_fields(pub))
    back = loads(dumps(msg))
    assert back == msg and back.scheme == scheme
    n, g, h = back.numbers()
    assert schemes.public_key_from_fields(scheme, n, g, h).n == pub.n
    field = data.draw(st.sampled_from(["n", "g", "h", "scheme"]))
    junk = data.draw(st.sampled_from(["zz", "", "rsa", "2"]))
    bad = m.PublicKey(**{**schemes.public_key_fields(pub), field: junk})
    if field in ("g", "h") and scheme == "paillier" and junk == "":
        return                                          # a Paillier key's empty g/h is the valid form
    try:                        # refused by the decoder (the form) ...
        back = loads(dumps(bad))
    except ProtocolError as exc:
        assert "PublicKey" in str(exc)
        return
    with pytest.raises(InputError, match="OU public key"):     # ... or by the key check (the numbers)
        schemes.public_key_from_fields(back.scheme, *back.numbers())


def test_a_key_of_the_wrong_scheme_is_refused_by_the_passive_party(oukey):
    a, b, _ = small_frames(n=40)
    p = RawPassive("telco", b)
    t = InMemoryTransport("bank", {"telco": lambda frame: dumps(p.handle(loads(frame)))})
    NetActiveParty("bank", a).fit(t, ["telco"], TrainParams(mode="plain", n_estimators=1, max_depth=1))
    pub, _ = oukey
    p.handle(m.TrainSetup("he", 8, "x"))                      # a Paillier training (the default) ...
    with pytest.raises(ProtocolError, match="PublicKey: a 'ou' key for a training set up with scheme 'paillier'"):
        p.handle(m.PublicKey(**pub.fields()))                 # ... refuses an OU key
    p.handle(m.TrainSetup("he", 8, "x", scheme="ou"))
    paillier_pub, _ = generate_keypair(KEY_BITS)
    with pytest.raises(ProtocolError, match="a 'paillier' key for a training set up with scheme 'ou'"):
        p.handle(m.PublicKey(format(paillier_pub.n, "x")))
    bad = {**pub.fields(), "h": format(pub.g, "x")}           # h must be g^n, not g
    with pytest.raises(ProtocolError, match="PublicKey from the active party: OU public key"):
        p.handle(m.PublicKey(**bad))
    p.handle(m.PublicKey(**pub.fields()))                     # the right key passes
    assert p._state.train.plain_bits == KEY_BITS // 3 and int(p._state.train.nsquare) == pub.n
    with pytest.raises(ProtocolError, match="TrainSetup.scheme"):
        loads(dumps(m.TrainSetup("he", 8, "x", scheme="elgamal")))


def test_ou_model_files_round_trip(tmp_path):
    """A model trained with OU is saved with its scheme and loads back to the same predictions (the
    files hold no key: prediction never encrypts)."""
    a, b = _frames(n=100)
    fed = _fed(a, b)
    fed.fit(TrainParams(mode="he", scheme="ou", key_bits=KEY_BITS, n_estimators=2, max_depth=2))
    fed.save(tmp_path)
    again = Federation.load(tmp_path)
    assert again.model.params["scheme"] == "ou"
    new = {"bank": a.drop(columns="y"), "telco": b}
    np.testing.assert_allclose(again.predict_raw(new), fed.predict_raw(new), rtol=0, atol=1e-12)
    text = " ".join(p.read_text() for p in tmp_path.rglob("*.json"))
    assert format(fed.active.channel.private_key.p, "x") not in text
