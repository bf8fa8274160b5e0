"""Reading one party's CSV file with every check: the header, row lengths, canonical
integer ids, the declared categorical columns; and the CSV reader's chunks and errors for batches.

Every problem is raised as :class:`datasets.errors.InputError` naming the file, party and column.
"""
from __future__ import annotations

import contextlib
import csv
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from pandas.api import types as ptypes

from datasets.errors import InputError
from datasets.ids import INT_ID, canonical_id

from .frames import PartyFrame, _show, validate_party_frame

PathLike = str | os.PathLike

# A canonical decimal integer id: no sign other than "-", no leading zeros, no spaces.
_INT_ID = INT_ID


def _party_label(name: str | None) -> str:
    return f" (party {name!r})" if name else ""


@contextlib.contextmanager
def _reading(path: Path, name: str | None, bad_csv):
    """Errors while reading ``path`` as CSV, as an :class:`InputError` naming the file (and party):
    not UTF-8, unreadable, or a :class:`csv.Error` worded by ``bad_csv(exc)``."""
    where = f"{str(path)!r}{_party_label(name)}"
    try:
        yield
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read {where}: not UTF-8 text ({exc.reason})") from None
    except csv.Error as exc:
        raise InputError(bad_csv(exc)) from None
    except OSError as exc:
        raise InputError(f"cannot read {where}: {exc.strerror or exc}") from None


#: a CSV header line longer than this is no header (it would be read whole into memory)
MAX_HEADER_BYTES = 1 << 20
_SCAN_BYTES = 1 << 20


def _check_text_file(path: Path, name: str | None) -> None:
    """Refuse, in constant memory, a file that cannot be a CSV table: a NUL byte anywhere (a binary
    or sparse file, a corrupted id; named by line and byte offset) or a first line longer than
    :data:`MAX_HEADER_BYTES` (issue 36, item 11: a 2 GB sparse file was read whole to be refused)."""
    where = f"{str(path)!r}{_party_label(name)}"
    line, offset, header_done = 1, 0, False
    with _reading(path, name, str):
        with open(path, "rb") as fh:
            while chunk := fh.read(_SCAN_BYTES):
                nul = chunk.find(b"\0")
                if nul >= 0:
                    line += chunk.count(b"\n", 0, nul)
                    raise InputError(f"{where} is not a CSV text file: a NUL byte at line {line}, byte offset "
                                     f"{offset + nul}")
                if not header_done:
                    header_done = b"\n" in chunk
                    if not header_done and offset + len(chunk) > MAX_HEADER_BYTES:
                        raise InputError(f"{where} is not a CSV table: its first line (the header) is longer than "
                                         f"{MAX_HEADER_BYTES} bytes")
                line += chunk.count(b"\n")
                offset += len(chunk)


def _read_header(path: Path, name: str | None) -> list[str]:
    _check_text_file(path, name)
    with _reading(path, name, lambda exc: f"cannot read {str(path)!r}{_party_label(name)}: bad CSV header ({exc})"):
        with open(path, newline="", encoding="utf-8-sig") as fh:
            header = next(csv.reader(fh), None)
    if header is None or not any(h.strip() for h in header):
        raise InputError(f"file {str(path)!r}{_party_label(name)} is empty (no CSV header)")
    seen, dups = set(), []
    for h in header:
        if h in seen and h not in dups:
            dups.append(h)
        seen.add(h)
    if dups:
        raise InputError(f"file {str(path)!r}{_party_label(name)} has duplicated column names: {_show(dups)}")
    return header


def _check_row_lengths(path: Path, name: str | None, n_columns: int) -> None:
    """Every data row has exactly the header's number of fields: a row with too few (a truncated
    last line) or too many is an error naming the file and the line (blank lines are skipped, as
    the parser does)."""
    with _reading(path, name, lambda exc: f"cannot parse CSV file {str(path)!r}{_party_label(name)}: {exc}"):
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            next(reader, None)
            for row in reader:
                if row and len(row) != n_columns:
                    few = len(row) < n_columns
                    raise InputError(
                        f"cannot parse CSV file {str(path)!r}{_party_label(name)}: line {reader.line_num} has "
                        f"{len(row)} field{'s' if len(row) != 1 else ''}: {'fewer' if few else 'more'} fields "
                        f"than the header has columns ({n_columns})"
                        + (" (a truncated row?)" if few else ""))


def _ids_to_int_if_canonical(series: pd.Series) -> pd.Series:
    """Ids read as text are written canonically (THE id rule, :mod:`datasets.ids`: ``"133.0"``
    is ``"133"``) and become int64 when every one is a canonical decimal integer.

    Ids like ``"007"`` stay strings, so two parties' ids are never silently made equal by a
    numeric conversion the rule does not make.
    """
    if series.isna().any() or not ptypes.is_string_dtype(series.dtype) or len(series) == 0:
        return series
    text = pd.Series([canonical_id(v) for v in series.tolist()], index=series.index, dtype=object,
                     name=series.name)
    if bool(text.str.fullmatch(_INT_ID).all()):
        return text.astype(np.int64)
    return text.astype(series.dtype)


