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
  Intel IPCL and SecretFlow HEU). Documented in docs/threat-model.md (security notes).

The key holder computes either power with the CRT modulo ``p^2`` and ``q^2``.
For ``fast`` the powers of ``hs`` come from a fixed-base table
(:class:`FixedBaseTable`: one 8- or 10-bit window of the exponent per table
row, so ``hs^a`` is one multiplication per window and no squaring), built once
per key and per worker process. Big batches (:func:`crypto.parallel.on_workers`)
are spread over a :class:`crypto.executor.Executor` when one is given; the
workers draw their own randomness from the OS (``secrets``).
"""
from __future__ import annotations

import secrets
import threading
from collections import deque
from typing import Sequence

import gmpy2
import numpy as np
from phe import PaillierPublicKey

from crypto import parallel
from crypto.intcodec import bytes_to_ints, int_width, ints_to_bytes
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


class FixedBaseTable:
    """``base^e mod modulus`` for ``0 <= e < 2**(window * n_windows)`` from a precomputed table.

    Row ``j`` holds ``base^(d * 2**(window * j))`` for every digit ``d < 2**window``; an
    exponent given by its base-``2**window`` digits (lowest first) is one lookup per
    digit and one multiplication per digit after the first, no squaring (8-bit
    windows: 19 multiplications for a 160-bit exponent, a table of 5,100 entries).
    """

    def __init__(self, base, modulus, exponent_bits: int, window: int = 8):
        if not 1 <= window <= 16:
            raise ValueError("window must be 1..16 bits")
        self.modulus = m = mpz(modulus)
        self.window = int(window)
        self.n_windows = -(-int(exponent_bits) // self.window)
        b = mpz(base) % m
        rows = []
        for _ in range(self.n_windows):
            row = [mpz(1), b]
            x = b
            for _ in range(2, 1 << self.window):
                x = x * b % m
                row.append(x)
            rows.append(row)
            b = x * b % m                  # base^(2**(window * (j+1)))
        self.rows = rows

    @property
    def exponent_bits(self) -> int:
        return self.window * self.n_windows

    def pow_digits(self, digits) -> object:
        """``base^(sum_j digits[j] * 2**(window*j)) mod modulus``."""
        m = self.modulus
        rows = self.rows
        acc = rows[0][digits[0]]
        for row, d in zip(rows[1:], digits[1:]):
            acc = acc * row[d] % m
        return acc

    def random_digits(self, count: int) -> list[list[int]]:
        """``count`` uniformly random exponents below ``2**exponent_bits``, as digit lists
        (operating-system randomness, 16 random bits per digit, masked)."""
        raw = np.frombuffer(secrets.token_bytes(2 * count * self.n_windows), dtype="<u2")
        return (raw.reshape(count, self.n_windows) & ((1 << self.window) - 1)).tolist()


def table_window(key_bits: int) -> int:
    """Bits per table window, measured: with 1024-bit keys 8-bit windows win (a bigger
    table falls out of the cache), with 2048-3072-bit keys 10-bit windows are ~10%
    faster (table ~14-22 MB per process)."""
    return 10 if 2048 <= key_bits <= 3072 else 8


class Encryptor:
    """Encrypts many plaintext integers into raw ciphertext integers."""

    METHODS = ("fast", "standard")
    scheme = "paillier"

    def __init__(self, public_key, private_key=None, method: str = "fast", _hs=None):
        if method not in self.METHODS:
            raise ValueError(f"unknown encryption method {method!r}; choose one of {self.METHODS}")
        self.method = method
        self.n = mpz(public_key.n)
        self.nsquare = self.n * self.n
        self.key_bits = int(self.n.bit_length())
        self._p = self._q = None
        self._crt = None
        if private_key is not None:
            self._p, self._q = mpz(private_key.p), mpz(private_key.q)
            self._crt = _CrtPow(self._p, self._q)
        window = table_window(self.key_bits)
        # a short exponent of at least twice the security level, in whole table windows
        self.exponent_bits = -(-2 * security_bits(self.key_bits) // window) * window
        self._window = window
        self._tables = None            # built at the first use (workers build their own)
        if method == "fast":
            self.hs = mpz(_hs) if _hs is not None else self._pow(self._random_unit(), self.n)
        self.stock = ObfuscatorStock(self)   # fresh obfuscators of this key, in this process only

    @property
    def cipher_modulus(self):
        """The modulus ciphertexts live in (``n^2``; :mod:`crypto.schemes`)."""
        return self.nsquare

    @property
    def tables(self) -> tuple:
        """The fixed-base tables of ``hs``: modulo ``p^2`` and ``q^2`` (key holder) or ``n^2``."""
        if self._tables is None:
            c = self._crt
            if c is not None:
                self._tables = (FixedBaseTable(self.hs, c.p2, self.exponent_bits, self._window),
                                FixedBaseTable(self.hs, c.q2, self.exponent_bits, self._window))
            else:
                self._tables = (FixedBaseTable(self.hs, self.nsquare, self.exponent_bits, self._window),)
        return self._tables

    # -- worker processes ---------------------------------------------------
    def state(self) -> dict:
        """What a worker process of the key holder needs to encrypt like this object."""
        return {"n": format(int(self.n), "x"), "method": self.method,
                "p": format(int(self._p), "x") if self._p is not None else None,
                "q": format(int(self._q), "x") if self._q is not None else None,
                "hs": format(int(self.hs), "x") if self.method == "fast" else None}

    @classmethod
    def from_state(cls, st: dict) -> "Encryptor":
        class _Priv:
            p = int(st["p"], 16) if st.get("p") else None
            q = int(st["q"], 16) if st.get("q") else None
        pub = PaillierPublicKey(int(st["n"], 16))
        enc = cls(pub, _Priv if _Priv.p else None, st["method"],
                  _hs=int(st["hs"], 16) if st.get("hs") else None)
        if enc.method == "fast":
            enc.tables                 # a worker builds its tables when the key arrives
        return enc

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
            tables = self.tables
            (exp,) = tables[0].random_digits(1)
            if len(tables) == 2:
                c = self._crt
                return _crt(tables[0].pow_digits(exp), tables[1].pow_digits(exp), c.p2, c.q2, c.q2_inv_p2)
            return tables[0].pow_digits(exp)
        return self._pow(self._random_unit(), self.n)

    def obfuscators(self, count: int) -> list:
        """``count`` fresh obfuscators ``r^n mod n^2`` (``hs^a`` for ``fast``), each from its own
        randomness: what a worker's :class:`ObfuscatorStock` keeps ahead of use."""
        if self.method == "fast" and self._crt is not None:
            return self._encrypt_fast_crt([0] * count)      # (1 + 0 n) hs^a = hs^a
        return [self.obfuscator() for _ in range(count)]

    def encrypt_with(self, plaintexts: Sequence[int], obfuscators: Sequence) -> list:
        """Encrypt with obfuscators made earlier: one multiplication per value. Each
        obfuscator must be used once only (the store hands each out once)."""
        if len(obfuscators) != len(plaintexts):
            raise ValueError(f"{len(plaintexts)} plaintexts but {len(obfuscators)} obfuscators")
        n, n2 = self.n, self.nsquare
        half = n // 2
        out = []
        for m, r in zip(plaintexts, obfuscators):
            if -m >= half or m >= half:
                raise OverflowError("plaintext does not fit the key's message space")
            out.append((1 + (mpz(m) % n) * n) * r % n2)
        return out

    def encrypt_stocked(self, plaintexts: Sequence[int]) -> tuple[list, int, int]:
        """Encrypt with obfuscators from :attr:`stock` (one multiplication per value), the rest the
        usual way; returns ``(ciphertexts, from stock, made on the spot)``."""
        obf = self.stock.take(len(plaintexts))
        k = len(obf)
        out = self.encrypt_with(plaintexts[:k], obf) if k else []
        if k < len(plaintexts):
            out.extend(self.encrypt(plaintexts[k:]))
        return out, k, len(plaintexts) - k

    def rerandomize(self, ciphertexts: Sequence) -> tuple[list, int, int]:
        """The same plaintexts under fresh randomness: every ciphertext times its own fresh
        obfuscator (an encryption of 0), taken from :attr:`stock` or made on the spot. Only the
        public key (and, for ``fast``, the key holder's published base ``hs``) is needed: what a
        passive party does to every ciphertext it returns (issue 22), so a reply is not the
        product of the key holder's own ciphertexts. Returns ``(ciphertexts, from stock, made on
        the spot)``. The scheme-neutral operation (another scheme's encryptor offers the same)."""
        n2 = self.nsquare
        obf = self.stock.take(len(ciphertexts))
        k = len(obf)
        if k < len(ciphertexts):
            obf.extend(self.obfuscators(len(ciphertexts) - k))
        return [mpz(c) * r % n2 for c, r in zip(ciphertexts, obf)], k, len(ciphertexts) - k

    def encrypt(self, plaintexts: Sequence[int], executor=None) -> list:
        """Encrypt signed integers with ``|m| < n/2`` (negative ``m`` is taken mod ``n``).

        With an ``executor`` (worker processes of the key holder) big batches are split
        over its workers."""
        n, n2 = self.n, self.nsquare
        half = n // 2
        for m in plaintexts:
            if -m >= half or m >= half:
                raise OverflowError("plaintext does not fit the key's message space")
        if parallel.on_workers(executor, "encrypt", len(plaintexts)):
            return self._encrypt_workers(plaintexts, executor)
        if self.method == "fast" and self._crt is not None:
            return self._encrypt_fast_crt(plaintexts)
        out = []
        for m in plaintexts:
            m = mpz(m)
            out.append(((1 + (m % n) * n) * self.obfuscator()) % n2)
        return out

    def _encrypt_fast_crt(self, plaintexts) -> list:
        """``(1 + m n) hs^a`` computed modulo ``p^2`` and ``q^2`` from the tables, then CRT."""
        tp, tq = self.tables
        rp0, rq0 = tp.rows[0], tq.rows[0]
        rows = list(zip(tp.rows[1:], tq.rows[1:]))
        c = self._crt
        p2, q2, qinv = c.p2, c.q2, c.q2_inv_p2
        n = self.n
        out = []
        for m, e in zip(plaintexts, tp.random_digits(len(plaintexts))):
            xp = rp0[e[0]]
            xq = rq0[e[0]]
            for (rp, rq), d in zip(rows, e[1:]):
                xp = xp * rp[d] % p2
                xq = xq * rq[d] % q2
            g = 1 + (mpz(m) % n) * n        # (1+n)^m = 1 + m n  (mod n^2)
            xp = xp * g % p2
            xq = xq * g % q2
            out.append(xq + q2 * ((xp - xq) * qinv % p2))
        return out

    def _encrypt_workers(self, plaintexts, executor) -> list:
        return encrypt_on_workers(self, plaintexts, executor, self.nsquare, self.n)


