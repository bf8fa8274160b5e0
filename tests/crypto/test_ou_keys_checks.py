"""OU keys in process, beyond the round trips of test_ou.py: each malformed key part refused with
its own reason, what a key prints (never a secret), an obfuscator is an encryption of zero, and the
scheme seam rebuilds a Paillier decryptor from its state."""
import warnings

import gmpy2
import pytest
from support import KEY_BITS

from crypto import ou, schemes
from crypto.keys import WeakKeyWarning, generate_keypair
from vfl.core.errors import InputError


@pytest.fixture(scope="module")
def oukey():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakKeyWarning)
        return ou.generate_keypair(KEY_BITS)


def test_key_parts_must_be_integers():
    with pytest.raises(InputError, match="OU public key: n, g and h must be integers"):
        ou.check_public_key("n", 2, 3)
    with pytest.raises(InputError, match="OU public key: n, g and h must be integers"):
        ou.check_public_key(None, 2, 3)


def test_p_dividing_q_minus_1_is_refused():
    with pytest.raises(InputError, match="OU private key: p divides q - 1 or q divides p - 1"):
        ou.check_private_key(3, 7, 2, 8)


def test_a_p_too_small_for_the_plaintext_space_is_refused():
    """A well-formed n = p^2 q of 1024 bits whose p is 61 bits: the message space would be p."""
    p = gmpy2.next_prime(1 << 60)
    q = gmpy2.next_prime((1 << 903) + 12345)
    while gmpy2.gcd(p, q - 1) != 1:
        q = gmpy2.next_prime(q)
    n = p * p * q
    assert n.bit_length() == 1024 and gmpy2.gcd(q, p - 1) == 1
    g = 3
    h = int(gmpy2.powmod(g, n, n))
    with pytest.raises(InputError, match=r"OU private key: p has 61 bits, a 1024-bit key needs 341 \(the "
                                         r"plaintext space\)"):
        ou.check_private_key(p, q, g, h)


def test_h_and_g_of_the_wrong_order_are_refused(oukey):
    pub, priv = oukey
    g2 = 2
    h2 = int(gmpy2.powmod(g2, pub.n, pub.n))
    # a g whose (p-1)-part is not in t's subgroup: with t, h^t mod p^2 is not 1 ...
    with pytest.raises(InputError, match="OU private key: h\\^t mod p\\^2 is not 1"):
        ou.check_private_key(priv.p, priv.q, g2, h2, priv.t)
    # ... without t (the textbook exponent p - 1) the same g is a good key
    key = ou.check_private_key(priv.p, priv.q, g2, h2)
    assert key.t is None and key.exponent == priv.p - 1
    enc, dec = ou.Encryptor(key.public_key, key), ou.Decryptor(key)
    assert dec.decrypt_signed(enc.encrypt([5, -7, 0])) == [5, -7, 0]
    # an n-th power as g: g^(p-1) is 1 mod p^2, nothing could be decrypted
    bad_g = pub.h
    bad_h = int(gmpy2.powmod(bad_g, pub.n, pub.n))
    with pytest.raises(InputError, match="g\\^\\(p-1\\) mod p\\^2 does not have order p"):
        ou.check_private_key(priv.p, priv.q, bad_g, bad_h)
    unchecked = ou.OUPrivateKey(ou.OUPublicKey(pub.n, bad_g, bad_h), priv.p, priv.q)
    with pytest.raises(InputError, match="decryption impossible"):
        ou.Encryptor(unchecked.public_key, unchecked)
    with pytest.raises(InputError, match="decryption impossible"):
        ou.Decryptor(unchecked)


def test_what_keys_print_and_compare(oukey):
    pub, priv = oukey
    assert repr(pub) == f"OUPublicKey({KEY_BITS} bits)" and repr(priv) == f"OUPrivateKey({KEY_BITS} bits)"
    assert str(int(priv.p)) not in repr(priv) and format(int(priv.p), "x") not in repr(priv)
    same = ou.OUPublicKey(pub.n, pub.g, pub.h)
    assert same == pub and hash(same) == hash(pub) and len({same, pub}) == 1
    assert ou.OUPublicKey(pub.n, pub.g, pub.h * pub.g % pub.n) != pub and pub != pub.n


def test_max_int_is_the_encryptors_and_round_trips_with_the_public_key_only(oukey):
    pub, priv = oukey
    assert pub.max_int == ou.Encryptor(pub).max_int == (1 << (pub.plain_bits - 2)) - 1
    dec = ou.Decryptor(priv)
    assert dec.cipher_modulus == pub.n
    assert dec.decrypt_signed(pub.encrypt([pub.max_int, -pub.max_int])) == [pub.max_int, -pub.max_int]
    with pytest.raises(OverflowError):
        pub.encrypt([pub.max_int + 1])


@pytest.mark.parametrize("holder", [False, True])
def test_an_obfuscator_is_an_encryption_of_zero(oukey, holder):
    pub, priv = oukey
    enc = ou.Encryptor(pub, priv if holder else None)
    r = enc.obfuscator()
    assert 1 < r < pub.n and ou.Decryptor(priv).decrypt([r]) == [0]
    c = pub.add(pub.encrypt([41])[0], r)
    assert ou.Decryptor(priv).decrypt_signed([c]) == [41]


def test_encrypt_with_needs_one_obfuscator_per_value_and_methods_are_named(oukey):
    pub, priv = oukey
    enc = ou.Encryptor(pub, priv)
    with pytest.raises(ValueError, match="3 plaintexts but 2 obfuscators"):
        enc.encrypt_with([1, 2, 3], enc.obfuscators(2))
    with pytest.raises(ValueError, match="unknown encryption method 'slow'; choose one of"):
        ou.Encryptor(pub, priv, "slow")


def test_the_scheme_seam_rebuilds_decryptors_of_both_schemes(oukey):
    pub, priv = oukey
    ou_dec = schemes.decryptor_from_state(ou.Decryptor(priv).state())
    assert isinstance(ou_dec, ou.Decryptor) and ou_dec.decrypt_signed(pub.encrypt([-3])) == [-3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakKeyWarning)
        ppub, ppriv = generate_keypair(KEY_BITS)
    dec = schemes.decryptor(ppriv)
    rebuilt = schemes.decryptor_from_state(dec.state())
    assert type(rebuilt) is type(dec) and schemes.scheme_of(ppub) == "paillier"
    enc = schemes.encryptor(ppub, ppriv)
    assert rebuilt.decrypt_signed(enc.encrypt([12, -5])) == [12, -5]
