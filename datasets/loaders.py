"""Reading any party table, a CSV file or a Parquet table (a file or a directory of files): whole
(:func:`read_party_table`), one column at a time (:class:`DeferredColumns`), in batches of rows
(:func:`iter_party_batches`) or one Parquet piece (:func:`read_party_piece`), with the same checks.

Every problem is raised as :class:`datasets.errors.InputError` naming the file, party and column.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from pandas.api import types as ptypes

from datasets.errors import InputError
from datasets.ids import canonical_id

from . import parquet
from .csv_tables import (
    PathLike,
    _csv_chunks,
    _csv_columns,
    _ids_to_int_if_canonical,
    _party_label,
    declared_for,
    read_party_csv,
)
from .frames import PartyFrame, check_feature_column, validate_party_frame
from .split import _check_int

DEFAULT_BATCH_ROWS = 100_000


def read_party_table(path: PathLike, name: str, id_col: str, label_col: str | None = None,
                     allow_text_label: bool = False, categorical=None, weight_col: str | None = None) -> PartyFrame:
    """Read one party's table: a CSV file, a Parquet file or a directory of Parquet files.

    Parquet is recognised by content (a directory, or a file starting with ``PAR1``), anything else
    is read as CSV (:func:`read_party_csv`). A Parquet table gets the same validation and the same
    id rule as a CSV file (string ids that are all canonical integers become int64); every error
    is an :class:`InputError` naming the file (for a directory, the file at fault when one is) and
    the column.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"file {str(p)!r}{_party_label(name)} does not exist")
    if not parquet.is_parquet(p):
        return read_party_csv(p, name, id_col, label_col, allow_text_label=allow_text_label,
                              categorical=categorical, weight_col=weight_col)
    schema = _parquet_schema(p, name, id_col, label_col, allow_text_label, _declared_names(categorical, name))
    return _read_parquet_columns(p, schema, name, id_col, label_col, None, allow_text_label, categorical,
                                 weight_col=weight_col)


