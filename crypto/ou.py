"""Okamoto-Uchiyama (OU) encryption over gmpy2 integers: the toolkit's second scheme.

Keys (Okamoto and Uchiyama, EUROCRYPT 1998): ``n = p^2 q`` with primes ``p`` and ``q`` of about
``|n|/3`` bits (``p`` exactly :func:`prime_bits` bits, ``q`` the rest, ``n`` exactly the key size:
2048 or 3072 bits; 1024 only for tests). ``g`` in ``Z_n^*`` whose ``g^(p-1) mod p^2`` has order
``p``, and ``h = g^n mod n``. The public key is ``(n, g, h)``; the private key ``p`` (and ``q`` for
the CRT, ``t`` for decryption). With the acceleration of Coron, Naccache and Paillier (1999), as in
HEU, ``p - 1`` has a prime factor ``t`` of twice the security level and ``g``'s ``(p-1)``-part has
order ``t`` (:func:`generate_keypair`); decryption could raise to ``t`` instead of ``p - 1``, but a passive
party's re-randomised replies need ``p - 1`` (:class:`Decryptor`, issue 31).

Encryption of an integer ``m`` with ``|m| < 2^(k-2)`` (``k`` = :func:`plain_bits`, so every such
``m`` is below ``p/2``): ``c = g^m h^r mod n``. Ciphertexts live modulo ``n`` (not ``n^2`` as in
Paillier: half the bytes, and products of half the size); a product mod ``n`` is the sum of the
plaintexts mod ``p``; ``c^k`` multiplies the plaintext by ``k``. A negative ``m`` encrypts
``m mod p`` (decryption maps it back to the centred range).

Randomness, two methods (as for :mod:`crypto.paillier`):

* ``fast``: ``r`` is a **short random exponent** of ``2 * security`` bits rounded up to whole
  table windows (230 bits at 2048-bit keys, 260 at 3072, 160 at 1024:
  :attr:`Encryptor.exponent_bits`), and ``h^r`` comes from a fixed-base table. Its security
  additionally assumes that ``h^r`` with such a short ``r`` is indistinguishable from ``h^r`` with
  ``r`` uniform modulo ``n`` (the short-exponent assumption of DJN 2010 for Paillier and of
  Koshiba-Kurosawa 2004 for discrete-log groups; HEU's OU draws an even shorter ``r``, of about
  the security level). ``2 * security`` bits keep the
  generic (baby-step giant-step / Pollard lambda) attacks on the exponent at ``2^security``.
* ``standard``: ``r`` uniform in ``[1, n)``, computed by square-and-multiply.

The key holder (who encrypts every gradient) computes ``h^r`` modulo ``p^2`` and ``q`` from the
tables and joins them with the CRT, and gets the message part in closed form, without an
exponentiation (see :class:`Encryptor`: ``G^m = 1 + p q ((m s / q) mod p)``, ``G`` in ``g``'s
coset); a party with the public key only works modulo ``n`` with tables of ``g`` and ``g^-1``.

Decryption with ``p``: ``m = L(c^(p-1) mod p^2) / L(g^(p-1) mod p^2) mod p`` with ``L(x) = (x - 1) / p``
over ``Z_{p^2}`` (``t`` or, for a textbook key, ``p - 1``: both give the same plaintexts).

Semantic security (IND-CPA) rests on the p-subgroup assumption; one-wayness on factoring
``n = p^2 q``. OU is not CCA-secure: a decryption oracle for ciphertexts of messages above
``p`` reveals ``p``, so decrypted values never go back to a peer (docs/schemes.md).
"""
from __future__ import annotations

import secrets
from itertools import repeat
from operator import getitem, mod, mul
from typing import Sequence

import gmpy2
import numpy as np

from crypto import parallel
from crypto.keys import MAX_KEY_BITS, check_key_bits, security_bits
from crypto.paillier import FixedBaseTable, ObfuscatorStock, encrypt_on_workers, signed_decrypt, table_window
from datasets.errors import InputError

