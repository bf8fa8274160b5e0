"""The checkpoint's fingerprint of the aligned training data is computed a chunk of ids at a time
(bounded driver memory, issue 11) and equals the digest of every id joined at once; the features
enter row after row (checkpoints written before the layout field) or column after column (a table
read one column at a time is fingerprinted without its whole matrix)."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import ColumnReader, examples

from parties import checkpoint
from protocols import alignment


@settings(max_examples=examples(25), deadline=None)
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
        assert checkpoint.data_digest(ids, X, y, ["a", "b"], layout="rows") == whole.hexdigest()
        by_columns = hashlib.sha256(json.dumps(["a", "b"]).encode())
        by_columns.update("\x00".join(alignment.normalize_ids(ids)).encode())
        by_columns.update(X.T.tobytes())         # column 0, then column 1
        by_columns.update(y.tobytes())
        assert checkpoint.data_digest(ids, X, y, ["a", "b"]) == by_columns.hexdigest()
        if n > 1:
            assert by_columns.hexdigest() != whole.hexdigest()
    finally:
        checkpoint._DIGEST_CHUNK = saved


@settings(max_examples=examples(25), deadline=None)
@given(n=st.integers(1, 30), f=st.integers(1, 4), chunk=st.integers(1, 7), seed=st.integers(0, 2**16),
       layout=st.sampled_from(["rows", "columns"]))
def test_a_column_reader_has_the_digest_of_its_matrix(n, f, chunk, seed, layout):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, f))
    X[rng.random((n, f)) < 0.2] = np.nan
    rows = rng.permutation(n)[:max(1, n // 2)]
    ids, y = np.arange(len(rows)), rng.random(len(rows))
    saved = checkpoint._DIGEST_CHUNK
    checkpoint._DIGEST_CHUNK = chunk
    try:
        reader = ColumnReader(X)
        names = [f"x{j}" for j in range(f)]
        assert checkpoint.data_digest(ids, reader, y, names, rows, layout) == \
            checkpoint.data_digest(ids, X, y, names, rows, layout)
        if layout == "columns":
            assert reader.reads == list(range(f))      # each column read once, in order
    finally:
        checkpoint._DIGEST_CHUNK = saved


def test_the_digest_of_x_rows_hashed_by_chunks_equals_the_digest_of_the_copy():
    rng = np.random.default_rng(3)
    X, rows = rng.normal(size=(50, 3)), rng.permutation(50)[:37]
    y, ids = rng.random(37), np.arange(37)
    saved = checkpoint._DIGEST_CHUNK
    checkpoint._DIGEST_CHUNK = 4
    try:
        for layout in checkpoint.DIGEST_LAYOUTS:
            copy = checkpoint.data_digest(ids, X[rows], y, ["a"], layout=layout)
            assert checkpoint.data_digest(ids, X, y, ["a"], rows, layout) == copy
            assert checkpoint.data_digest(ids, X, y, ["a"], rows[::-1], layout) != copy
        with pytest.raises(ValueError, match="digest layout 'diagonal'"):
            checkpoint.data_digest(ids, X, y, ["a"], rows, "diagonal")
    finally:
        checkpoint._DIGEST_CHUNK = saved


@settings(max_examples=examples(30), deadline=None)
@given(n=st.integers(0, 50), k=st.integers(1, 3), chunk=st.sampled_from([3, 6, 24, 3 << 20]),
       seed=st.integers(0, 2**16), with_raw=st.booleans())
def test_a_saved_checkpoint_streams_its_raw_scores_into_the_file_json_dumps_writes(tmp_path_factory, n, k, chunk,
                                                                                  seed, with_raw):
    """Checkpoint.save hashes and writes the raw scores' base64 a piece at a time: the file is the
    one json.dumps of the whole dict gives, and it loads back (content hash checked) bit for bit."""
    from vfl.core.model import content_hash
    raw = np.random.default_rng(seed).normal(size=(n, k)) if with_raw else None
    ck = checkpoint.Checkpoint("a", ["b"], "m1", "00ff", {"max_depth": 3}, n, "d" * 64, [], raw, {"b": 0},
                               history={"train": {"auc": [0.5]}})
    want = ck.to_dict()
    want["content_hash"] = content_hash(want)
    path = tmp_path_factory.mktemp("ck") / "checkpoint.json"
    saved = checkpoint._SAVE_CHUNK
    checkpoint._SAVE_CHUNK = chunk
    try:
        ck.save(path)
    finally:
        checkpoint._SAVE_CHUNK = saved
    assert path.read_text() == json.dumps(want, indent=None)
    back = checkpoint.Checkpoint.load(path)
    assert (back.raw is None) == (raw is None)
    if raw is not None:
        assert back.raw.tobytes() == raw.tobytes()
