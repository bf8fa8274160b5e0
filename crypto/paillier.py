"""Raw Paillier encryption and decryption over gmpy2 integers.

Ciphertexts travel as plain integers modulo ``n**2`` (never one phe
``EncryptedNumber`` per value); they are ordinary Paillier ciphertexts with
generator ``g = n + 1``, so phe's private key decrypts them.

Encryption of ``m`` is ``(1 + m*n) * r^n mod n^2``. Two ways to draw ``r^n``:

* ``standard``: ``r`` uniform in ``Z_n^*`` (what phe does).
* ``fast`` (Damgard-Jurik-Nielsen style): ``r^n = hs^a`` with ``hs = h^n`` for a
  random unit ``h`` fixed per key, and ``a`` a short random exponent of
  ``2 * security`` bits. Its security additionally assumes that such short
  exponents do not make ciphertexts distinguishable (DJN 2010, also used by
  Intel IPCL and SecretFlow HEU). Documented in the README.

The key holder computes either power with the CRT modulo ``p^2`` and ``q^2``.
"""
from __future__ import annotations

import secrets
from typing import Sequence

import gmpy2

from crypto.keys import security_bits

mpz = gmpy2.mpz


def _crt(xp, xq, p2, q2, q2_inv_p2):
    return xq + q2 * (((xp - xq) * q2_inv_p2) % p2)


class _CrtPow:
    """``base^e mod n^2`` via CRT for the key holder."""

    def __init__(self, p: int, q: int):
        self.p2 = mpz(p) ** 2
        self.q2 = mpz(q) ** 2
        self.q2_inv_p2 = gmpy2.invert(self.q2, self.p2)

    def pow(self, base, e):
        xp = gmpy2.powmod(base, e, self.p2)
        xq = gmpy2.powmod(base, e, self.q2)
        return _crt(xp, xq, self.p2, self.q2, self.q2_inv_p2)


class Encryptor:
    """Encrypts many plaintext integers into raw ciphertext integers."""

    METHODS = ("fast", "standard")

    def __init__(self, public_key, private_key=None, method: str = "fast"):
        if method not in self.METHODS:
            raise ValueError(f"unknown encryption method {method!r}; choose one of {self.METHODS}")
        self.method = method
        self.n = mpz(public_key.n)
        self.nsquare = self.n * self.n
        self.key_bits = int(self.n.bit_length())
        self._crt = _CrtPow(private_key.p, private_key.q) if private_key is not None else None
        self.exponent_bits = 2 * security_bits(self.key_bits)
        if method == "fast":
            h = self._random_unit()
            self.hs = self._pow(h, self.n)

    def _random_unit(self):
        while True:
            r = mpz(secrets.randbelow(int(self.n) - 1) + 1)
            if gmpy2.gcd(r, self.n) == 1:
                return r

    def _pow(self, base, e):
        if self._crt is not None:
            return self._crt.pow(base, e)
        return gmpy2.powmod(base, e, self.nsquare)

    def obfuscator(self):
        """One fresh ``r^n mod n^2``."""
        if self.method == "fast":
            return self._pow(self.hs, mpz(secrets.randbits(self.exponent_bits)))
        return self._pow(self._random_unit(), self.n)

    def encrypt(self, plaintexts: Sequence[int]) -> list:
        """Encrypt signed integers with ``|m| < n/2`` (negative ``m`` is taken mod ``n``)."""
        n, n2 = self.n, self.nsquare
        half = n // 2
        out = []
        for m in plaintexts:
            m = mpz(m)
            if -m >= half or m >= half:
                raise OverflowError("plaintext does not fit the key's message space")
            out.append(((1 + (m % n) * n) * self.obfuscator()) % n2)
        return out


class Decryptor:
    """CRT decryption of raw ciphertext integers (what phe's private key computes)."""

    def __init__(self, private_key):
        p, q = mpz(private_key.p), mpz(private_key.q)
        self.p, self.q = p, q
        self.n = p * q
        self.nsquare = self.n * self.n
        self.p2, self.q2 = p * p, q * q
        n1 = self.n + 1
        self.hp = gmpy2.invert(self._l(gmpy2.powmod(n1, p - 1, self.p2), p), p)
        self.hq = gmpy2.invert(self._l(gmpy2.powmod(n1, q - 1, self.q2), q), q)
        self.q_inv_p = gmpy2.invert(q, p)

    @staticmethod
    def _l(x, d):
        return (x - 1) // d

    def decrypt(self, ciphertexts: Sequence) -> list[int]:
        """Plaintexts in ``[0, n)``."""
        p, q, p2, q2 = self.p, self.q, self.p2, self.q2
        hp, hq, qinv = self.hp, self.hq, self.q_inv_p
        pm1, qm1 = p - 1, q - 1
        out = []
        for c in ciphertexts:
            c = mpz(c)
            mp = (((gmpy2.powmod(c, pm1, p2) - 1) // p) * hp) % p
            mq = (((gmpy2.powmod(c, qm1, q2) - 1) // q) * hq) % q
            out.append(int(mq + q * (((mp - mq) * qinv) % p)))
        return out

    def decrypt_signed(self, ciphertexts: Sequence) -> list[int]:
        """Plaintexts mapped to the centred range ``(-n/2, n/2]``."""
        n = int(self.n)
        half = n // 2
        return [m - n if m > half else m for m in self.decrypt(ciphertexts)]