class DeferredColumns:
    """The feature columns of a Parquet table, read when the party asks for them (after the
    alignment): a driver then never holds its features and the alignment's hash sorts at once.
    :meth:`read_ids` and :meth:`read_column` check what they read as :func:`read_party_table` does.

    It is also a column reader (``shape``, :meth:`column`) for :mod:`vfl.core.binning`: binned and
    fingerprinted one column at a time, the features are never in memory whole."""

    def __init__(self, path: Path, schema, name: str, id_col: str, feature_names: list[str],
                 n_rows: int | None = None):
        self.path, self.schema, self.name, self.id_col = path, schema, name, id_col
        self.feature_names = list(feature_names)
        self.source = str(path)
        self.n_rows = n_rows

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, feature columns)``; the rows are known once the ids were read."""
        if self.n_rows is None:
            raise ValueError("the number of rows is known once the ids were read (read_ids)")
        return self.n_rows, len(self.feature_names)

    def column(self, j: int) -> np.ndarray:
        """Feature ``j`` (:meth:`read_column` of ``feature_names[j]``); its length is checked."""
        col = self.read_column(self.feature_names[j])
        if len(col) != self.shape[0]:
            raise InputError(f"party {self.name!r}: column {self.feature_names[j]!r} of {self.source} has "
                             f"{len(col)} rows, its ids {self.shape[0]}; was the file replaced during training?")
        return col

    def read_ids(self) -> np.ndarray:
        """The id column, normalised as :func:`read_party_table` does (the rows' order)."""
        ids = _read_parquet_columns(self.path, self.schema, self.name, self.id_col, None, [self.id_col],
                                    False).frame[self.id_col].to_numpy()
        self.n_rows = len(ids)
        return ids

    def read_column(self, col: str) -> np.ndarray:
        """One feature column as float64 (missing: NaN), checked; one column in memory at a time."""
        frame = parquet.read_parquet_frame(self.schema, self.name, columns=[col])
        pf = PartyFrame(name=self.name, frame=frame, id_col=self.id_col, label_col=None, source=self.source)
        try:
            return check_feature_column(pf, col)
        except InputError:
            if len(self.schema.files) > 1:    # name the file at fault and its own rows
                _validate_files_one_by_one(self.schema, pf, False, [self.id_col, col])
            raise


def read_party_table_deferred(path: PathLike, name: str, id_col: str, label_col: str | None, keep=(),
                              allow_text_label: bool = False, categorical=None, weight_col: str | None = None):
    """``(PartyFrame of the id, label and ``keep`` columns, DeferredColumns of every other column)``
    of a Parquet table whose feature columns are all numeric; None for a CSV file or a table with
    categorical columns (read those whole with :func:`read_party_table`). Every check the schema
    decides runs now; the feature values are checked when they are read."""
    p = Path(path)
    if not p.exists() or not parquet.is_parquet(p):
        return None
    declared = _declared_names(categorical, name)
    schema = _parquet_schema(p, name, id_col, label_col, allow_text_label, declared)
    head = [c for c in (id_col, label_col, *keep) if c is not None]
    features = [c for c in schema.columns if c not in head]
    if declared & set(features):
        return None
    pf = _read_parquet_columns(p, schema, name, id_col, label_col, head, allow_text_label,
                               weight_col=weight_col)
    return pf, DeferredColumns(p, schema, name, id_col, features, n_rows=len(pf.frame))


def _read_parquet_columns(p: Path, schema, name, id_col, label_col, columns, allow_text_label,
                          categorical=None, weight_col: str | None = None) -> PartyFrame:
    """``columns`` of the table (None: all), ids normalised, validated (the file at fault named)."""
    frame = parquet.read_parquet_frame(schema, name, columns=columns)
    frame[id_col] = _normalise_ids(frame[id_col], _ParquetIds(schema, name, p))
    pf = PartyFrame(name=name, frame=frame, id_col=id_col, label_col=label_col, source=str(p))
    try:
        validate_party_frame(pf, require_features=False, allow_text_label=allow_text_label,
                             categorical=declared_for(categorical, pf), weight_col=weight_col)
    except InputError:
        if len(schema.files) > 1:         # name the file at fault when the problem is within one file
            _validate_files_one_by_one(schema, pf, allow_text_label, columns)
        raise
    return pf


def _declared_names(categorical, party: str) -> set[str]:
    """Column names declared categorical for ``party`` (``COL`` or ``PARTY:COL``)."""
    out = set()
    for c in categorical or ():
        owner, sep, col = str(c).partition(":")
        if not sep:
            out.add(str(c))
        elif owner == party:
            out.add(col)
    return out


def _parquet_schema(p: Path, name, id_col, label_col, allow_text_label, categorical=()):
    schema = parquet.party_schema(p, name)
    parquet.check_party_columns(schema, name, id_col, label_col, allow_text_label, str(p), categorical)
    if schema.n_rows == 0:
        raise InputError(f"file {str(p)!r}{_party_label(name)} has a header but no data rows "
                         f"(its Parquet file(s) hold no rows)")
    return schema


class _ParquetIds:
    """Where ids came from, for the messages of :func:`_normalise_ids`."""

    def __init__(self, schema, name, path):
        self.schema, self.name, self.path = schema, name, path


def _normalise_ids(ids: pd.Series, where: _ParquetIds | None = None) -> pd.Series:
    """Integer ids as int64; text ids as :func:`_ids_to_int_if_canonical` (the CSV rule)."""
    if ptypes.is_integer_dtype(ids.dtype) and not ptypes.is_bool_dtype(ids.dtype):
        if ids.dtype == np.uint64 and len(ids) and int(ids.max()) > np.iinfo(np.int64).max:
            raise InputError(f"file {str(where.path)!r}{_party_label(where.name)}: id column {ids.name!r} holds "
                             f"integers above 2**63 - 1")
        return ids.astype(np.int64)
    return _ids_to_int_if_canonical(ids)


def _validate_files_one_by_one(schema, whole: PartyFrame, allow_text_label: bool, columns=None) -> None:
    """Re-run the validation file by file (only after the whole table failed): raise the first
    file's error, naming that file and its own row numbers."""
    for f in schema.files:
        frame = parquet.read_parquet_piece(f, whole.name, columns=columns)
        frame[whole.id_col] = _normalise_ids(frame[whole.id_col], _ParquetIds(schema, whole.name, f))
        validate_party_frame(PartyFrame(whole.name, frame, whole.id_col, whole.label_col, str(f)),
                             require_features=False, allow_text_label=allow_text_label)


def iter_party_batches(path: PathLike, name: str, id_col: str, label_col: str | None = None,
                       batch_rows: int = DEFAULT_BATCH_ROWS, allow_text_label: bool = False,
                       categorical=None):
    """The party's table (CSV, Parquet file or directory) as validated :class:`PartyFrame` batches
    of at most ``batch_rows`` rows, in file order, holding one batch in memory at a time.

    The id column is checked on the whole table first (missing and duplicated ids, and the CSV rule
    that decides whether text ids become integers), so the batches hold exactly the ids and values
    :func:`read_party_table` would; only the ids of the whole table are ever in memory together.
    A problem in a batch is reported with the file and the batch's first row.
    """
    batch_rows = _check_int(batch_rows, "batch_rows", 1)
    p = Path(path)
    if not p.exists():
        raise InputError(f"file {str(p)!r}{_party_label(name)} does not exist")
    if parquet.is_parquet(p):
        schema = _parquet_schema(p, name, id_col, label_col, allow_text_label, _declared_names(categorical, name))
        ids = parquet.read_parquet_frame(schema, name, columns=[id_col])[id_col]
        ids = _normalise_ids(ids, _ParquetIds(schema, name, p))
        chunks = ((str(f), start, frame) for f, start, frame in parquet.iter_parquet_frames(schema, name, batch_rows))
    else:
        if p.is_dir():
            raise InputError(f"{str(p)!r}{_party_label(name)} is a directory, expected a CSV file")
        _csv_columns(p, name, id_col, label_col)
        parts = [frame[id_col] for _, _, frame in _csv_chunks(p, name, id_col, max(batch_rows, 65536),
                                                              usecols=[id_col])]
        if not parts or sum(len(x) for x in parts) == 0:
            raise InputError(f"file {str(p)!r}{_party_label(name)} has a header but no data rows")
        ids = _ids_to_int_if_canonical(pd.concat(parts, ignore_index=True))
        chunks = _csv_chunks(p, name, id_col, batch_rows)
    validate_party_frame(PartyFrame(name, ids.to_frame(), id_col, None, str(p)), require_features=False)
    as_int = ids.dtype == np.int64
    del ids
    for source, start, frame in chunks:
        col = frame[id_col]
        if as_int:
            frame[id_col] = col.astype(np.int64) if ptypes.is_integer_dtype(col.dtype) else \
                pd.Series([int(canonical_id(v)) for v in col.tolist()], index=col.index, dtype=np.int64)
        elif ptypes.is_string_dtype(col.dtype):      # text ids as the whole table has them (the id rule)
            frame[id_col] = pd.Series([canonical_id(v) for v in col.tolist()], index=col.index,
                                      dtype=object).astype(col.dtype)
        pf = PartyFrame(name, frame.reset_index(drop=True), id_col, label_col, source)
        try:
            validate_party_frame(pf, require_features=False, allow_text_label=allow_text_label,
                                 categorical=declared_for(categorical, pf))
        except InputError as exc:
            raise InputError(f"{exc} (in the batch of data rows from row {start} of {source!r}; "
                             f"row numbers count from that row)") from None
        yield pf


def read_party_piece(file: PathLike, name: str, id_col: str, label_col: str | None = None,
                     row_group: int | None = None, int_ids: bool | None = None,
                     allow_text_label: bool = False) -> PartyFrame:
    """One Parquet file (or one row group of it) of a party's table as a validated
    :class:`PartyFrame`: what a worker runs on its own piece (see
    :func:`datasets.parquet.parquet_pieces`). The checks that need the whole table (duplicated ids
    across pieces, the text-id rule) are the caller's: ``int_ids`` says whether text ids become
    int64 (the decision :func:`iter_party_batches` takes on the whole id column; None: decide on
    this piece alone)."""
    frame = parquet.read_parquet_piece(file, name, row_group=row_group)
    if id_col in frame.columns:
        ids = frame[id_col]
        if int_ids is None:
            frame[id_col] = _normalise_ids(ids, _ParquetIds(None, name, file))
        elif int_ids and not ids.isna().any():
            try:
                frame[id_col] = ids.astype(np.int64) if ptypes.is_integer_dtype(ids.dtype) else \
                    ids.astype(str).astype(np.int64)
            except (ValueError, TypeError, OverflowError):
                raise InputError(f"file {str(file)!r}{_party_label(name)}: id column {id_col!r} does not hold "
                                 f"integers (int_ids=True)") from None
    pf = PartyFrame(name, frame, id_col, label_col, str(file))
    where = f" (in row group {row_group}; row numbers count from its first row)" if row_group is not None else ""
    try:
        validate_party_frame(pf, require_features=False, allow_text_label=allow_text_label)
    except InputError as exc:
        raise InputError(f"{exc}{where}") from None
    return pf
