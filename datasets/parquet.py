"""Reading party data from Parquet: one file or a directory of files (optional extra ``[parquet]``).

A party's table may be one Parquet file or a directory of Parquet files (as written by Spark,
Dask or ``pyarrow.dataset``): every regular file of the directory whose name does not start with
``.`` or ``_`` (``_SUCCESS``, ``_metadata``, ``.crc`` files are skipped) must be a Parquet file,
and all of them must have the same columns with the same types, in the same order. Files are read
in natural name order (``part.2`` before ``part.10``), row groups in file order, so a table cut
into numbered files keeps its row order.

The columns of the table are the files' physical columns; the pandas index columns
``__index_level_N__`` (an unnamed index written with ``index=True``) are dropped, so write frames
with ``df.to_parquet(path, index=False)`` or make the id a real column first.

This module reads; :mod:`datasets.loaders` turns what it reads into validated
:class:`datasets.frames.PartyFrame` objects with the same rules and messages as a CSV file
(:func:`datasets.loaders.read_party_table`, :func:`datasets.loaders.iter_party_batches`).
:func:`read_parquet_piece` reads one file (or one row group of it) given its path: the function
a worker process runs to read its own part of the table.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd

from datasets.errors import InputError

__all__ = ["PARQUET_MAGIC", "is_parquet", "parquet_files", "party_schema", "parquet_pieces",
           "read_parquet_piece", "iter_parquet_frames", "read_parquet_frame", "ParquetSchema",
           "check_party_columns"]

PARQUET_MAGIC = b"PAR1"
_INDEX_COLUMN = re.compile(r"__index_level_\d+__")


def _party(name: str | None) -> str:
    return f" (party {name!r})" if name else ""


def _pq():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("reading Parquet files needs pyarrow: pip install '.[parquet]'") from None
    return pq


def is_parquet(path) -> bool:
    """True for a directory (a table of Parquet files) or a file starting with Parquet's magic bytes."""
    p = Path(path)
    if p.is_dir():
        return True
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == PARQUET_MAGIC
    except OSError:
        return False


