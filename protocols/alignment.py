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


#: ids normalized and hashed per chunk (the per-id Python strings of one chunk at a time)
HASH_CHUNK = 65_536


def hash_ids(ids, salt: bytes) -> np.ndarray:
    """``(n, 16)`` uint8 array of mmh3-128 hashes of ``salt + id``, filled a chunk of ids at a time."""
    n = len(ids)
    out = np.empty((n, 16), dtype=np.uint8)
    for start in range(0, n, HASH_CHUNK):
        keys = normalize_ids(ids[start:start + HASH_CHUNK])
        buf = b"".join(mmh3.hash_bytes(salt + k.encode("utf-8")) for k in keys)
        out[start:start + len(keys)] = np.frombuffer(buf, dtype=np.uint8).reshape(len(keys), 16)
    return out


def hashes_to_keys(hashes: np.ndarray) -> list[bytes]:
    h = _checked(hashes)
    return [bytes(row) for row in h]


def _checked(hashes) -> np.ndarray:
    h = np.ascontiguousarray(hashes, dtype=np.uint8)
    if h.ndim != 2 or h.shape[1] != 16:
        raise InputError(f"hashed ids must have shape (n, 16), got {h.shape}")
    return h


def _words(hashes) -> np.ndarray:
    """``(n, 2)`` uint64: each hash's bytes 0-7 and 8-15 read big-endian, so ordering the rows by
    (first, second) word is ordering the hashes as byte strings."""
    h = _checked(hashes)
    return h.view(">u8").reshape(len(h), 2).astype(np.uint64)


def _sort_words(w: np.ndarray) -> np.ndarray:
    """Row order of ``w`` by (first, second) word."""
    return np.lexsort((w[:, 1], w[:, 0]))


def _same_as_next(w_sorted: np.ndarray) -> np.ndarray:
    return (w_sorted[1:, 0] == w_sorted[:-1, 0]) & (w_sorted[1:, 1] == w_sorted[:-1, 1])


def check_unique(keys: list, party: str, what: str = "ids") -> None:
    """THE unique-id check: ``keys`` (hashed ids, or ids from :func:`normalize_ids`) of
    ``party`` must not repeat."""
    if len(set(keys)) != len(keys):
        _duplicates(len(keys) - len(set(keys)), party, what)


def check_unique_hashes(hashes, party: str, what: str = "ids") -> None:
    """:func:`check_unique` of an ``(n, 16)`` array of hashed ids, without a Python object per row."""
    w = _words(hashes)
    dup = int(_same_as_next(w[_sort_words(w)]).sum())
    if dup:
        _duplicates(dup, party, what)


def _duplicates(n: int, party: str, what: str) -> None:
    raise InputError(f"party {party!r} has {n} duplicate {what}; every sample id must appear once")


def intersect(hash_sets: dict[str, np.ndarray]) -> np.ndarray:
    """Intersection of every party's hashes, sorted by hash value; error if empty."""
    common = None
    for party, hashes in hash_sets.items():
        w = _words(hashes)
        w = w[_sort_words(w)]
        if _same_as_next(w).any():
            _duplicates(int(_same_as_next(w).sum()), party, "ids")
        if common is None:
            common = w
            continue
        both = np.concatenate([common, w])          # each side unique: a hash in both appears twice
        both = both[_sort_words(both)]
        common = both[:-1][_same_as_next(both)]
        del both
    if common is None or not len(common):
        raise InputError("the parties have no sample id in common: nothing to train on "
                         f"(rows per party: { {p: len(h) for p, h in hash_sets.items()} })")
    return np.ascontiguousarray(common.astype(">u8")).view(np.uint8).reshape(len(common), 16)


def positions(own_hashes: np.ndarray, target_hashes: np.ndarray, party: str) -> np.ndarray:
    """Row index in ``own_hashes`` of every hash of ``target_hashes`` (error if one is missing).
    ``own_hashes`` are unique (checked by the caller); vectorized: one sort of both sets."""
    own, target = _words(own_hashes), _words(target_hashes)
    n_own = len(own)
    both = np.concatenate([own, target])
    # equal hashes: the own row first (the flag), so each target row follows the own row it matches
    flag = np.concatenate([np.zeros(n_own, dtype=np.int8), np.ones(len(target), dtype=np.int8)])
    order = np.lexsort((flag, both[:, 1], both[:, 0]))
    del flag
    is_own = order < n_own
    last_own = np.maximum.accumulate(np.where(is_own, np.arange(len(order)), -1))
    tpos = np.flatnonzero(~is_own)
    prev = last_own[tpos]
    found = prev >= 0
    cand = np.where(found, order[np.maximum(prev, 0)], 0)
    tidx = order[tpos] - n_own
    if n_own:
        found &= (own[cand, 0] == target[tidx, 0]) & (own[cand, 1] == target[tidx, 1])
    missing = int(len(target) - found.sum())
    if missing:
        raise InputError(f"party {party!r} has no row for {missing} of the {len(target_hashes)} "
                         "requested sample ids")
    out = np.empty(len(target), dtype=np.int64)
    out[tidx] = cand
    return out
