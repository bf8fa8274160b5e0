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


def normalized_chunks(ids, size: int | None = None):
    """:func:`normalize_ids` of ``ids`` a chunk of ``size`` (default :data:`HASH_CHUNK`) at a time:
    the Python strings of one chunk exist at once, never one per row of a large table."""
    size = HASH_CHUNK if size is None else int(size)
    for start in range(0, len(ids), size):
        yield normalize_ids(ids[start:start + size])


def hash_ids(ids, salt: bytes) -> np.ndarray:
    """``(n, 16)`` uint8 array of mmh3-128 hashes of ``salt + id``, filled a chunk of ids at a time."""
    out = np.empty((len(ids), 16), dtype=np.uint8)
    start = 0
    for keys in normalized_chunks(ids):
        buf = b"".join(mmh3.hash_bytes(salt + k.encode("utf-8")) for k in keys)
        out[start:start + len(keys)] = np.frombuffer(buf, dtype=np.uint8).reshape(len(keys), 16)
        start += len(keys)
    return out


def hashes_to_keys(hashes: np.ndarray) -> list[bytes]:
    h = _checked(hashes)
    return [bytes(row) for row in h]


def _checked(hashes) -> np.ndarray:
    h = np.ascontiguousarray(hashes, dtype=np.uint8)
    if h.ndim != 2 or h.shape[1] != 16:
        raise InputError(f"hashed ids must have shape (n, 16), got {h.shape}")
    return h


def _words(hashes) -> tuple[np.ndarray, np.ndarray]:
    """Each hash's bytes 0-7 and 8-15 read big-endian, as two uint64 vectors: ordering by
    (first, second) word is ordering the hashes as byte strings."""
    h = _checked(hashes)
    w = h.view(">u8").reshape(len(h), 2)
    return w[:, 0].astype(np.uint64), w[:, 1].astype(np.uint64)


class _Sorted:
    """Hashes sorted by value (``hi``, ``lo`` words), with each one's row (``order``); :meth:`find`
    looks hashes up by binary search (no Python object per row)."""

    def __init__(self, hashes):
        hi, lo = _words(hashes)
        self.order = np.lexsort((lo, hi))
        self.hi, self.lo = hi[self.order], lo[self.order]

    def __len__(self) -> int:
        return len(self.order)

    def duplicates(self) -> int:
        return int(((self.hi[1:] == self.hi[:-1]) & (self.lo[1:] == self.lo[:-1])).sum())

    #: hashes looked up per step: the searches' temporaries stay a few MB whatever the table's size
    FIND_CHUNK = 1 << 18

    def find(self, hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
        """Sorted position of every hash ``(hi, lo)`` (-1: absent); this set holds no duplicate."""
        out = np.full(len(hi), -1, dtype=np.int64)
        if not len(self) or not len(hi):
            return out
        for start in range(0, len(hi), self.FIND_CHUNK):
            stop = start + self.FIND_CHUNK
            self._find(hi[start:stop], lo[start:stop], out[start:stop])
        return out

    def _find(self, hi: np.ndarray, lo: np.ndarray, out: np.ndarray) -> None:
        left = np.searchsorted(self.hi, hi, side="left")
        right = np.searchsorted(self.hi, hi, side="right")
        one = right - left == 1         # the usual case: the first word alone decides
        pos = np.minimum(left, len(self) - 1)
        ok = one & (self.lo[pos] == lo)
        out[ok] = left[ok]
        for j in np.flatnonzero(right - left > 1):      # equal first words (rare): search the second
            a, b = int(left[j]), int(right[j])
            k = a + int(np.searchsorted(self.lo[a:b], lo[j]))
            if k < b and self.lo[k] == lo[j]:
                out[j] = k


def check_unique(keys: list, party: str, what: str = "ids") -> None:
    """THE unique-id check: ``keys`` (hashed ids, or ids from :func:`normalize_ids`) of
    ``party`` must not repeat."""
    if len(set(keys)) != len(keys):
        _duplicates(len(keys) - len(set(keys)), party, what)


def check_unique_hashes(hashes, party: str, what: str = "ids") -> "_Sorted":
    """:func:`check_unique` of an ``(n, 16)`` array of hashed ids, without a Python object per row;
    returns the sorted hashes (for :func:`positions`: sorted once)."""
    s = _Sorted(hashes)
    dup = s.duplicates()
    if dup:
        _duplicates(dup, party, what)
    return s


def find_rows(own: "_Sorted", target_hashes) -> np.ndarray:
    """The row (in the hashes ``own`` was made of, :func:`check_unique_hashes`) of every hash of
    ``target_hashes``; -1 where it is absent (online scoring: an applicant a party does not know)."""
    hi, lo = _words(target_hashes)
    pos = own.find(hi, lo)
    return np.where(pos >= 0, own.order[np.maximum(pos, 0)], -1) if len(own) else pos


def _duplicates(n: int, party: str, what: str) -> None:
    raise InputError(f"party {party!r} has {n} duplicate {what}; every sample id must appear once")


def intersect(hash_sets: dict[str, np.ndarray], rows_of: str | None = None, consume: bool = False):
    """Intersection of every party's hashes, sorted by hash value; error if empty. With
    ``rows_of`` (a party of ``hash_sets``): ``(intersection, that party's row of every common
    hash)``, what :func:`positions` gives, from the sort the intersection made anyway.
    ``consume``: take each party's hashes out of ``hash_sets`` once they are sorted (the dict ends
    empty), so a caller holding no other reference never has a party's hashes and their sorted
    copy in memory at once."""
    hi = lo = mine = None
    sizes = {p: len(h) for p, h in hash_sets.items()}
    for party in list(hash_sets):
        s = _Sorted(hash_sets.pop(party) if consume else hash_sets[party])
        dup = s.duplicates()
        if dup:
            _duplicates(dup, party, "ids")
        if party == rows_of:
            mine = s
        if hi is None:
            hi, lo = s.hi, s.lo
        else:                            # the common hashes stay sorted
            keep = s.find(hi, lo) >= 0
            hi, lo = hi[keep], lo[keep]
        del s
    if hi is None or not len(hi):
        raise InputError("the parties have no sample id in common: nothing to train on "
                         f"(rows per party: {sizes})")
    out = np.empty((len(hi), 2), dtype=">u8")
    out[:, 0], out[:, 1] = hi, lo
    common = out.view(np.uint8).reshape(len(hi), 16)
    if rows_of is None:
        return common
    if mine is None:
        raise ValueError(f"rows_of={rows_of!r} is not one of the parties {list(hash_sets)}")
    return common, mine.order[mine.find(hi, lo)]


def positions(own_hashes, target_hashes: np.ndarray, party: str) -> np.ndarray:
    """Row index in ``own_hashes`` of every hash of ``target_hashes`` (error if one is missing).
    ``own_hashes`` are unique (checked by the caller; or already sorted by
    :func:`check_unique_hashes`); binary search in the sorted own hashes."""
    own = own_hashes if isinstance(own_hashes, _Sorted) else _Sorted(own_hashes)
    target = _checked(target_hashes)
    pos = np.full(len(target), -1, dtype=np.int64)
    step = _Sorted.FIND_CHUNK
    for start in range(0, len(target), step):      # the target's words a chunk at a time
        hi, lo = _words(target[start:start + step])
        pos[start:start + step] = own.find(hi, lo)
    missing = int((pos < 0).sum())
    if missing:
        raise InputError(f"party {party!r} has no row for {missing} of the {len(target_hashes)} "
                         "requested sample ids")
    return own.order[pos]
