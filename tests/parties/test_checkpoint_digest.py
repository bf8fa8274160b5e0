"""The checkpoint's fingerprint of the aligned training data is computed a chunk of ids at a time
(bounded driver memory, issue 11) and equals the digest of every id joined at once."""
from __future__ import annotations

import hashlib
import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from parties import checkpoint
from protocols import alignment


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 40), chunk=st.integers(1, 9), text=st.booleans())
def test_the_chunked_data_digest_is_the_digest_of_all_ids_joined(n, chunk, text):
    ids = np.array([f"id-{i}" for i in range(n)], dtype=object) if text else np.arange(n) * 7
    X, y = np.arange(n * 2, dtype=float).reshape(n, 2), np.arange(n, dtype=float)
    whole = hashlib.sha256(json.dumps(["a", "b"]).encode())
    whole.update("\x00".join(alignment.normalize_ids(ids)).encode())
    whole.update(X.tobytes())
    whole.update(y.tobytes())
    saved = checkpoint._DIGEST_CHUNK
    checkpoint._DIGEST_CHUNK = chunk
    try:
        assert checkpoint.data_digest(ids, X, y, ["a", "b"]) == whole.hexdigest()
    finally:
        checkpoint._DIGEST_CHUNK = saved


def test_the_digest_of_x_rows_hashed_by_chunks_equals_the_digest_of_the_copy():
    rng = np.random.default_rng(3)
    X, rows = rng.normal(size=(50, 3)), rng.permutation(50)[:37]
    y, ids = rng.random(37), np.arange(37)
    saved = checkpoint._DIGEST_CHUNK
    checkpoint._DIGEST_CHUNK = 4
    try:
        assert checkpoint.data_digest(ids, X, y, ["a"], rows) == checkpoint.data_digest(ids, X[rows], y, ["a"])
        assert checkpoint.data_digest(ids, X, y, ["a"], rows[::-1]) != checkpoint.data_digest(ids, X[rows], y, ["a"])
    finally:
        checkpoint._DIGEST_CHUNK = saved
