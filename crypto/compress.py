"""Ciphertext compression: many packed bin sums in one ciphertext.

A passive party shifts and adds ``per`` sums (each a signed-digit value of
``shift_bits`` bits, see :mod:`crypto.packing`) into one value with Horner's
rule; under encryption a shift by ``w`` bits is ``c^(2^w) mod n^2`` and an
addition is a multiplication. The key holder then decrypts ``per`` times fewer
ciphertexts and splits the signed-digit stream back into sums.
"""
from __future__ import annotations

from typing import Sequence

import gmpy2

from crypto.packing import split_digits


def compress(values: Sequence, shift_bits: int, per: int, modulus=None) -> list:
    """Group ``values`` by ``per`` (last group may be shorter); first value ends lowest."""
    out = []
    if modulus is None:
        for start in range(0, len(values), per):
            chunk = values[start:start + per]
            acc = int(chunk[-1])
            for v in reversed(chunk[:-1]):
                acc = (acc << shift_bits) + int(v)
            out.append(acc)
        return out
    m = gmpy2.mpz(modulus)
    shift = gmpy2.mpz(1) << shift_bits
    for start in range(0, len(values), per):
        chunk = values[start:start + per]
        acc = gmpy2.mpz(chunk[-1])
        for v in reversed(chunk[:-1]):
            acc = gmpy2.powmod(acc, shift, m) * v % m
        out.append(acc)
    return out


def decompress(plain_values: Sequence[int], shift_bits: int, per: int, total: int,
               digits_per_value: int = 1) -> list[int]:
    """Inverse of :func:`compress` on decrypted (centred) plaintexts: ``total`` values.

    Each value is itself a stream of ``digits_per_value`` digits of
    ``shift_bits // digits_per_value`` bits; it is returned re-assembled as an int.
    """
    digit_bits = shift_bits // digits_per_value
    out: list[int] = []
    for i, v in enumerate(plain_values):
        count = min(per, total - i * per)
        digits = split_digits(v, digit_bits, count * digits_per_value)
        for j in range(count):
            val = 0
            for d in reversed(digits[j * digits_per_value:(j + 1) * digits_per_value]):
                val = (val << digit_bits) + d
            out.append(val)
    if len(out) != total:
        raise ValueError(f"decompressed {len(out)} values, expected {total}")
    return out
