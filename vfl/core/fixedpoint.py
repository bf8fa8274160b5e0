"""Fixed-point encoding of gradients and hessians (the learner core hands integers to whoever encrypts).

A real value ``x`` is encoded as the integer ``round(x * 2**precision_bits)``.
All parties then work on exact integers, so a histogram summed under
encryption decodes to exactly the value the same sums give in plaintext.
"""
from __future__ import annotations

import numpy as np

from datasets.errors import InputError

_FLOAT_EXACT = 2.0 ** 53


def encode_fixed(values, precision_bits: int) -> np.ndarray:
    """Encode float values as int64 fixed-point integers (exact rounding, overflow checked)."""
    x = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise InputError("cannot encode NaN or infinite gradient values")
    scaled = np.rint(np.ldexp(x, precision_bits))
    if scaled.size and np.max(np.abs(scaled)) >= _FLOAT_EXACT:
        raise OverflowError(
            f"value {np.max(np.abs(x)):.6g} does not fit a fixed-point encoding with "
            f"{precision_bits} fractional bits (|x| must stay below 2**{53 - precision_bits})")
    return scaled.astype(np.int64)


def decode_fixed(ints, precision_bits: int) -> np.ndarray:
    """Decode fixed-point integers (Python ints or an int array) to float64."""
    arr = np.asarray(ints)
    if arr.dtype == object:
        return np.array([float(v) for v in arr.ravel()], dtype=np.float64).reshape(arr.shape) \
            / float(2 ** precision_bits)
    return np.ldexp(arr.astype(np.float64), -precision_bits)

