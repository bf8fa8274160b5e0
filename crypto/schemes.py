"""The scheme seam: what the rest of the toolkit asks a key instead of assuming Paillier.

Two additively homomorphic schemes share one vocabulary (:data:`SCHEMES`):

* ``paillier`` (:mod:`crypto.paillier`, phe key objects): ciphertexts modulo ``n^2``, plaintexts
  modulo ``n`` (``plain_bits`` = ``|n|``).
* ``ou`` (:mod:`crypto.ou`, Okamoto-Uchiyama): ciphertexts modulo ``n = p^2 q``, plaintexts modulo
  the secret ``p`` (``plain_bits`` = ``|n| / 3``: fewer packed values per ciphertext).

In both, a product of ciphertexts modulo :func:`cipher_modulus` encrypts the sum of the
plaintexts, a power encrypts a multiple and ``1`` encrypts zero: the histogram kernels, Horner
compression and the shard operations take that modulus and nothing else. Encryptors and
decryptors of both schemes have the same methods; :func:`encryptor_from_state` /
:func:`decryptor_from_state` rebuild the right one in a worker process from its ``state()``
(a Paillier state names no scheme).
"""
from __future__ import annotations

from crypto import keyproof, keys, ou, paillier
from datasets.errors import InputError

PAILLIER = "paillier"
OU = ou.SCHEME
SCHEMES = (PAILLIER, OU)
DEFAULT_SCHEME = PAILLIER


def check_scheme(scheme) -> str:
    """The scheme name, or :class:`InputError` naming the choices."""
    if scheme not in SCHEMES:
        raise InputError(f"unknown encryption scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    return scheme


def scheme_of(key) -> str:
    """The scheme of a key, encryptor or decryptor (phe's Paillier objects name none)."""
    return getattr(key, "scheme", PAILLIER)


def generate_keypair(bits: int = keys.DEFAULT_KEY_BITS, scheme: str = DEFAULT_SCHEME):
    """``(public_key, private_key)`` of ``scheme`` after the key-size policy."""
    if check_scheme(scheme) == OU:
        return ou.generate_keypair(bits)
    return keys.generate_keypair(bits)


def cipher_modulus(public_key) -> int:
    """The modulus ciphertexts live in: ``n^2`` (Paillier) or ``n`` (OU)."""
    if scheme_of(public_key) == OU:
        return int(public_key.n)
    return int(public_key.nsquare)


def plain_bits(public_key_or_bits, scheme: str = DEFAULT_SCHEME) -> int:
    """Bits of the plaintext space a packing layout may fill (``modulus_bits`` of
    :meth:`crypto.packing.PackingLayout.values_per_plaintext`): a key, or a key size and a scheme."""
    if isinstance(public_key_or_bits, int):
        bits, scheme = public_key_or_bits, check_scheme(scheme)
    else:
        bits, scheme = int(public_key_or_bits.n).bit_length(), scheme_of(public_key_or_bits)
    return ou.plain_bits(bits) if scheme == OU else bits


def cipher_bits(key_bits: int, scheme: str = DEFAULT_SCHEME) -> int:
    """Bits of one ciphertext of a ``key_bits``-bit key."""
    return key_bits if check_scheme(scheme) == OU else 2 * key_bits


#: one encryption in multiplications modulo the cipher modulus, for the pre-shift cost model
#: (:func:`crypto.compress.choose_shifts`). Paillier (fixed base, CRT): measured ~24 squarings
#: mod n^2. OU: the short exponent's table windows, each a product modulo p^2 and one modulo q
#: (~0.7 of a product mod n), the CRT and the message part (closed form, whatever the message:
#: a pre-shifted copy costs what any value costs).
PAILLIER_ENCRYPT_COST = 24.0


def encrypt_cost(key_bits: int, scheme: str = DEFAULT_SCHEME) -> float:
    """What :func:`crypto.compress.choose_shifts` takes as ``encrypt_cost`` for this key."""
    if check_scheme(scheme) != OU:
        return PAILLIER_ENCRYPT_COST
    window = paillier.table_window(key_bits)
    exp_windows = -(-2 * keys.security_bits(key_bits) // window)
    return 0.7 * exp_windows + 2.0


def public_key_fields(public_key, private_key=None) -> dict:
    """The key message's fields: ``scheme``, ``n`` (and ``g``, ``h`` for OU), hex; with the private key
    of a Paillier key also ``proof``, the key holder's n-th-root proof (:mod:`crypto.keyproof`) that a
    passive party requires before it computes on the key's ciphertexts."""
    if scheme_of(public_key) == OU:
        return public_key.fields()
    fields = {"scheme": PAILLIER, "n": format(int(public_key.n), "x"), "g": "", "h": ""}
    if private_key is not None:
        fields["proof"] = keyproof.format_proof(keyproof.prove(public_key.n, private_key.p, private_key.q))
    return fields


def public_key_from_fields(scheme: str, n: int, g: int | None = None, h: int | None = None,
                           proof: str | None = None):
    """A peer's public key from the key message, checked (:class:`InputError` names the problem).
    ``proof`` (Paillier): the key holder's n-th-root proof as the message carries it; given (even
    empty), it must verify (:func:`crypto.keyproof.verify`): what a passive party asks of every key
    before it computes on its ciphertexts. An OU key's bases are checked against small orders."""
    if check_scheme(scheme) == OU:
        if not g or not h:
            raise InputError("an OU public key needs g and h")
        key = ou.check_public_key(n, g, h)
        keyproof.check_no_small_factors(key.n, "OU public key")
        keyproof.check_base(key.g, key.n, "g", "OU public key")
        keyproof.check_base(key.h, key.n, "h", "OU public key")
        return key
    if g or h:
        raise InputError("a Paillier public key has no g or h (an OU key sent as Paillier?)")
    if proof is not None:
        keyproof.verify(n, keyproof.parse_proof(proof))
    return keys.public_key_from_n(n)


def encryptor(public_key, private_key=None, method: str = "fast"):
    """The encryptor of ``public_key``'s scheme (the key holder's, with the private key)."""
    if scheme_of(public_key) == OU:
        return ou.Encryptor(public_key, private_key, method)
    return paillier.Encryptor(public_key, private_key, method)


def reply_encryptor(public_key):
    """A passive party's encryptor of the key holder's public key, for re-randomising the ciphertexts
    it returns (issues 22 and 31) with **its own** randomness only: Paillier ``r^n mod n^2`` and OU
    ``y^n mod n`` for uniform ``r``, ``y`` drawn from the operating system (the ``standard`` and
    ``uniform`` methods), never from a base the key holder chose, so no key holder can switch the
    re-randomisation off (``hs = n^2 - 1``, ``g = h = n - 1``) or undo it with a short exponent.
    Its ``rerandomize`` returns ``(ciphertexts, from stock, made on the spot)``."""
    if scheme_of(public_key) == OU:
        return ou.Encryptor(public_key, None, "uniform")
    return paillier.Encryptor(public_key, None, "standard")


def decryptor(private_key):
    if scheme_of(private_key) == OU:
        return ou.Decryptor(private_key)
    return paillier.Decryptor(private_key)


def encryptor_from_state(st: dict):
    if st.get("scheme", PAILLIER) == OU:
        return ou.Encryptor.from_state(st)
    return paillier.Encryptor.from_state(st)


def decryptor_from_state(st: dict):
    if st.get("scheme", PAILLIER) == OU:
        return ou.Decryptor.from_state(st)
    return paillier.Decryptor.from_state(st)
