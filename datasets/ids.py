"""THE sample-id rule: how ids are written down before parties compare them.

Parties compare ids as text (hashed with a salt, or blinded for PSI). Every id goes through
:func:`canonical_id` first, in the CSV loader and in the alignment of every mode (``vfl
simulate``, ``vfl party``, the Python API), so two files agree on an id exactly when their
canonical texts are equal:

* surrounding whitespace is dropped;
* an integer written with a fractional part of zeros is the integer: ``"133.0"``,
  ``"133.00"`` and the float ``133.0`` are all ``"133"`` (``"-0.0"`` is ``"0"``);
* nothing else changes: ``"007"`` and ``"7"`` stay different ids (zero-padded codes), as do
  ``"1e3"`` and ``"1000"``, or ``"133.5"`` and ``"133"``.

A CSV id column whose canonical ids are all decimal integers is read as integers.
"""
from __future__ import annotations

import math
import re

import numpy as np

from datasets.errors import InputError

#: a canonical decimal integer: an optional "-", no leading zeros, at most 18 digits (fits int64)
INT_ID = r"-?(?:0|[1-9][0-9]{0,17})"
_ZERO_FRACTION = re.compile(rf"({INT_ID})\.0*")


def canonical_id(value) -> str:
    """The canonical text of one id (see the module docstring)."""
    if isinstance(value, (bool, np.bool_)):
        raise InputError(f"ids must be integers or strings, got the boolean {value!r}")
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if not math.isfinite(v):
            raise InputError("ids must not be NaN or infinite")
        return str(int(v)) if v == int(v) else repr(v)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = str(value).strip()
    m = _ZERO_FRACTION.fullmatch(text)
    if m is not None:
        text = m.group(1)
    return "0" if text == "-0" else text


def normalize_ids(ids) -> list[str]:
    """Canonical texts of many ids (a list, array or Series)."""
    arr = np.asarray(ids)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise InputError("ids must not be NaN or infinite")
        if np.all(arr == np.round(arr)) and np.all(np.abs(arr) < 2.0 ** 63):
            return [str(v) for v in arr.astype(np.int64).tolist()]
    if arr.dtype.kind in "iu":
        return [str(v) for v in arr.tolist()]
    return [canonical_id(v) for v in arr.tolist()]
