"""Big integers as fixed-width big-endian bytes: the one integer codec of the toolkit.

Used by the worker-process frames (:mod:`crypto.executor`), the ciphertext fields of
protocol messages (:mod:`protocols.serialization`) and the key tables.
"""
from __future__ import annotations

from typing import Iterable

import gmpy2

_NATIVE_BYTES = hasattr(gmpy2.mpz, "to_bytes") and hasattr(gmpy2.mpz, "from_bytes")   # gmpy2 >= 2.2


def ints_to_bytes(values: Iterable, width: int, signed: bool = False) -> bytes:
    """Fixed-width big-endian bytes of (mpz or int) values."""
    if _NATIVE_BYTES:
        mpz = gmpy2.mpz
        return b"".join(mpz(v).to_bytes(width, "big", signed=signed) for v in values)
    return b"".join(int(v).to_bytes(width, "big", signed=signed) for v in values)


def bytes_to_ints(data, width: int, signed: bool = False) -> list:
    """Inverse of :func:`ints_to_bytes`, as ``mpz``."""
    mv = memoryview(data)
    if _NATIVE_BYTES:
        frm = gmpy2.mpz.from_bytes
        return [frm(mv[i:i + width], "big", signed=signed) for i in range(0, len(mv), width)]
    mpz, frm = gmpy2.mpz, int.from_bytes
    return [mpz(frm(mv[i:i + width], "big", signed=signed)) for i in range(0, len(mv), width)]


def int_width(modulus) -> int:
    return max(1, (int(modulus).bit_length() + 7) // 8)
