"""Hash alignment without a Python object per row (bounded driver memory, issue 11): the
vectorized intersection, positions and duplicate check against their naive set/dict twins."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import examples

from datasets.errors import InputError
from protocols import alignment


def naive_intersect(hash_sets):
    common = None
    for h in hash_sets.values():
        keys = set(alignment.hashes_to_keys(h))
        common = keys if common is None else common & keys
    return sorted(common)


def naive_positions(own, target):
    index = {k: i for i, k in enumerate(alignment.hashes_to_keys(own))}
    return [index.get(k, -1) for k in alignment.hashes_to_keys(target)]


# hashes drawn from a small pool of byte strings that share prefixes, so ties on the first word,
# bytes above 0x7f (sign) and zero bytes (padding) are all exercised
_pool = st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=30, unique=True)


def _rows(keys):
    return np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), 16) if keys else \
        np.zeros((0, 16), dtype=np.uint8)


@settings(max_examples=examples(80), deadline=None)
@given(pool=_pool, data=st.data())
def test_intersect_and_positions_equal_the_set_twins(pool, data):
    pool = pool + [p[:8] + bytes(8) for p in pool[:3]] + [bytes([255] * 8) + p[8:] for p in pool[:3]]
    pool = list(dict.fromkeys(pool))
    parts = {f"p{i}": _rows(data.draw(st.permutations(pool)).copy()[:data.draw(st.integers(1, len(pool)))])
             for i in range(data.draw(st.integers(1, 3)))}
    want = naive_intersect(parts)
    if not want:
        with pytest.raises(InputError, match="no sample id in common"):
            alignment.intersect(parts)
        return
    common = alignment.intersect(parts)
    assert common.dtype == np.uint8 and [bytes(r) for r in common] == want
    for name, h in parts.items():
        assert alignment.positions(h, common, "x").tolist() == naive_positions(h, common)
        again, rows = alignment.intersect(parts, rows_of=name)      # the rows from the same sort
        assert np.array_equal(again, common) and rows.tolist() == naive_positions(h, common)
        taken = dict(parts)
        again, rows = alignment.intersect(taken, rows_of=name, consume=True)
        assert taken == {} and np.array_equal(again, common) and rows.tolist() == naive_positions(h, common)


@settings(max_examples=examples(60), deadline=None)
@given(pool=_pool, data=st.data())
def test_positions_count_the_missing_rows_and_the_duplicates_are_counted(pool, data):
    own = _rows(pool[:data.draw(st.integers(0, len(pool)))])
    target = _rows(data.draw(st.lists(st.sampled_from(pool), max_size=20)))
    naive = naive_positions(own, target)
    missing = sum(1 for i in naive if i < 0)
    if missing:
        with pytest.raises(InputError, match=f"no row for {missing} of the {len(target)}"):
            alignment.positions(own, target, "x")
    else:
        assert alignment.positions(own, target, "x").tolist() == naive
    rows = _rows(data.draw(st.lists(st.sampled_from(pool), max_size=20)))
    keys = alignment.hashes_to_keys(rows)
    dup = len(keys) - len(set(keys))
    if dup:
        with pytest.raises(InputError, match=f"has {dup} duplicate ids"):
            alignment.check_unique_hashes(rows, "x")
    else:
        alignment.check_unique_hashes(rows, "x")


def test_hashing_in_chunks_equals_hashing_at_once(monkeypatch):
    ids = np.arange(1000) * 3
    whole = alignment.hash_ids(ids, b"salt")
    monkeypatch.setattr(alignment, "HASH_CHUNK", 7)
    assert np.array_equal(alignment.hash_ids(ids, b"salt"), whole)
    assert alignment.hash_ids(ids[:0], b"salt").shape == (0, 16)


def test_lookups_in_chunks_equal_one_lookup(monkeypatch):
    rng = np.random.default_rng(3)
    own = rng.integers(0, 256, (500, 16), dtype=np.uint8)
    own[:40, :8] = own[40:80, :8]                        # equal first words: the second decides
    target = np.concatenate([own[rng.permutation(500)[:300]], rng.integers(0, 256, (50, 16), dtype=np.uint8),
                             own[:40, :8].repeat(2, axis=1)])
    whole = alignment.positions(own, target[:300], "x")
    common, rows = alignment.intersect({"a": own, "b": target}, rows_of="a")
    monkeypatch.setattr(alignment._Sorted, "FIND_CHUNK", 7)
    assert np.array_equal(alignment.positions(own, target[:300], "x"), whole)
    again, rows_again = alignment.intersect({"a": own, "b": target}, rows_of="a")
    assert np.array_equal(again, common) and np.array_equal(rows_again, rows) and len(common) == 300
