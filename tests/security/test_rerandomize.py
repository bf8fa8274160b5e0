"""Every ciphertext a passive party returns is re-randomised (issue 22, Build 4): the reply is not
the product of the key holder's own ciphertexts, yet decrypts to the same sums (he == plain)."""
import time

import numpy as np
import pytest
from support import KEY_BITS, small_frames

from crypto import schemes
from crypto.keys import generate_keypair
from crypto.obfuscators import ReplyRandomizer
from crypto.paillier import Decryptor, Encryptor
from parties import passive_splits
from parties.passive import PassiveParty
from protocols import messages as m
from protocols.serialization import BigInts, loads
from vfl.api import ActiveParty, Federation, TrainParams


def test_the_operation_keeps_the_plaintexts_and_changes_every_ciphertext():
    pk, sk = generate_keypair(KEY_BITS)
    holder = Encryptor(pk, sk, "fast")
    cts = holder.encrypt([0, 1, -5, 123456789])
    public = Encryptor(pk, None, "fast", _hs=holder.hs)      # what the passive party builds
    public.stock.fill(2)
    out, from_stock, on_spot = public.rerandomize(cts)
    assert (from_stock, on_spot) == (2, 2) and len(public.stock) == 0
    assert all(a != b for a, b in zip(out, cts))
    assert Decryptor(sk).decrypt_signed(out) == [0, 1, -5, 123456789]
    out2, _, _ = Encryptor(pk, None, "standard").rerandomize(cts)      # no published base: r^n
    assert all(a != b for a, b in zip(out2, out)) and Decryptor(sk).decrypt_signed(out2) == [0, 1, -5, 123456789]


def test_ou_replies_are_rerandomised_through_the_same_seam():
    """An Okamoto-Uchiyama key's reply encryptor (crypto.schemes.reply_encryptor) multiplies in fresh
    h^r from its own stock: every ciphertext changes, the plaintexts stay."""
    pub, priv = schemes.generate_keypair(KEY_BITS, scheme=schemes.OU)
    holder = schemes.encryptor(pub, priv)
    cts = holder.encrypt([0, 3, -7, 99])
    r = ReplyRandomizer(schemes.reply_encryptor(pub)).start()
    try:
        out = r.rerandomize(cts)
    finally:
        r.close()
    assert all(a != b for a, b in zip(out, cts)) and r.stats()["count"] == 4
    assert schemes.decryptor(priv).decrypt_signed(out) == [0, 3, -7, 99]


def test_the_stock_is_filled_while_the_party_waits():
    pk, sk = generate_keypair(KEY_BITS)
    holder = Encryptor(pk, sk, "fast")
    r = ReplyRandomizer(Encryptor(pk, None, "fast", _hs=holder.hs), batch=4).start()
    try:
        with r.busy():
            out = r.rerandomize(holder.encrypt([7] * 8))      # on the spot: the stock is empty
        assert Decryptor(sk).decrypt_signed(out) == [7] * 8
        for _ in range(400):          # not a timing assertion: wait (bounded) for the background fill
            if r.stats()["stock"] >= 12:
                break
            time.sleep(0.01)
        assert r.stats()["stock"] == 12         # ROUNDS_AHEAD x the last reply
        r.rerandomize(holder.encrypt([1] * 8))
        st = r.stats()
        assert st["count"] == 16 and st["on_spot"] == 8 and st["from_stock"] == 8
    finally:
        r.close()


def _pair():
    a, b, _ = small_frames(120, seed=7)
    return a, b


def test_a_reply_is_not_the_product_of_the_key_holders_ciphertexts(monkeypatch):
    """Two passive parties with the same rows get the same messages; one re-randomises (today's
    code), the other returns the raw products (the operation made the identity). Every reply value
    differs, and both decrypt to the same sums."""
    a, b = _pair()
    # the party and its twins put their candidates in the same order (issue 31: a fresh random order per
    # request), so that the recorded picks name the same candidates
    monkeypatch.setattr(passive_splits, "shuffle_rng", lambda: np.random.default_rng(3))
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)], record=True)
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=1, max_depth=2))
    sent = [loads(f) for _, r, f in fed.transport.log if r == "telco"]
    twin = PassiveParty("telco", b)
    raw = PassiveParty("telco", b)
    real_rerandomize = Encryptor.rerandomize
    monkeypatch.setattr(Encryptor, "rerandomize", lambda self, cts: (list(cts), 0, len(cts)), raising=True)
    replies_raw = [raw.handle(req) for req in sent if not isinstance(req, m.TrainEnd)]
    monkeypatch.setattr(Encryptor, "rerandomize", real_rerandomize)
    replies = [twin.handle(req) for req in sent if not isinstance(req, m.TrainEnd)]
    pairs = [(x, y) for x, y in zip(replies, replies_raw) if isinstance(x, m.CandidateResponse)]
    assert len(pairs) >= 2
    dec = Decryptor(fed.active.channel.private_key)
    for x, y in pairs:
        assert x.n_values == y.n_values
        assert all(u != v for u, v in zip(x.values.values, y.values.values))
        assert dec.decrypt(x.values.values) == dec.decrypt(y.values.values)
    assert twin._state.train.randomizer.count == sum(len(x.values.values) for x, _ in pairs)


def test_he_equals_plain_with_rerandomised_replies():
    a, b = _pair()
    models = {}
    for mode in ("he", "plain"):
        fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
        models[mode] = fed.fit(TrainParams(mode=mode, key_bits=KEY_BITS, n_estimators=2, max_depth=3))
        if mode == "he":      # the passive party's seconds, in the round's timing stages
            assert all("rerandomize" in str(t) for t in fed.active.timings)
    assert [[t.structure() for t in r] for r in models["he"].rounds] == \
        [[t.structure() for t in r] for r in models["plain"].rounds]


def test_public_key_messages_check_the_base():
    with pytest.raises(Exception, match="PublicKey.hs"):
        m.PublicKey("f" * 256 + "1", hs="zz").validate()
    with pytest.raises(Exception, match="PublicKey.hs: only a Paillier key"):
        m.PublicKey("ff", "ou", "3", "5", hs="3").validate()
    assert BigInts  # the codec the replies travel in