mpz = gmpy2.mpz

SCHEME = "ou"
#: bits per window of the tables of ``g`` and ``g^-1``: one byte of the message per digit
G_WINDOW = 8
#: the smallest modulus a received OU key may have (tests use 1024-bit keys)
MIN_N_BITS = 1016


#: values per column pass of :meth:`Encryptor.encrypt`: one pass per table row over many values
#: keeps the row in the cache (measured, issue 25: 512 values per pass cost ~40% more)
ENCRYPT_CHUNK = 8192


def ou_window(key_bits: int) -> int:
    """Bits per window of the tables of ``h`` (measured, issue 25): 12 at 2048-bit keys (tables
    ~29 MB per key and process, 3 products fewer per half than 10-bit windows), 11 at 3072 (~22
    MB), 8 at 1024 (a bigger table falls out of the cache). The exponent's length does not depend
    on it (:attr:`Encryptor.exponent_bits`: the top window is masked to the remaining bits)."""
    if key_bits <= 1024:
        return 8
    return 12 if key_bits <= 2048 else 11


def prime_bits(key_bits: int) -> int:
    """Bits of ``p`` for a ``key_bits``-bit ``n = p^2 q`` (``q`` has ``key_bits - 2 * prime_bits``)."""
    return int(key_bits) // 3


def plain_bits(key_bits: int) -> int:
    """Bits of the plaintext space a layout may fill: ``p >= 2^(k-1)`` with ``k`` = :func:`prime_bits`
    (what :meth:`crypto.packing.PackingLayout.values_per_plaintext` takes as ``modulus_bits``:
    it keeps every packed value below ``2^(k-3)``, far inside ``p/2``)."""
    return prime_bits(key_bits)


def _l(x, p):
    return (x - 1) // p


def _random_below(n) -> object:
    return mpz(secrets.randbelow(int(n) - 2) + 2)


def _random_unit(n) -> object:
    """A uniform unit modulo ``n`` (operating-system randomness)."""
    while True:
        y = mpz(secrets.randbelow(int(n) - 1) + 1)
        if gmpy2.gcd(y, n) == 1:
            return y


def _random_prime(bits: int):
    """A random prime of exactly ``bits`` bits (top two bits set, so products keep their size)."""
    while True:
        x = mpz(secrets.randbits(bits)) | (mpz(3) << (bits - 2)) | 1
        p = gmpy2.next_prime(x)
        if p.bit_length() == bits:
            return p


class OUPublicKey:
    """``(n, g, h)``; ``scheme``, ``cipher_modulus`` (= ``n``) and ``plain_bits`` answer what the
    rest of the toolkit asks a key (never a hard-coded ``n^2``)."""

    scheme = SCHEME

    def __init__(self, n, g, h):
        self.n, self.g, self.h = int(n), int(g), int(h)
        self.key_bits = self.n.bit_length()
        self._public_encryptor = None

    @property
    def cipher_modulus(self) -> int:
        return self.n

    @property
    def plain_bits(self) -> int:
        return plain_bits(self.key_bits)

    @property
    def max_int(self) -> int:
        """The largest ``|m|`` that encrypts (and decrypts back exactly)."""
        return (1 << (self.plain_bits - 2)) - 1

    def fields(self) -> dict:
        """The key message's fields (hex)."""
        return {"scheme": SCHEME, "n": format(self.n, "x"), "g": format(self.g, "x"), "h": format(self.h, "x")}

    def __eq__(self, other):
        return isinstance(other, OUPublicKey) and (self.n, self.g, self.h) == (other.n, other.g, other.h)

    def __hash__(self):
        return hash((self.n, self.g, self.h))

    def __repr__(self):
        return f"OUPublicKey({self.key_bits} bits)"

    def encryptor(self) -> "Encryptor":
        """An encryptor of this public key (tables modulo ``n``), built once."""
        if self._public_encryptor is None:
            self._public_encryptor = Encryptor(self)
        return self._public_encryptor

    def encrypt(self, plaintexts: Sequence[int]) -> list:
        return self.encryptor().encrypt(plaintexts)

    def rerandomize(self, ciphertexts: Sequence) -> list:
        """The same plaintexts under fresh randomness: each ciphertext times a fresh ``h^r``."""
        return self.encryptor().rerandomize(ciphertexts)[0]

    def add(self, a, b):
        """``Enc(x + y)`` from ``Enc(x)`` and ``Enc(y)``."""
        return mpz(a) * mpz(b) % self.n

    def mul(self, c, k: int):
        """``Enc(k x)`` from ``Enc(x)`` (``k`` a signed integer)."""
        k = int(k)
        if k < 0:
            return gmpy2.powmod(gmpy2.invert(mpz(c), self.n), -k, self.n)
        return gmpy2.powmod(mpz(c), k, self.n)


