"""Every ciphertext a passive party returns is re-randomised (issue 22, Build 4): the reply is not
the product of the key holder's own ciphertexts, yet decrypts to the same sums (he == plain).
Issue 31 (finding 3): with the passive party's own uniform randomness only (Paillier ``r^n``, OU
``y^n``), never a base the key holder sends, and only for a key that passes the checks of
:mod:`crypto.keyproof` (a Paillier key's n-th-root proof, OU bases of large order)."""
import dataclasses
import time

import gmpy2
import numpy as np
import pytest
from support import KEY_BITS, small_frames

from crypto import keyproof, schemes
from crypto.keys import generate_keypair
from crypto.obfuscators import ReplyRandomizer
from crypto.paillier import Decryptor, Encryptor
from datasets.errors import InputError
from parties import passive_splits
from parties.active import ActiveParty as NetActiveParty
from parties.passive import PassiveParty
from protocols import messages as m
from protocols.serialization import dumps, loads
from protocols.transport import InMemoryTransport
from vfl.api import ActiveParty, Federation, TrainParams
from vfl.core.errors import ProtocolError


def test_the_operation_keeps_the_plaintexts_and_changes_every_ciphertext():
    pk, sk = generate_keypair(KEY_BITS)
    holder = Encryptor(pk, sk, "fast")
    cts = holder.encrypt([0, 1, -5, 123456789])
    public = schemes.reply_encryptor(pk)                  # what the passive party builds: r^n, own r
    assert public.method == "standard" and not hasattr(public, "hs")
    public.stock.fill(2)
    out, from_stock, on_spot = public.rerandomize(cts)
    assert (from_stock, on_spot) == (2, 2) and len(public.stock) == 0
    assert all(a != b for a, b in zip(out, cts))
    assert Decryptor(sk).decrypt_signed(out) == [0, 1, -5, 123456789]


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
    r = ReplyRandomizer(schemes.reply_encryptor(pk), batch=4, prefill=0).start()
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


def test_the_stock_is_filled_before_the_first_reply():
    """The passive party makes ``prefill`` obfuscators while the key holder encrypts the first
    gradients, so the first reply takes them from the stock."""
    pk, sk = generate_keypair(KEY_BITS)
    r = ReplyRandomizer(schemes.reply_encryptor(pk), batch=2, prefill=4).start()
    try:
        for _ in range(1000):          # not a timing assertion: wait (bounded) for the background fill
            if r.stats()["stock"] >= 4:
                break
            time.sleep(0.01)
        out = r.rerandomize(Encryptor(pk, sk).encrypt([3, 4]))
        assert r.stats()["from_stock"] == 2 and r.stats()["on_spot"] == 0
        assert Decryptor(sk).decrypt_signed(out) == [3, 4]
    finally:
        r.close()


# --- issue 31, finding 3: the key holder cannot switch re-randomisation off ------------------------
def test_a_degenerate_base_does_not_switch_re_randomisation_off(monkeypatch):
    """The key holder publishes ``hs = n^2 - 1`` (a unit of order 2): before issue 31 the passive party
    re-randomised with ``hs^a = +-1``, so each reply was +- the product of the key holder's own
    ciphertexts. The passive party now uses its own ``r^n``: no reply is +- that product."""
    a, b = _pair()
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)], record=True)
    n2 = None

    def degenerate(self):
        nonlocal n2
        n2 = int(self.public_key.n) ** 2
        msg = m.PublicKey(**schemes.public_key_fields(self.public_key, self.private_key))
        if "hs" in {f.name for f in dataclasses.fields(m.PublicKey)}:
            msg = dataclasses.replace(msg, hs=format(n2 - 1, "x"))
        return msg
    from parties import channel as channel_module
    monkeypatch.setattr(channel_module.GradientChannel, "public_key_message", degenerate)
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=1, max_depth=2))
    monkeypatch.undo()
    sent = [loads(f) for _, r, f in fed.transport.log if r == "telco"]
    assert n2
    # the raw products of the key holder's ciphertexts: a twin passive party with re-randomisation off, and
    # today's passive party, each fed the same messages up to the first reply of sums (the root's: later
    # requests name candidates by the real party's own random positions)
    upto = next(i for i, x in enumerate(sent) if isinstance(x, m.HistogramRequest)) + 1

    def first_sums(party):
        out = [party.handle(req) for req in sent[:upto]][-1]
        return [int(v) for v in out.values.values]
    monkeypatch.setattr(Encryptor, "rerandomize", lambda self, c: (list(c), 0, len(c)), raising=True)
    raw = first_sums(PassiveParty("telco", b))
    monkeypatch.undo()
    got = first_sums(PassiveParty("telco", b))
    assert len(got) == len(raw) >= 4
    # as sets (the candidates come in a fresh random order): no reply value is +- a raw product
    assert not set(got) & (set(raw) | {(n2 - v) % n2 for v in raw})


