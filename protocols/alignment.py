"""Sample alignment by salted 128-bit mmh3 hashes of ids (VF-CART style).

Every party hashes ``salt || str(id)`` with MurmurHash3 x64-128 and shares only
the hashes. The intersection, sorted by hash value (an order that depends on
no party's row order), is the training set. Leakage: a party that knows the
salt can test guesses of ids against the hashes it receives; the PSI
alignment removes that.
"""
from __future__ import annotations

import secrets

import mmh3
import numpy as np

from datasets import ids as _ids
from datasets.errors import InputError


def new_salt() -> bytes:
    return secrets.token_bytes(16)


def normalize_ids(ids) -> list[str]:
    """Ids as their canonical texts: THE id rule of :mod:`datasets.ids` (``133.0`` -> ``"133"``,
    ``"133.0"`` -> ``"133"``, ``"007"`` stays ``"007"``)."""
    return _ids.normalize_ids(ids)


def hash_ids(ids, salt: bytes) -> np.ndarray:
    """``(n, 16)`` uint8 array of mmh3-128 hashes of ``salt + id``."""
    keys = normalize_ids(ids)
    buf = b"".join(mmh3.hash_bytes(salt + k.encode("utf-8")) for k in keys)
    return np.frombuffer(buf, dtype=np.uint8).reshape(len(keys), 16).copy()


def hashes_to_keys(hashes: np.ndarray) -> list[bytes]:
    h = np.ascontiguousarray(hashes, dtype=np.uint8)
    if h.ndim != 2 or h.shape[1] != 16:
        raise InputError(f"hashed ids must have shape (n, 16), got {h.shape}")
    return [bytes(row) for row in h]


def check_unique(keys: list, party: str, what: str = "ids") -> None:
    """THE unique-id check: ``keys`` (hashed ids, or ids from :func:`normalize_ids`) of
    ``party`` must not repeat."""
    if len(set(keys)) != len(keys):
        raise InputError(f"party {party!r} has {len(keys) - len(set(keys))} duplicate {what}; "
                         "every sample id must appear once")


def intersect(hash_sets: dict[str, np.ndarray]) -> np.ndarray:
    """Intersection of every party's hashes, sorted by hash value; error if empty."""
    common = None
    for party, hashes in hash_sets.items():
        keys = hashes_to_keys(hashes)
        check_unique(keys, party)
        common = set(keys) if common is None else common & set(keys)
    if not common:
        raise InputError("the parties have no sample id in common: nothing to train on "
                         f"(rows per party: { {p: len(h) for p, h in hash_sets.items()} })")
    ordered = sorted(common)
    return np.frombuffer(b"".join(ordered), dtype=np.uint8).reshape(len(ordered), 16).copy()


def positions(own_hashes: np.ndarray, target_hashes: np.ndarray, party: str) -> np.ndarray:
    """Row index in ``own_hashes`` of every hash of ``target_hashes`` (error if one is missing)."""
    index = {k: i for i, k in enumerate(hashes_to_keys(own_hashes))}
    out = np.empty(len(target_hashes), dtype=np.int64)
    missing = 0
    for j, k in enumerate(hashes_to_keys(target_hashes)):
        i = index.get(k)
        if i is None:
            missing += 1
            out[j] = -1
        else:
            out[j] = i
    if missing:
        raise InputError(f"party {party!r} has no row for {missing} of the {len(target_hashes)} "
                         "requested sample ids")
    return out