def read_party_csv(path: PathLike, name: str, id_col: str, label_col: str | None = None,
                   allow_text_label: bool = False, categorical=None, weight_col: str | None = None) -> PartyFrame:
    """Read one party's CSV file (header row required) and validate it.

    The id column is read as text and turned into int64 when every id is a
    canonical integer (so ``"007"`` stays a string id). Feature columns must be
    numeric; empty cells are NaN. With ``allow_text_label`` the label may hold
    class names (strings). Raises :class:`InputError` naming the file
    for a missing, unreadable or empty file and for every validation problem.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"file {str(p)!r}{_party_label(name)} does not exist")
    if p.is_dir():
        raise InputError(f"{str(p)!r}{_party_label(name)} is a directory, expected a CSV file")
    header = _read_header(p, name)
    _check_row_lengths(p, name, len(header))
    dtype = {id_col: str} if id_col in header else None
    with _csv_reader_errors(p, name):
        frame = pd.read_csv(p, dtype=dtype, index_col=False, low_memory=False, encoding="utf-8-sig")
    if len(frame) == 0:
        raise InputError(f"file {str(p)!r}{_party_label(name)} has a header but no data rows")
    if id_col in frame.columns:
        frame[id_col] = _ids_to_int_if_canonical(frame[id_col])
    pf = PartyFrame(name=name, frame=frame, id_col=id_col, label_col=label_col, source=str(p))
    validate_party_frame(pf, require_features=False, allow_text_label=allow_text_label,
                         categorical=declared_for(categorical, pf), weight_col=weight_col)
    return pf


def declared_for(categorical, pf: PartyFrame) -> list[str]:
    """The columns of ``pf`` among ``categorical`` names (``COL``, or ``PARTY:COL`` for one party)."""
    out = []
    for c in categorical or ():
        party, sep, col = str(c).partition(":")
        if not sep:
            party, col = pf.name, c
        if party == pf.name and col in pf.feature_names and col not in out:
            out.append(col)
    return out


def _csv_reader_errors(p: Path, name: str | None):
    """Translate pandas' CSV errors into :class:`InputError` naming the file (a context manager)."""
    @contextlib.contextmanager
    def translate():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield
            except pd.errors.EmptyDataError:
                raise InputError(f"file {str(p)!r}{_party_label(name)} is empty") from None
            except pd.errors.ParserError as exc:
                msg = str(exc).strip().replace("Error tokenizing data. C error: ", "")
                raise InputError(f"cannot parse CSV file {str(p)!r}{_party_label(name)}: {msg}") from None
            except UnicodeDecodeError as exc:
                raise InputError(f"cannot read {str(p)!r}{_party_label(name)}: not UTF-8 text ({exc.reason})") \
                    from None
            except OSError as exc:
                raise InputError(f"cannot read {str(p)!r}{_party_label(name)}: {exc.strerror or exc}") from None
            except (ValueError, TypeError) as exc:
                raise InputError(f"cannot parse CSV file {str(p)!r}{_party_label(name)}: {exc}") from None
        for w in caught:
            if issubclass(w.category, pd.errors.ParserWarning):
                raise InputError(
                    f"cannot parse CSV file {str(p)!r}{_party_label(name)}: some rows have more fields "
                    f"than the header has columns ({w.message})"
                )
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    return translate()


def _csv_chunks(p: Path, name: str | None, id_col: str, batch_rows: int, usecols=None):
    """``(file, first data row, DataFrame)`` of at most ``batch_rows`` rows, ids as text."""
    with _csv_reader_errors(p, name):
        reader = pd.read_csv(p, dtype={id_col: str}, index_col=False, encoding="utf-8-sig",
                             chunksize=batch_rows, usecols=usecols)
    start = 0
    with reader:
        while True:
            with _csv_reader_errors(p, name):
                try:
                    frame = next(reader)
                except StopIteration:
                    return
            yield str(p), start, frame
            start += len(frame)


def _csv_columns(p: Path, name, id_col, label_col) -> list[str]:
    header = _read_header(p, name)
    where = f"party {name!r} (file {str(p)!r})"
    if id_col not in header:
        raise InputError(f"{where}: id column {id_col!r} not found; columns are [{_show(header, 10)}]")
    if label_col is not None:
        if label_col == id_col:
            raise InputError(f"{where}: the label column and the id column are both {id_col!r}")
        if label_col not in header:
            raise InputError(f"{where}: label column {label_col!r} not found; columns are [{_show(header, 10)}]")
    return header