def test_a_paillier_key_needs_its_nth_root_proof():
    pk, sk = generate_keypair(KEY_BITS)
    fields = schemes.public_key_fields(pk, sk)
    key = schemes.public_key_from_fields("paillier", pk.n, proof=fields["proof"])
    assert key.n == pk.n
    with pytest.raises(InputError, match="has 0 roots"):
        schemes.public_key_from_fields("paillier", pk.n, proof="")
    roots = keyproof.parse_proof(fields["proof"])
    roots[3] = roots[3] * 2 % pk.n
    with pytest.raises(InputError, match="fails at challenge 3"):
        schemes.public_key_from_fields("paillier", pk.n, proof=keyproof.format_proof(roots))
    # a passive party refuses the key message without it (before issue 31: accepted, no proof existed)
    a, b = _pair()
    p = PassiveParty("telco", b)
    t = InMemoryTransport("bank", {"telco": lambda frame: dumps(p.handle(loads(frame)))})
    NetActiveParty("bank", a).fit(t, ["telco"], TrainParams(mode="plain", n_estimators=1, max_depth=1))
    p.handle(m.TrainSetup("he", 8, "x"))
    with pytest.raises(ProtocolError, match="n-th-root proof has 0 roots"):
        p.handle(m.PublicKey(format(pk.n, "x")))
    p.handle(m.PublicKey(**fields))                            # with its proof it passes


def _crafted_paillier(bits: int):
    """A modulus n = p q with p | q - 1, so gcd(n, phi(n)) = p: the n-th powers are a 1/p share of
    Z_n^* and a key holder could plant labels in the rest that no r^n reaches."""
    half = bits // 2
    while True:
        p = gmpy2.next_prime(gmpy2.mpz(2) ** (half - 8) + int.from_bytes(__import__("os").urandom(8), "big"))
        for k in range(2, 1 << 12, 2):
            q = k * p + 1
            if q.bit_length() > bits - (half - 8) + 1:
                break
            if gmpy2.is_prime(q):
                return int(p), int(q)


def test_a_crafted_modulus_cannot_prove_itself():
    p, q = _crafted_paillier(KEY_BITS)
    n = p * q
    assert gmpy2.gcd(n, (p - 1) * (q - 1)) == p
    with pytest.raises(ZeroDivisionError):       # the honest prover's inverse does not exist
        keyproof.prove(n, p, q)
    # the best a cheat can do: roots where they exist (a 1/p share of the challenges), junk elsewhere
    with pytest.raises(InputError, match="proof fails at challenge 0"):
        keyproof.verify(n, [1] * keyproof.PROOF_ROUNDS)


def test_degenerate_ou_bases_are_refused():
    """g = h = n - 1 passed the OU key check before issue 31 ((n-1)^n = n - 1 for odd n); its h^r is
    +-1, so re-randomising with the key's h did nothing. Refused now, as is any base of small order."""
    pub, _ = schemes.generate_keypair(KEY_BITS, scheme=schemes.OU)
    n = pub.n
    with pytest.raises(InputError, match="small multiplicative order"):
        schemes.public_key_from_fields("ou", n, n - 1, n - 1)
    # an element of order 3 or so is not constructible without the factors; a g of order 2 mod p^2 q is
    with pytest.raises(InputError, match="must lie in"):
        schemes.public_key_from_fields("ou", n, 1, 1)
    assert schemes.public_key_from_fields("ou", n, pub.g, pub.h) == pub


def test_ou_replies_use_the_passive_partys_own_nth_powers():
    """The OU reply encryptor multiplies by y^n for its own uniform y: an encryption of zero whatever
    the key's g and h are, which the key holder decrypts (with p - 1)."""
    pub, priv = schemes.generate_keypair(KEY_BITS, scheme=schemes.OU)
    enc = schemes.reply_encryptor(pub)
    assert enc.method == "uniform"
    holder = schemes.encryptor(pub, priv)
    cts = holder.encrypt([5, -6, 0])
    out, _, _ = enc.rerandomize(cts)
    assert schemes.decryptor(priv).decrypt_signed(out) == [5, -6, 0]
    y = gmpy2.mpz(12345)
    assert schemes.decryptor(priv).decrypt_signed([gmpy2.powmod(y, pub.n, pub.n)]) == [0]


def test_public_key_messages_check_the_proof_field():
    with pytest.raises(Exception, match="PublicKey.proof: only a Paillier key"):
        m.PublicKey("ff", "ou", "3", "5", proof="3").validate()
    with pytest.raises(Exception, match="PublicKey.proof: not comma-separated"):
        m.PublicKey("f" * 256 + "1", proof="zz,1").validate()
    assert "hs" not in {f.name for f in dataclasses.fields(m.PublicKey)}