class ObfuscatorStock:
    """Fresh obfuscators of one key (an :class:`Encryptor`'s), made ahead in the process that
    will encrypt with them (an executor worker, or the driver for the inline executor).

    Each is handed out once (:meth:`take` removes what it returns and nothing else keeps a
    reference); they live in this process's memory only (never encoded, sent or written);
    they go with the encryptor object (a new key is a new encryptor: the old stock is
    garbage). Thread-safe. Counters: ``made`` (by :meth:`fill`), ``taken``."""

    def __init__(self, encryptor: "Encryptor"):
        self._enc = encryptor
        self._items: deque = deque()
        self._lock = threading.Lock()
        self.made = 0
        self.taken = 0

    def __len__(self) -> int:
        return len(self._items)

    def fill(self, count: int, target: int | None = None) -> int:
        """Make up to ``count`` more (no more than ``target`` in stock); returns how many were made."""
        count = int(count) if target is None else min(int(count), int(target) - len(self._items))
        if count <= 0:
            return 0
        made = self._enc.obfuscators(count)
        with self._lock:
            self._items.extend(made)
            self.made += len(made)
        return len(made)

    def take(self, count: int) -> list:
        """Up to ``count`` obfuscators, removed from the stock (fewer when it runs short)."""
        with self._lock:
            k = min(int(count), len(self._items))
            out = [self._items.popleft() for _ in range(k)]
            self.taken += k
        return out

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def stats(self) -> dict:
        return {"stock": len(self._items), "made": self.made, "taken": self.taken}