class OUPrivateKey:
    """``p`` and ``q`` of an OU key pair (the CRT needs both) and ``t``, the prime factor of
    ``p - 1`` that the order of ``g``'s ``(p-1)``-part divides (decryption raises to ``t``; None: to
    ``p - 1``, the textbook scheme)."""

    scheme = SCHEME

    def __init__(self, public_key: OUPublicKey, p, q, t=None):
        self.public_key = public_key
        self.p, self.q = int(p), int(q)
        self.t = int(t) if t else None

    @property
    def exponent(self) -> int:
        """What decryption raises a ciphertext to modulo ``p^2``: ``t``, or ``p - 1``."""
        return self.t or self.p - 1

    def __repr__(self):
        return f"OUPrivateKey({self.public_key.key_bits} bits)"


def check_public_key(n, g, h) -> OUPublicKey:
    """An OU public key received from a peer, or :class:`InputError` naming what is wrong."""
    try:
        n, g, h = int(n), int(g), int(h)
    except (TypeError, ValueError):
        raise InputError("OU public key: n, g and h must be integers") from None
    bits = n.bit_length()
    if n % 2 == 0 or bits < MIN_N_BITS or bits > MAX_KEY_BITS:
        raise InputError(f"OU public key: a modulus of {bits} bits is not acceptable "
                         f"(an odd n = p^2 q of {MIN_N_BITS}..{MAX_KEY_BITS} bits)")
    if gmpy2.is_square(n):
        raise InputError("OU public key: n is a perfect square, not p^2 q")
    for name, v in (("g", g), ("h", h)):
        if not 1 < v < n:
            raise InputError(f"OU public key: {name} must lie in (1, n)")
        if gmpy2.gcd(v, n) != 1:
            raise InputError(f"OU public key: {name} shares a factor with n")
    if gmpy2.powmod(mpz(g), n, n) != h:
        raise InputError("OU public key: h is not g^n mod n")
    return OUPublicKey(n, g, h)


def check_private_key(p, q, g, h, t=None) -> OUPrivateKey:
    """A full key pair from its parts (a checkpoint, a test), or :class:`InputError` naming what is wrong."""
    p, q = mpz(p), mpz(q)
    if p == q:
        raise InputError("OU private key: p and q must differ")
    for name, v in (("p", p), ("q", q)):
        if v < 3 or not gmpy2.is_prime(v, 40):
            raise InputError(f"OU private key: {name} is not a prime")
    if gmpy2.gcd(p, q - 1) != 1 or gmpy2.gcd(q, p - 1) != 1:
        raise InputError("OU private key: p divides q - 1 or q divides p - 1")
    n = p * p * q
    pub = check_public_key(n, g, h)
    if p.bit_length() < prime_bits(pub.key_bits):
        raise InputError(f"OU private key: p has {p.bit_length()} bits, a {pub.key_bits}-bit key needs "
                         f"{prime_bits(pub.key_bits)} (the plaintext space)")
    p2 = p * p
    e = p - 1
    if t is not None:
        t = mpz(t)
        if t < 3 or not gmpy2.is_prime(t, 40) or (p - 1) % t or (q - 1) % t == 0:
            raise InputError("OU private key: t must be a prime factor of p - 1 and not of q - 1")
        if gmpy2.powmod(mpz(h), t, p2) != 1:
            raise InputError("OU private key: h^t mod p^2 is not 1 (g's (p-1)-part does not have order t)")
        e = t
    if _l(gmpy2.powmod(mpz(g), e, p2), p) % p == 0:
        raise InputError("OU private key: g^(p-1) mod p^2 does not have order p (decryption impossible)")
    return OUPrivateKey(pub, p, q, t)


