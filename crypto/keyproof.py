"""Checks a passive party makes of the key holder's public key before it computes on ciphertexts of
that key and re-randomises its replies (issue 31, finding 3).

A passive party re-randomises every ciphertext it returns with ``r^n`` from its *own* uniform ``r``
(:func:`crypto.schemes.reply_encryptor`), never with a base the key holder sends. Then a reply is
uniform over the ciphertexts of its plaintext exactly when the ``n``-th powers are all there is
besides the plaintext, i.e. when ``gcd(n, phi(n)) = 1``; a crafted modulus with ``gcd(n, phi(n)) >
1`` would let the key holder plant labels that no public re-randomiser reaches. So a Paillier key
comes with a **proof that every element of Z_n^* has an n-th root** (the classic argument that
``gcd(n, phi(n)) = 1``: if it is not, at most a ``1/l`` share of the elements are ``n``-th powers,
``l`` the smallest prime factor of the gcd, a factor of ``n``): the key holder returns the ``n``-th
roots of :data:`PROOF_ROUNDS` challenges derived from ``n`` by SHAKE-256 (Fiat-Shamir: the
challenges are the hash's, not the prover's choice), and ``n`` must have no prime factor below
:data:`SMALL_PRIME_BOUND` (trial division), so each challenge passes a bad modulus with probability
below ``2^-16`` and all of them below ``2^-(16 * PROOF_ROUNDS)``.

An Okamoto-Uchiyama modulus ``n = p^2 q`` is not square-free, so this proof does not apply; its
replies are re-randomised by ``y^n`` (own uniform ``y``), which reaches every encryption of zero
when ``gcd(pq, (p-1)(q-1)) = 1`` (true of honestly generated keys, :func:`crypto.ou.generate_keypair`
checks it) but is **not verified** for a received key (docs/security.md states the assumption).
For both schemes the bases are checked against degenerate values (units of small order).
"""
from __future__ import annotations

import hashlib

import gmpy2

from datasets.errors import InputError

mpz = gmpy2.mpz

#: challenges of the n-th-root proof (each passes a bad modulus with probability < 2^-16)
PROOF_ROUNDS = 12
#: trial division bound: n (and so gcd(n, phi(n))) has no prime factor below it
SMALL_PRIME_BOUND = 1 << 16
#: orders up to this bound's lcm are "small" for a base (g, h of OU)
SMALL_ORDER_BOUND = 1 << 12
_DOMAIN = b"vfl-boost/paillier-nth-root-proof/v1"


def _primorial(bound: int) -> int:
    prod, p = mpz(1), mpz(2)
    while p < bound:
        prod *= p
        p = gmpy2.next_prime(p)
    return prod


def _lcm_upto(bound: int) -> int:
    out, p = mpz(1), mpz(2)
    while p < bound:
        q = p
        while q * p < bound:
            q *= p
        out *= q
        p = gmpy2.next_prime(p)
    return out


_PRIMORIAL = _primorial(SMALL_PRIME_BOUND)
_SMALL_ORDERS = _lcm_upto(SMALL_ORDER_BOUND)


def check_no_small_factors(n: int, what: str) -> None:
    """Refuse a modulus with a prime factor below :data:`SMALL_PRIME_BOUND`."""
    if gmpy2.gcd(mpz(n), _PRIMORIAL) != 1:
        raise InputError(f"{what}: the modulus has a prime factor below {SMALL_PRIME_BOUND} (not an honest key)")


def check_base(value: int, n: int, name: str, what: str) -> None:
    """Refuse a base that is not a unit of large order modulo ``n`` (``1``, ``n - 1`` and any unit
    whose order divides lcm(1..:data:`SMALL_ORDER_BOUND`))."""
    v, n = mpz(value), mpz(n)
    if not 1 < v < n or gmpy2.gcd(v, n) != 1:
        raise InputError(f"{what}: {name} is not a unit modulo n")
    if gmpy2.powmod(v, _SMALL_ORDERS, n) == 1:
        raise InputError(f"{what}: {name} has a small multiplicative order (a degenerate base such as n - 1)")


def challenges(n: int, rounds: int = PROOF_ROUNDS) -> list:
    """The proof's challenges: ``rounds`` units modulo ``n`` expanded from ``n`` by SHAKE-256."""
    n = mpz(n)
    width = (int(n).bit_length() + 128 + 7) // 8          # 128 extra bits: uniform mod n to 2^-128
    seed = _DOMAIN + int(n).to_bytes((int(n).bit_length() + 7) // 8, "big")
    out = []
    for i in range(int(rounds)):
        x = mpz(int.from_bytes(hashlib.shake_256(seed + i.to_bytes(4, "big")).digest(width), "big")) % n
        if gmpy2.gcd(x, n) != 1:
            raise InputError("Paillier public key: a proof challenge shares a factor with n (not an honest key)")
        out.append(x)
    return out


def prove(n: int, p: int, q: int, rounds: int = PROOF_ROUNDS) -> list[int]:
    """The key holder's proof: the ``n``-th root of each challenge (``x^(n^-1 mod phi(n)) mod n``)."""
    n, phi = mpz(n), (mpz(p) - 1) * (mpz(q) - 1)
    d = gmpy2.invert(n, phi)
    return [int(gmpy2.powmod(x, d, n)) for x in challenges(n, rounds)]


def format_proof(roots) -> str:
    """The proof as the key message carries it: hex roots, comma-separated."""
    return ",".join(format(int(r), "x") for r in roots)


def parse_proof(text: str) -> list[int]:
    try:
        return [int(part, 16) for part in text.split(",")] if text else []
    except ValueError:
        raise InputError("Paillier public key: the n-th-root proof is not comma-separated hexadecimal") from None


def verify(n: int, roots) -> None:
    """Check a Paillier modulus and its proof; :class:`InputError` names what fails."""
    what = "Paillier public key"
    n = mpz(n)
    check_no_small_factors(n, what)
    if gmpy2.is_power(n):
        raise InputError(f"{what}: the modulus is a perfect power")
    roots = list(roots)
    if len(roots) != PROOF_ROUNDS:
        raise InputError(f"{what}: the n-th-root proof has {len(roots)} roots, {PROOF_ROUNDS} are needed "
                         "(a key holder of an older release, or a key whose n-th powers are not all of Z_n^*)")
    for i, (x, s) in enumerate(zip(challenges(n), roots)):
        if not 0 < s < n or gmpy2.powmod(mpz(s), n, n) != x:
            raise InputError(f"{what}: the n-th-root proof fails at challenge {i} (gcd(n, phi(n)) != 1: "
                             "a modulus crafted so that replies could not be re-randomised)")