class Decryptor:
    """CRT decryption of raw ciphertext integers (what phe's private key computes)."""

    scheme = "paillier"

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

    @property
    def cipher_modulus(self):
        return self.nsquare

    @staticmethod
    def _l(x, d):
        return (x - 1) // d

    def state(self) -> dict:
        return {"p": format(int(self.p), "x"), "q": format(int(self.q), "x")}

    @classmethod
    def from_state(cls, st: dict) -> "Decryptor":
        class _Priv:
            p = int(st["p"], 16)
            q = int(st["q"], 16)
        return cls(_Priv)

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

    def decrypt_signed(self, ciphertexts: Sequence, executor=None) -> list[int]:
        """Plaintexts mapped to the centred range ``(-n/2, n/2]``; big batches over ``executor``."""
        return signed_decrypt(self, ciphertexts, executor, int(self.n), self.nsquare, self.n)


def encrypt_on_workers(encryptor, plaintexts: Sequence[int], executor, cipher_modulus, n) -> list:
    """``plaintexts`` encrypted on ``executor``'s workers in about four chunks per worker (each
    worker rebuilds the encryptor from its ``state()``: the ``encrypt`` worker operation). Shared by
    both schemes' encryptors (Paillier: ciphertexts mod ``n^2``; OU: mod ``n``); ``n`` sizes the
    signed plaintexts sent."""
    executor.share("encryptor", encryptor, {"kind": "encryptor", "state": encryptor.state()})
    width = int_width(n) + 1
    w = int_width(cipher_modulus)
    n_chunks = min(len(plaintexts), 4 * executor.n_workers)
    step = -(-len(plaintexts) // n_chunks)
    replies = executor.map([({"op": "encrypt", "slot": "encryptor", "width": width},
                             [ints_to_bytes(plaintexts[i:i + step], width, signed=True)])
                            for i in range(0, len(plaintexts), step)])
    return [v for _, blobs in replies for v in bytes_to_ints(blobs[0], w)]


def signed_decrypt(decryptor, ciphertexts: Sequence, executor, plain_modulus: int, cipher_modulus,
                   n) -> list[int]:
    """``decryptor.decrypt`` (plaintexts in ``[0, plain_modulus)``) mapped to the centred range
    ``(-plain_modulus/2, plain_modulus/2]``; a batch big enough for :func:`crypto.parallel.on_workers`
    is cut into chunks decrypted on ``executor``'s workers (each rebuilds the decryptor from its
    ``state()``: the ``decrypt`` worker operation). Shared by both schemes' decryptors (Paillier:
    ``plain_modulus = n``, ciphertexts mod ``n^2``; OU: ``p``, mod ``n``); ``n`` sizes the signed
    values the workers send back."""
    if parallel.on_workers(executor, "decrypt", len(ciphertexts)):
        executor.share("decryptor", decryptor, {"kind": "decryptor", "state": decryptor.state()})
        w = int_width(cipher_modulus)
        width = int_width(n) + 1
        n_chunks = min(len(ciphertexts), 4 * executor.n_workers)
        step = -(-len(ciphertexts) // n_chunks)
        replies = executor.map([({"op": "decrypt", "slot": "decryptor"},
                                 [ints_to_bytes(ciphertexts[i:i + step], w)])
                                for i in range(0, len(ciphertexts), step)])
        return [int(v) for _, blobs in replies for v in bytes_to_ints(blobs[0], width, signed=True)]
    half = plain_modulus // 2
    return [m - plain_modulus if m > half else m for m in decryptor.decrypt(ciphertexts)]