def _natural_key(name: str):
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def parquet_files(path, name: str | None = None) -> list[Path]:
    """The Parquet files of a table: ``[path]`` for a file, the directory's data files in natural
    name order for a directory. Raises :class:`InputError` naming the path for a missing path, an
    empty directory, a subdirectory (hive partitions are not read) or a file that is not Parquet."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"file {str(p)!r}{_party(name)} does not exist")
    if not p.is_dir():
        if not is_parquet(p):
            raise InputError(f"file {str(p)!r}{_party(name)} is not a Parquet file (no PAR1 magic bytes)")
        return [p]
    try:
        entries = sorted(os.scandir(p), key=lambda e: _natural_key(e.name))
    except OSError as exc:
        raise InputError(f"cannot read directory {str(p)!r}{_party(name)}: {exc.strerror or exc}") from None
    files = []
    for entry in entries:
        if entry.name.startswith((".", "_")):
            continue
        f = Path(entry.path)
        if entry.is_dir():
            raise InputError(f"directory {str(p)!r}{_party(name)} holds a subdirectory {entry.name!r}: give one "
                             f"directory of Parquet files (partitioned datasets are not read)")
        if not is_parquet(f):
            raise InputError(f"file {str(f)!r}{_party(name)} in the Parquet directory {str(p)!r} is not a "
                             f"Parquet file (no PAR1 magic bytes)")
        files.append(f)
    if not files:
        raise InputError(f"directory {str(p)!r}{_party(name)} holds no Parquet files")
    return files


def _open(file: Path, name: str | None):
    pq = _pq()
    try:
        return pq.ParquetFile(file)
    except OSError as exc:
        raise InputError(f"cannot read Parquet file {str(file)!r}{_party(name)}: {exc.strerror or exc}") from None
    except Exception as exc:     # pyarrow.ArrowInvalid and friends: a corrupt or truncated file
        raise InputError(f"cannot read Parquet file {str(file)!r}{_party(name)}: {exc}") from None


class ParquetSchema:
    """The agreed schema of a table: its files, columns (in order), Arrow types and row counts."""

    def __init__(self, files: list[Path], columns: list[str], types: dict, rows: list[int], row_groups: list[int],
                 index_name_hint: dict):
        self.files, self.columns, self.types = files, columns, types
        self.rows, self.row_groups = rows, row_groups
        self.index_names = index_name_hint      # file -> names of a pandas index kept only as metadata

    @property
    def n_rows(self) -> int:
        return sum(self.rows)


def _pandas_index_names(schema) -> list[str]:
    """Names of a pandas RangeIndex stored only in the metadata (lost as a column)."""
    meta = schema.metadata or {}
    raw = meta.get(b"pandas")
    if not raw:
        return []
    try:
        info = json.loads(raw)
        return [c.get("name") for c in info.get("index_columns", []) if isinstance(c, dict) and c.get("name")]
    except (ValueError, AttributeError):
        return []


def party_schema(path, name: str | None = None) -> ParquetSchema:
    """Open every file of the table and check that their schemas agree (same column names, types
    and order); raise :class:`InputError` naming the first file that differs and how."""
    files = parquet_files(path, name)
    first_cols = first_types = None
    rows, groups, hints = [], [], {}
    for f in files:
        pf = _open(f, name)
        schema = pf.schema_arrow
        cols = [c for c in schema.names if not _INDEX_COLUMN.fullmatch(c)]
        types = {c: schema.field(c).type for c in cols} if len(set(cols)) == len(cols) else None
        if types is None:
            dups = sorted({c for c in cols if cols.count(c) > 1})
            raise InputError(f"Parquet file {str(f)!r}{_party(name)} has duplicated column names: {dups}")
        if first_cols is None:
            first_cols, first_types, first_file = cols, types, f
        elif cols != first_cols or any(not types[c].equals(first_types[c]) for c in cols):
            raise InputError(f"Parquet file {str(f)!r}{_party(name)} does not match the schema of "
                             f"{str(first_file)!r}: {_schema_difference(first_cols, first_types, cols, types)}")
        rows.append(pf.metadata.num_rows)
        groups.append(pf.metadata.num_row_groups)
        hints[f] = _pandas_index_names(schema)
    return ParquetSchema(files, first_cols, first_types, rows, groups, hints)


def _schema_difference(cols_a, types_a, cols_b, types_b) -> str:
    missing = [c for c in cols_a if c not in cols_b]
    extra = [c for c in cols_b if c not in cols_a]
    if missing or extra:
        return f"columns missing {missing}, unexpected {extra}"
    retyped = [f"{c!r} is {types_b[c]} here but {types_a[c]} there"
               for c in cols_a if not types_a[c].equals(types_b[c])]
    if retyped:
        return "; ".join(retyped)
    return f"the columns are in another order ({cols_b} instead of {cols_a})"


def parquet_pieces(path, name: str | None = None) -> list[tuple[str, int, int]]:
    """``(file, row group, rows)`` of every row group of the table in table order: the units a
    worker reads with :func:`read_parquet_piece` (schemas checked)."""
    schema = party_schema(path, name)
    out = []
    for f in schema.files:
        meta = _open(f, name).metadata
        out.extend((str(f), g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
    return out


def _to_pandas(table) -> pd.DataFrame:
    """An Arrow table as a DataFrame, pandas metadata ignored; a bool column with nulls and an
    all-null column become float64 (NaN), as their CSV equivalents read."""
    return _convert([table])


def _convert(holder: list) -> pd.DataFrame:
    """:func:`_to_pandas` of the one table in ``holder``, taken out of it: when the caller keeps no
    other reference, each Arrow column is freed as soon as it is converted (``self_destruct``), so
    the table and its frame are not both held whole (bounded memory while a driver reads)."""
    import pyarrow as pa

    table = holder.pop()
    keep = [c for c in table.column_names if not _INDEX_COLUMN.fullmatch(c)]
    table = table.select(keep)
    for i, field in enumerate(table.schema):
        if pa.types.is_null(field.type) or (pa.types.is_boolean(field.type) and table.column(i).null_count):
            table = table.set_column(i, field.name, table.column(i).cast(pa.float64()))
    return table.to_pandas(ignore_metadata=True, self_destruct=True, split_blocks=True)


def read_parquet_piece(file, name: str | None = None, row_group: int | None = None,
                       columns: list[str] | None = None) -> pd.DataFrame:
    """One Parquet file (or one of its row groups) as a DataFrame, unvalidated: the read a worker
    runs on its own piece. Errors are :class:`InputError` naming the file."""
    f = Path(file)
    pf = _open(f, name)
    try:
        if row_group is None:
            table = pf.read(columns=columns)
        else:
            if not 0 <= row_group < pf.metadata.num_row_groups:
                raise InputError(f"Parquet file {str(f)!r}{_party(name)} has no row group {row_group}")
            table = pf.read_row_group(row_group, columns=columns)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"cannot read Parquet file {str(f)!r}{_party(name)}: {exc}") from None
    return _to_pandas(table)


def iter_parquet_frames(schema: ParquetSchema, name: str | None, batch_rows: int,
                        columns: list[str] | None = None):
    """``(file, first row of the batch in that file, DataFrame)`` of at most ``batch_rows`` rows each,
    in table order; reads one batch at a time."""
    for f in schema.files:
        pf = _open(f, name)
        start = 0
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
                frame = _to_pandas(_table_of(batch))
                yield f, start, frame
                start += len(frame)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"cannot read Parquet file {str(f)!r}{_party(name)}: {exc}") from None


def _table_of(batch):
    import pyarrow as pa

    return pa.Table.from_batches([batch])


def read_parquet_frame(schema: ParquetSchema, name: str | None, columns: list[str] | None = None) -> pd.DataFrame:
    """The whole table as one DataFrame (files concatenated in table order)."""
    import pyarrow as pa

    tables = []
    for f in schema.files:
        try:
            tables.append(_open(f, name).read(columns=columns))
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"cannot read Parquet file {str(f)!r}{_party(name)}: {exc}") from None
    holder = [pa.concat_tables(tables) if len(tables) > 1 else tables[0]]
    del tables
    frame = _convert(holder)
    pa.default_memory_pool().release_unused()     # once per whole-table read: what the pool kept
    return frame


def check_party_columns(schema: ParquetSchema, name: str, id_col: str, label_col: str | None,
                        allow_text_label: bool, source: str, categorical=()) -> None:
    """The checks of :func:`datasets.frames.validate_party_frame` that the schema alone decides
    (columns present, Arrow types allowed), before any row is read; same wording."""
    import pyarrow as pa

    where = f"party {name!r} (file {source!r})"
    shown = ", ".join(repr(c) for c in schema.columns[:10]) + (
        f", ... ({len(schema.columns)} in total)" if len(schema.columns) > 10 else "")
    if id_col not in schema.columns:
        hint = next((f"; in {str(f)!r} it is the pandas index, kept only as metadata: write the file with "
                     f"df.reset_index().to_parquet(path, index=False)"
                     for f, names in schema.index_names.items() if id_col in names), "")
        raise InputError(f"{where}: id column {id_col!r} not found; columns are [{shown}]{hint}")
    if label_col is not None:
        if label_col == id_col:
            raise InputError(f"{where}: the label column and the id column are both {id_col!r}")
        if label_col not in schema.columns:
            raise InputError(f"{where}: label column {label_col!r} not found; columns are [{shown}]")
    t = schema.types[id_col]
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or getattr(pa.types, "is_string_view", lambda _: False)(t)):
        raise InputError(f"{where}: id column {id_col!r} must hold integers or strings, got Parquet type {t}")
    for col in schema.columns:
        if col == id_col:
            continue
        t = schema.types[col]
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
            continue
        text = pa.types.is_string(t) or pa.types.is_large_string(t)
        if col == label_col and allow_text_label and text:
            continue
        if col in categorical and col != label_col:     # a declared categorical column (text categories)
            continue
        what = "label column" if col == label_col else "feature column"
        raise InputError(f"{where}: {what} {col!r} is not numeric (Parquet type {t}); only bool, int and "
                         f"float values are allowed")
