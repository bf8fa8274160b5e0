"""A party's Parquet table read piece by piece where it is needed (issue 11: bounded drivers).

:class:`PieceTable` is what a passive party's driver keeps of a Parquet file or directory
instead of the table: the id column (a numpy array), the feature names and the **piece plan**
(every row group: file, row group, first table row, rows). The feature values are read by
whoever needs some rows, one piece at a time (:func:`read_rows`): the workers holding a row
shard (:mod:`parties.shard_ops`) at training set-up, the driver for one prediction batch.

Only tables whose feature columns are all numeric (numbers, booleans, all-null) are read this
way; a table with text or declared categorical columns needs the whole column for its
vocabulary and is read whole (:func:`open_piece_table` returns None then).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from datasets import parquet
from datasets.csv_tables import _party_label
from datasets.errors import InputError
from datasets.frames import PartyFrame, validate_party_frame
from datasets.loaders import _normalise_ids, _parquet_schema, _ParquetIds, read_party_piece


def _numeric_type(t) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t) \
        or pa.types.is_decimal(t)


class PieceTable:
    """The id column and piece plan of a party's Parquet table (see the module doc).

    ``ids``: the table's ids in table order (int64, or objects for text ids); ``pieces``:
    ``(file, row group, first row, rows)`` in table order; ``starts``: first row of every piece
    and the row count at the end."""

    def __init__(self, path: str, name: str, id_col: str, feature_names: list[str], ids: np.ndarray,
                 int_ids: bool, pieces: list[tuple[str, int, int, int]]):
        self.path, self.name, self.id_col = str(path), str(name), id_col
        self.feature_names = list(feature_names)
        self.ids = ids
        self.int_ids = bool(int_ids)
        self.pieces = [(str(f), int(g), int(a), int(n)) for f, g, a, n in pieces]
        self.starts = np.array([a for _, _, a, _ in self.pieces] + [len(ids)], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.ids), len(self.feature_names)

    def spec(self, features: list[str] | None = None) -> dict:
        """What a worker needs to read rows (JSON): the pieces, the columns and the id rule."""
        return {"name": self.name, "id_col": self.id_col, "int_ids": self.int_ids,
                "features": list(self.feature_names if features is None else features),
                "pieces": [list(p) for p in self.pieces]}

    def with_features(self, features: list[str]) -> "PieceTable":
        """The same table reading only ``features`` (in that order)."""
        missing = [f for f in features if f not in self.feature_names]
        if missing:
            raise InputError(f"file {self.path!r}{_party_label(self.name)} lacks feature column(s) {missing}")
        return PieceTable(self.path, self.name, self.id_col, features, self.ids, self.int_ids, self.pieces)

    def read(self, rows) -> np.ndarray:
        """The features of table rows ``rows`` (in that order), reading only the pieces holding them."""
        return read_rows(self.spec(), np.asarray(rows, dtype=np.int64))

    def __getitem__(self, rows) -> np.ndarray:
        return self.read(rows)


def open_piece_table(path, name: str, id_col: str, categorical=None) -> PieceTable | None:
    """The :class:`PieceTable` of a Parquet file or directory whose features are all numeric (the
    schema and the whole id column checked as :func:`datasets.loaders.read_party_table` does:
    missing, duplicated or non-integer ids); None for CSV, or for a table with text or declared
    categorical features (read it whole)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"file {str(p)!r}{_party_label(name)} does not exist")
    if not parquet.is_parquet(p):
        return None
    declared = set([categorical] if isinstance(categorical, str) else (categorical or ()))
    schema = _parquet_schema(p, name, id_col, None, False, declared)
    features = [c for c in schema.columns if c != id_col]
    if declared or not all(_numeric_type(schema.types[c]) for c in features):
        return None
    ids = parquet.read_parquet_frame(schema, name, columns=[id_col])[id_col]
    text = not (pd.api.types.is_integer_dtype(ids.dtype) and not pd.api.types.is_bool_dtype(ids.dtype))
    ids = _normalise_ids(ids, _ParquetIds(schema, name, p))
    validate_party_frame(PartyFrame(name, ids.to_frame(), id_col, None, str(p)), require_features=False)
    int_ids = bool(text and pd.api.types.is_integer_dtype(ids.dtype))
    pieces, start = [], 0
    for f, g, n in parquet.parquet_pieces(p, name):
        pieces.append((f, g, start, n))
        start += n
    return PieceTable(str(p), name, id_col, features, ids.to_numpy(), int_ids, pieces)


def read_rows(spec: dict, rows: np.ndarray) -> np.ndarray:
    """Features (float64, ``len(rows) x features``) of table rows ``rows``, in that order, reading
    (and validating, :func:`datasets.loaders.read_party_piece`) only the pieces that hold them:
    where a worker reads its shard. ``spec``: :meth:`PieceTable.spec`."""
    pieces = spec["pieces"]
    starts = np.array([p[2] for p in pieces] + [pieces[-1][2] + pieces[-1][3]] if pieces else [0], dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    features = list(spec["features"])
    out = np.empty((len(rows), len(features)), dtype=np.float64)
    if not len(rows):
        return out
    if rows.min() < 0 or rows.max() >= starts[-1]:
        raise InputError(f"party {spec['name']!r}: row {int(rows.max())} is outside its {int(starts[-1])} rows")
    which = np.searchsorted(starts, rows, side="right") - 1
    order = np.argsort(which, kind="stable")
    bounds = np.searchsorted(which[order], np.arange(len(pieces) + 1))
    for i in np.unique(which).tolist():
        file, group, first, _ = pieces[i]
        pf = read_party_piece(file, spec["name"], spec["id_col"], row_group=int(group), int_ids=spec["int_ids"])
        missing = [c for c in features if c not in pf.frame.columns]
        if missing:
            raise InputError(f"file {file!r}{_party_label(spec['name'])} lacks feature column(s) {missing}")
        X = pf.frame[features].to_numpy(dtype=np.float64, na_value=np.nan)
        at = order[bounds[i]:bounds[i + 1]]
        out[at] = X[rows[at] - first]
    return out