def _random_prime_p(bits: int, t):
    """A random prime ``p = 2 t u + 1`` in ``[1.64 * 2^(bits-1), 2^bits)`` (``p - 1`` has the prime
    factor ``t``; the floor makes ``p^2 q`` keep its full size with any ``q`` of :func:`_random_prime`)."""
    lo = -(-(41 << (bits - 1)) // (25 * 2 * t))        # 1.64 = 41/25
    hi = ((1 << bits) - 2) // (2 * t)
    while True:
        p = 2 * t * (lo + mpz(secrets.randbelow(int(hi - lo)))) + 1
        if gmpy2.is_prime(p, 40):
            return p


def generate_keypair(bits: int = 2048) -> tuple[OUPublicKey, OUPrivateKey]:
    """A fresh OU key pair with ``n`` of exactly ``bits`` bits (key-size policy of
    :func:`crypto.keys.check_key_bits`).

    With the acceleration of Coron, Naccache and Paillier (1999), as in HEU: ``p - 1 = 2 t u`` with
    ``t`` a prime of twice the security level (160 / 224 / 256 bits at 1024 / 2048 / 3072-bit keys),
    ``g = g0^(2u)`` for a random ``g0`` (so ``g``'s ``(p-1)``-part modulo ``p^2`` has order ``t``)
    and ``h = g^n``: the key holder's own ciphertexts could be decrypted raising to ``t`` instead of
    ``p - 1`` (about a third of the work); replies re-randomised by a passive party are not (issue 31).
    Also ``gcd(n, p-1) = gcd(n, q-1) = 1`` and ``t`` does not divide ``q - 1``."""
    bits = check_key_bits(bits, "OU")
    k = prime_bits(bits)
    t = gmpy2.next_prime(mpz(secrets.randbits(2 * security_bits(bits))) | (mpz(1) << (2 * security_bits(bits) - 1)))
    while True:
        p = _random_prime_p(k, t)
        q = _random_prime(bits - 2 * k)
        n = p * p * q
        # gcd(n, p-1) = gcd(n, q-1) = 1: the n-th powers are exactly the kernel of decryption
        if p != q and n.bit_length() == bits and gmpy2.gcd(p, q - 1) == 1 and gmpy2.gcd(q, p - 1) == 1 \
                and (q - 1) % t:
            break
    p2 = p * p
    cofactor = (p - 1) // t
    while True:
        g0 = _random_below(n)
        if gmpy2.gcd(g0, n) != 1 or _l(gmpy2.powmod(g0, p - 1, p2), p) % p == 0:
            continue
        g = gmpy2.powmod(g0, cofactor, n)
        if g % p != 1:                 # g's (p-1)-part has order exactly t
            break
    h = gmpy2.powmod(g, n, n)
    pub = OUPublicKey(n, g, h)
    return pub, OUPrivateKey(pub, p, q, t)


def _byte_digits(a) -> bytes:
    """Base-256 digits of a non-negative integer, lowest first."""
    return int(a).to_bytes((a.bit_length() + 7) // 8, "little")


class _GTable:
    """``g^m mod modulus`` for signed ``m`` from fixed-base tables of ``g`` and ``g^-1`` (8-bit
    windows over the plaintext bits): what a party holding only the public key computes."""

    def __init__(self, g, modulus, msg_bits: int):
        m = mpz(modulus)
        self.modulus = m
        self.g = FixedBaseTable(g, m, msg_bits, G_WINDOW).rows
        self.ginv = FixedBaseTable(gmpy2.invert(mpz(g), m), m, msg_bits, G_WINDOW).rows

    def pow(self, msg):
        if msg == 0:
            return mpz(1)
        rows = self.g if msg > 0 else self.ginv
        m = self.modulus
        acc = None
        for row, d in zip(rows, _byte_digits(abs(msg))):
            if d:
                acc = row[d] if acc is None else acc * row[d] % m
        return acc


class Encryptor:
    """Encrypts plaintext integers into raw OU ciphertext integers (mod ``n``): the same
    interface as :class:`crypto.paillier.Encryptor` (``encrypt``, ``encrypt_with``,
    ``encrypt_stocked``, ``obfuscators``, ``stock``, ``state`` / ``from_state``).

    **The key holder's message part is free.** With ``e`` what decryption raises to (``t``, or
    ``p - 1`` for a textbook key), ``b = L(g^e mod p^2)`` and ``s = b / e mod p``, the element ``G``
    with ``G = 1 + s p (mod p^2)`` and ``G = 1 (mod q)`` has ``G^m = 1 + m s p (mod p^2)``, ``1 (mod
    q)``, i.e. ``G^m = 1 + p q ((m s / q) mod p) (mod n)``: one small product, no exponentiation (the
    analogue of Paillier's ``(1 + n)^m = 1 + m n``). ``G`` decrypts like ``g`` (same ``p``-part) and
    its other parts are trivial; as ``g``'s ``(p-1)``-part lies in ``<h>`` and ``gcd(n, p-1) =
    gcd(n, q-1) = 1`` (and ``t`` does not divide ``q - 1``), ``G = g h^k`` for some ``k``:
    ``G^m h^r = g^m h^(k m + r)``, an encryption of ``m`` with the exponent shifted by the constant
    ``k m``: the same distribution as ``g^m h^r`` (exactly for uniform ``r``, and under the
    short-exponent assumption for short ``r``). ``G`` is never published (``G - 1`` shares ``p q``
    with ``n``). A party with the public key only computes ``g^m`` from fixed-base tables
    (:class:`_GTable`)."""

    #: ``fast``: ``h^r``, ``r`` short; ``standard``: ``h^r``, ``r`` uniform below ``n``; ``uniform``:
    #: ``y^n`` for ``y`` uniform in ``Z_n^*``, no base of the key holder's (a passive party's
    #: re-randomisation, :func:`crypto.schemes.reply_encryptor`: an encryption of zero whatever
    #: ``g`` and ``h`` are, as ``p`` divides ``n``; the key holder decrypts with ``p - 1``)
    METHODS = ("fast", "standard", "uniform")
    scheme = SCHEME

    def __init__(self, public_key: OUPublicKey, private_key: OUPrivateKey | None = None, method: str = "fast",
                 *, exponent_bits: int | None = None):
        """``exponent_bits``: the length of the short exponent ``r`` (default: ``2 * security`` bits
        rounded up to whole table windows, what every training uses: :meth:`state` does not carry
        it, no option sets it). **Benchmarks only**: ``benchmarks/schemes.py`` passes HEU's 110
        bits (2048-bit keys) to compare the two implementations at equal work; at about the security
        level, a generic attack on ``r`` costs ``2^(bits/2)``, below the key's security."""
        if method not in self.METHODS:
            raise ValueError(f"unknown encryption method {method!r}; choose one of {self.METHODS}")
        self.method = method
        self.public_key = public_key
        self.n = mpz(public_key.n)
        self.g, self.h = mpz(public_key.g), mpz(public_key.h)
        self.key_bits = int(self.n.bit_length())
        self.plain_bits = plain_bits(self.key_bits)
        self.max_int = (1 << (self.plain_bits - 2)) - 1
        self._p = self._q = None
        if private_key is not None:
            p, q = mpz(private_key.p), mpz(private_key.q)
            self._p, self._q, self._p2, self._pq = p, q, p * p, p * q
            self._q_inv = gmpy2.invert(q, self._p2)      # CRT: n = p^2 * q
            self._e = e = mpz(private_key.exponent)     # what decryption raises to: t (or p - 1)
            b = _l(gmpy2.powmod(self.g, e, self._p2), p) % p
            if b == 0:
                raise InputError("OU private key: g^(p-1) mod p^2 does not have order p (decryption impossible)")
            # G = 1 + s p (mod p^2), 1 (mod q) with L(G^e) = s e = b: G decrypts like g
            self._s = b * gmpy2.invert(e % p, p) % p
            self._sq = self._s * gmpy2.invert(q, p) % p  # G^m = 1 + p q ((m sq) mod p) (mod n)
        window = table_window(self.key_bits)
        self.exponent_bits = -(-2 * security_bits(self.key_bits) // window) * window
        if exponent_bits is not None:
            if not 64 <= int(exponent_bits) <= self.exponent_bits:
                raise ValueError(f"exponent_bits must be 64..{self.exponent_bits}, got {exponent_bits!r}")
            self.exponent_bits = int(exponent_bits)
        self._window = ou_window(self.key_bits)
        # the tables' windows may overshoot exponent_bits: the top digit keeps only what is left
        self._top_mask = (1 << (self.exponent_bits - self._window * (-(-self.exponent_bits // self._window) - 1))) - 1
        self._tables = None
        self._gtable = None
        self.stock = ObfuscatorStock(self)

    @property
    def cipher_modulus(self):
        return self.n

    @property
    def tables(self) -> tuple:
        """Fixed-base tables of ``h`` modulo ``p^2`` and ``q`` (key holder) or modulo ``n``."""
        if self._tables is None:
            mods = (self._p2, self._q) if self._p is not None else (self.n,)
            self._tables = tuple(FixedBaseTable(self.h, m, self.exponent_bits, self._window) for m in mods)
        return self._tables

    def state(self) -> dict:
        """What a worker process of the key holder needs to encrypt like this object."""
        return {"scheme": SCHEME, "n": format(int(self.n), "x"), "g": format(int(self.g), "x"),
                "h": format(int(self.h), "x"), "method": self.method,
                "p": format(int(self._p), "x") if self._p is not None else None,
                "q": format(int(self._q), "x") if self._q is not None else None,
                "e": format(int(self._e), "x") if self._p is not None else None}

    @classmethod
    def from_state(cls, st: dict) -> "Encryptor":
        pub = OUPublicKey(int(st["n"], 16), int(st["g"], 16), int(st["h"], 16))
        priv = None
        if st.get("p"):
            p, e = int(st["p"], 16), int(st["e"], 16)
            priv = OUPrivateKey(pub, p, int(st["q"], 16), None if e == p - 1 else e)
        enc = cls(pub, priv, st["method"])
        if enc.method == "fast":
            enc.tables                 # a worker builds its tables when the key arrives
        return enc

    def _join(self, xp, xq):
        """CRT: the residue mod ``n`` of ``xp`` mod ``p^2`` and ``xq`` mod ``q``."""
        return xq + self._q * ((xp - xq) * self._q_inv % self._p2)

    def _check(self, plaintexts) -> None:
        lim = self.max_int
        for m in plaintexts:
            if m > lim or -m > lim:
                raise OverflowError("plaintext does not fit the key's message space")

    # -- randomness -----------------------------------------------------------
    def _random_columns(self, count: int) -> np.ndarray:
        """``(n_windows, count)`` digits of ``count`` uniform exponents below ``2**exponent_bits``
        (operating-system randomness, 16 bits per digit, masked; the top digit to what is left)."""
        w = self.tables[0].n_windows
        raw = np.frombuffer(secrets.token_bytes(2 * count * w), dtype="<u2").reshape(w, count)
        out = raw & ((1 << self._window) - 1)
        out[-1] &= self._top_mask
        return out

    def _table_pows(self, table, cols, lo: int, hi: int) -> list:
        """``base^e mod modulus`` of ``table`` for the exponents ``lo..hi`` of the digit columns
        ``cols``: one pass per window over all of them (C-level loops, no per-value bytecode)."""
        m = table.modulus
        rows = table.rows
        acc = list(map(getitem, repeat(rows[0]), cols[0][lo:hi]))
        for row, col in zip(rows[1:], cols[1:]):
            acc = list(map(mod, map(mul, acc, map(row.__getitem__, col[lo:hi])), repeat(m)))
        return acc

    def _obfuscator_chunks(self, count: int):
        """``h^r`` for ``count`` fresh ``r``, in chunks of :data:`ENCRYPT_CHUNK`: ``(lo, hi, parts)``
        with ``parts`` one list per table (mod ``p^2`` and ``q``, or mod ``n``)."""
        tables = self.tables
        cols = self._random_columns(count).tolist()
        for lo in range(0, count, ENCRYPT_CHUNK):
            hi = min(count, lo + ENCRYPT_CHUNK)
            yield lo, hi, [self._table_pows(t, cols, lo, hi) for t in tables]

    def obfuscators(self, count: int) -> list:
        """``count`` fresh ``h^r mod n``, each from its own randomness (``r`` short for ``fast``)."""
        if self.method == "standard":
            return [gmpy2.powmod(self.h, _random_below(self.n), self.n) for _ in range(count)]
        if self.method == "uniform":
            return [gmpy2.powmod(_random_unit(self.n), self.n, self.n) for _ in range(count)]
        out: list = []
        for _, _, parts in self._obfuscator_chunks(count):
            if len(parts) == 1:
                out.extend(parts[0])
            else:
                out.extend(map(self._join, *parts))
        return out

    def obfuscator(self):
        return self.obfuscators(1)[0]

    # -- encryption -------------------------------------------------------------
    def message_part(self, m):
        """``G^m mod n`` (key holder: closed form) or ``g^m mod n`` (public key: tables)."""
        if self._p is not None:
            return 1 + self._pq * (mpz(m) * self._sq % self._p)
        if self._gtable is None:
            self._gtable = _GTable(self.g, self.n, self.plain_bits)
        return self._gtable.pow(m)

    def encrypt_with(self, plaintexts: Sequence[int], obfuscators: Sequence) -> list:
        """Encrypt with obfuscators made earlier: one product per value for the key holder (each
        obfuscator used once: the stock hands each out once)."""
        if len(obfuscators) != len(plaintexts):
            raise ValueError(f"{len(plaintexts)} plaintexts but {len(obfuscators)} obfuscators")
        self._check(plaintexts)
        n = self.n
        return [self.message_part(m) * r % n for m, r in zip(plaintexts, obfuscators)]

    def encrypt_stocked(self, plaintexts: Sequence[int]) -> tuple[list, int, int]:
        """Encrypt with obfuscators from :attr:`stock` first, the rest the usual way; returns
        ``(ciphertexts, from stock, made on the spot)``."""
        obf = self.stock.take(len(plaintexts))
        k = len(obf)
        out = self.encrypt_with(plaintexts[:k], obf) if k else []
        if k < len(plaintexts):
            out.extend(self.encrypt(plaintexts[k:]))
        return out, k, len(plaintexts) - k

    def encrypt(self, plaintexts: Sequence[int], executor=None) -> list:
        """Encrypt signed integers with ``|m| <= max_int``; big batches over ``executor``'s workers."""
        self._check(plaintexts)
        if parallel.on_workers(executor, "encrypt", len(plaintexts)):
            return self._encrypt_workers(plaintexts, executor)
        if self.method != "fast" or self._p is None:
            return self.encrypt_with(plaintexts, self.obfuscators(len(plaintexts)))
        p, p2, q, qinv, s = self._p, self._p2, self._q, self._q_inv, self._s
        out: list = []
        for lo, hi, (xps, xqs) in self._obfuscator_chunks(len(plaintexts)):
            for m, xp, xq in zip(plaintexts[lo:hi], xps, xqs):
                if m:       # xp G^m = xp (1 + m s p) = xp + p ((xp m s) mod p) (mod p^2), 1 (mod q)
                    xp += p * (xp * (m * s % p) % p)
                out.append(xq + q * ((xp - xq) * qinv % p2))
        return out

    def rerandomize(self, ciphertexts: Sequence) -> tuple[list, int, int]:
        """The same plaintexts under fresh randomness: each ciphertext times a fresh ``h^r``, taken
        from :attr:`stock` or made on the spot (the operation Paillier's encryptor offers too: a
        passive party re-randomises its replies with it, issue 22). Returns ``(ciphertexts, from
        stock, made on the spot)``."""
        n = self.n
        obf = self.stock.take(len(ciphertexts))
        k = len(obf)
        if k < len(ciphertexts):
            obf.extend(self.obfuscators(len(ciphertexts) - k))
        return [mpz(c) * r % n for c, r in zip(ciphertexts, obf)], k, len(ciphertexts) - k

    def _encrypt_workers(self, plaintexts, executor) -> list:
        return encrypt_on_workers(self, plaintexts, executor, self.n, self.n)


class Decryptor:
    """Decryption with ``p``: ``L(c^e mod p^2) * L(g^e mod p^2)^-1 mod p``, ``L(x) = (x - 1) / p``,
    with ``e = p - 1``, whatever ``t`` is: a passive party's replies carry its own ``y^n`` (issue 31),
    whose ``(p-1)``-part is not in ``g``'s subgroup, so raising to ``t`` alone (Coron-Naccache-Paillier,
    three times cheaper) would not remove it. Only replies are decrypted, a few ciphertexts per node."""

    scheme = SCHEME

    def __init__(self, private_key: OUPrivateKey):
        pub = private_key.public_key
        self.p = p = mpz(private_key.p)
        self.q = mpz(private_key.q)
        self.t = mpz(private_key.t) if private_key.t else None
        self.e = p - 1
        self.g = mpz(pub.g)
        self.n = mpz(pub.n)
        self.p2 = p * p
        b = _l(gmpy2.powmod(self.g, self.e, self.p2), p) % p
        if b == 0:
            raise InputError("OU private key: g^(p-1) mod p^2 does not have order p (decryption impossible)")
        self.b_inv = gmpy2.invert(b, p)

    @property
    def cipher_modulus(self):
        return self.n

    def state(self) -> dict:
        return {"scheme": SCHEME, "p": format(int(self.p), "x"), "q": format(int(self.q), "x"),
                "g": format(int(self.g), "x"), "t": format(int(self.t), "x") if self.t else None}

    @classmethod
    def from_state(cls, st: dict) -> "Decryptor":
        p, q, g = int(st["p"], 16), int(st["q"], 16), int(st["g"], 16)
        n = p * p * q
        t = int(st["t"], 16) if st.get("t") else None
        return cls(OUPrivateKey(OUPublicKey(n, g, pow(g, n, n)), p, q, t))

    def decrypt(self, ciphertexts: Sequence) -> list[int]:
        """Plaintexts in ``[0, p)``."""
        p, p2, e, binv = self.p, self.p2, self.e, self.b_inv
        return [int(((gmpy2.powmod(mpz(c) % p2, e, p2) - 1) // p) * binv % p) for c in ciphertexts]

    def decrypt_signed(self, ciphertexts: Sequence, executor=None) -> list[int]:
        """Plaintexts mapped to the centred range ``(-p/2, p/2]``; big batches over ``executor``."""
        return signed_decrypt(self, ciphertexts, executor, int(self.p), self.n, self.n)


__all__ = ["SCHEME", "OUPublicKey", "OUPrivateKey", "Encryptor", "Decryptor", "generate_keypair",
           "check_public_key", "check_private_key", "plain_bits", "prime_bits"]
