"""One party's slice of a vertically partitioned data set, and its validation.

A :class:`PartyFrame` is what one party of a vertical federated learning job
holds: a table whose rows are samples keyed by an id column, with the party's
own feature columns and -- for the active (guest) party only -- the label.

:func:`validate_party_frame` checks the structural rules every party frame
must satisfy and raises :class:`datasets.errors.InputError` with a message that
names the party, the file it came from and the offending column, so that the
user never sees a raw pandas/numpy traceback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd
from pandas.api import types as ptypes

from datasets.errors import InputError

__all__ = ["PartyFrame", "PartyData", "validate_party_frame", "check_binary_labels", "describe_party",
           "party_data", "feature_matrix"]

# How many offending values / column names a message shows at most.
_MAX_SHOWN = 5


@dataclass(eq=False)  # comparing DataFrames with == is ambiguous; identity equality
class PartyFrame:
    """The data one party holds.

    Attributes:
        name: party name, e.g. ``"guest"``, ``"host1"``.
        frame: id column, the label column (active party only) and feature columns.
        id_col: name of the sample-id column (ints or strings).
        label_col: name of the label column; only set for the label-holding party.
        source: file the frame was read from (used in error messages).
    """

    name: str
    frame: pd.DataFrame
    id_col: str
    label_col: str | None = None
    source: str | None = None

    @property
    def feature_names(self) -> list[str]:
        """All columns except the id and the label column, in frame order."""
        skip = {self.id_col}
        if self.label_col is not None:
            skip.add(self.label_col)
        return [c for c in self.frame.columns if c not in skip]

    @property
    def n_rows(self) -> int:
        return int(len(self.frame))

    @property
    def ids(self) -> np.ndarray:
        """The id column as a numpy array."""
        return self.frame[self.id_col].to_numpy()

    def __repr__(self) -> str:  # keep reprs short: frames can be huge
        label = f", label_col={self.label_col!r}" if self.label_col is not None else ""
        src = f", source={self.source!r}" if self.source is not None else ""
        return (
            f"PartyFrame(name={self.name!r}, rows={len(self.frame)}, "
            f"features={len(self.feature_names)}, id_col={self.id_col!r}{label}{src})"
        )


def describe_party(pf: PartyFrame) -> str:
    """``party 'guest' (file '/x/guest.csv')`` -- the prefix of every error message."""
    where = f"party {pf.name!r}"
    if pf.source is not None:
        where += f" (file {str(pf.source)!r})"
    return where


def _show(values, limit: int = _MAX_SHOWN) -> str:
    values = list(values)
    shown = ", ".join(repr(_plain(v)) for v in values[:limit])
    if len(values) > limit:
        shown += f", ... ({len(values)} in total)"
    return shown


def _plain(v):
    """numpy scalars -> python scalars, so messages read ``1.5`` not ``np.float64(1.5)``."""
    if isinstance(v, np.generic):
        return v.item()
    return v


def _is_allowed_numeric(dtype) -> bool:
    """bool / int / float (numpy or pandas nullable); not complex, not categorical, not datetime."""
    if ptypes.is_bool_dtype(dtype):
        return True
    return bool(ptypes.is_numeric_dtype(dtype)) and not ptypes.is_complex_dtype(dtype)


def _example_non_numeric(series: pd.Series) -> tuple[object, int] | None:
    """First value (and its row position) of a non-numeric column that is not a number."""
    values = series.to_numpy(dtype=object)
    first_non_null = None
    for pos, v in enumerate(values):
        if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
            continue
        if first_non_null is None:
            first_non_null = (v, pos)
        if isinstance(v, (bool, np.bool_)):
            continue
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, complex):
            continue
        if isinstance(v, str):
            try:
                float(v)
                continue
            except ValueError:
                pass
        return v, pos
    return first_non_null


def _to_float(series: pd.Series) -> np.ndarray:
    """A numeric (bool/int/float, possibly nullable) column as float64, NA -> NaN."""
    return series.to_numpy(dtype=np.float64, na_value=np.nan)


def _check_numeric_column(pf: PartyFrame, col, what: str) -> None:
    series = pf.frame[col]
    if _is_allowed_numeric(series.dtype):
        return
    example = _example_non_numeric(series)
    msg = (
        f"{describe_party(pf)}: {what} {col!r} is not numeric (dtype {series.dtype}); "
        f"only bool, int and float values are allowed"
    )
    if example is not None:
        value, pos = example
        msg += f", e.g. value {_plain(value)!r} in row {pos}"
    raise InputError(msg)


def _check_ids(pf: PartyFrame) -> None:
    ids = pf.frame[pf.id_col]
    where = describe_party(pf)
    n_missing = int(ids.isna().sum())
    if n_missing:
        rows = np.flatnonzero(ids.isna().to_numpy())
        raise InputError(
            f"{where}: id column {pf.id_col!r} has {n_missing} missing ids (rows {_show(rows)})"
        )
    dtype = ids.dtype
    if ptypes.is_bool_dtype(dtype) or not (
        ptypes.is_integer_dtype(dtype) or ptypes.is_string_dtype(dtype) or ptypes.is_object_dtype(dtype)
    ):
        raise InputError(
            f"{where}: id column {pf.id_col!r} must hold integers or strings, "
            f"got dtype {dtype} (e.g. {_plain(ids.iloc[0]) if len(ids) else None!r})"
        )
    if ptypes.is_object_dtype(dtype) and len(ids):
        kinds = {type(v) for v in ids.to_numpy(dtype=object)}
        if not (kinds <= {str} or all(issubclass(k, (int, np.integer)) and k is not bool for k in kinds)):
            names = sorted(k.__name__ for k in kinds)
            raise InputError(
                f"{where}: id column {pf.id_col!r} must hold only integers or only strings, "
                f"found values of types {names}"
            )
    dup = ids.duplicated()
    if dup.any():
        dup_values = pd.unique(ids[dup])
        raise InputError(
            f"{where}: id column {pf.id_col!r} has {int(dup.sum())} duplicated ids: {_show(dup_values)}"
        )


def _check_text_label(pf: PartyFrame) -> bool:
    """True when the label column holds class names (strings, NA allowed); error when it mixes
    strings with other values. False for any other (e.g. numeric) column."""
    series = pf.frame[pf.label_col]
    if _is_allowed_numeric(series.dtype):
        return False
    if not (ptypes.is_string_dtype(series.dtype) or ptypes.is_object_dtype(series.dtype)):
        return False
    values = [v for v in series.to_numpy(dtype=object)
              if not (v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)))]
    if not values or not all(isinstance(v, str) for v in values):
        if any(isinstance(v, str) for v in values):
            kinds = sorted({type(v).__name__ for v in values})
            raise InputError(f"{describe_party(pf)}: label column {pf.label_col!r} mixes strings and other "
                             f"values (types {kinds}); use one kind of label")
        return False
    return True


def validate_party_frame(pf: PartyFrame, require_features: bool, allow_text_label: bool = False) -> None:
    """Check the structure of one party's frame; raise :class:`InputError` on any problem.

    Rules: the frame is a DataFrame with unique column names; the id column
    exists, has no missing or duplicated ids and holds ints or strings; the
    label column (if ``label_col`` is set) exists, differs from the id column
    and is numeric; every feature column is bool/int/float (NaN allowed, inf
    not); with ``require_features`` there is at least one feature column.
    With ``allow_text_label`` the label may also hold strings (class names of a
    multiclass task; the objective's own label check decides later).
    """
    where = describe_party(pf)
    frame = pf.frame
    if not isinstance(frame, pd.DataFrame):
        raise InputError(f"{where}: expected a pandas DataFrame, got {type(frame).__name__}")
    if not frame.columns.is_unique:
        dups = pd.unique(frame.columns[frame.columns.duplicated()])
        raise InputError(f"{where}: duplicated column names: {_show(dups)}")
    if pf.id_col not in frame.columns:
        raise InputError(
            f"{where}: id column {pf.id_col!r} not found; columns are [{_show(frame.columns, 10)}]"
        )
    if pf.label_col is not None:
        if pf.label_col == pf.id_col:
            raise InputError(f"{where}: the label column and the id column are both {pf.id_col!r}")
        if pf.label_col not in frame.columns:
            raise InputError(
                f"{where}: label column {pf.label_col!r} not found; "
                f"columns are [{_show(frame.columns, 10)}]"
            )
    _check_ids(pf)
    if pf.label_col is not None and not (allow_text_label and _check_text_label(pf)):
        _check_numeric_column(pf, pf.label_col, "label column")

    features = pf.feature_names
    for col in features:
        _check_numeric_column(pf, col, "feature column")
        dtype = frame[col].dtype
        if ptypes.is_bool_dtype(dtype) or ptypes.is_integer_dtype(dtype):
            continue  # cannot hold inf
        values = _to_float(frame[col])
        n_inf = int(np.isinf(values).sum())
        if n_inf:
            rows = np.flatnonzero(np.isinf(values))
            raise InputError(
                f"{where}: feature column {col!r} has {n_inf} infinite values (rows {_show(rows)}); "
                f"use NaN for missing values"
            )
    if require_features and not features:
        raise InputError(
            f"{where}: no feature columns (columns are [{_show(frame.columns, 10)}])"
        )


def check_binary_labels(pf: PartyFrame) -> np.ndarray:
    """Check that the label column holds only 0 and 1; return the labels as an int64 array.

    Raises :class:`InputError` naming the party, column and offending values
    (NaN/inf labels are reported separately, with their count).
    """
    where = describe_party(pf)
    if pf.label_col is None:
        raise InputError(f"{where} holds no label column (label_col is not set)")
    if pf.label_col not in pf.frame.columns:
        raise InputError(f"{where}: label column {pf.label_col!r} not found")
    col = pf.label_col
    series = pf.frame[col]
    if not _is_allowed_numeric(series.dtype):
        example = _example_non_numeric(series)
        shown = f", e.g. {_plain(example[0])!r}" if example is not None else ""
        raise InputError(
            f"label column {col!r} of party {pf.name!r} is not numeric (dtype {series.dtype}){shown}; "
            f"binary labels must be 0 or 1"
        )
    values = _to_float(series)
    bad_finite = ~np.isfinite(values)
    n_nonfinite = int(bad_finite.sum())
    if n_nonfinite:
        raise InputError(
            f"label column {col!r} of party {pf.name!r} has {n_nonfinite} NaN/inf values"
            + (f" (file {str(pf.source)!r})" if pf.source else "")
        )
    bad = (values != 0.0) & (values != 1.0)
    if bad.any():
        offending = np.unique(values[bad])
        shown = [int(v) if float(v).is_integer() else float(v) for v in offending]
        raise InputError(
            f"label column {col!r} of party {pf.name!r} must hold only 0 and 1 for a binary task; "
            f"{int(bad.sum())} rows hold other values: {_show(shown)}"
            + (f" (file {str(pf.source)!r})" if pf.source else "")
        )
    return values.astype(np.int64)


class PartyData(NamedTuple):
    ids: np.ndarray
    X: np.ndarray
    feature_names: list[str]
    y: np.ndarray | None = None


def _where(party: str, source: str | None) -> str:
    return f"party {party!r}" + (f" (file {source})" if source else "")


def party_data(frame, party: str, id_col: str, label_col: str | None = None,
               source: str | None = None, require_features: bool = True,
               allow_text_label: bool = False) -> PartyData:
    """``allow_text_label``: the label may hold strings (class names); ``y`` is then an
    object array (missing labels as None), else float64."""
    if not isinstance(frame, pd.DataFrame):
        raise InputError(f"{_where(party, source)}: data must be a pandas DataFrame, got {type(frame).__name__}")
    validate_party_frame(PartyFrame(party, frame, id_col, label_col, source), require_features,
                         allow_text_label)
    ids = frame[id_col].to_numpy()
    names = [c for c in frame.columns if c not in (id_col, label_col)]
    X = frame[names].to_numpy(dtype=np.float64, na_value=np.nan) if names else np.zeros((len(frame), 0))
    y = None
    if label_col is not None:
        col = frame[label_col]
        numeric = pd.api.types.is_numeric_dtype(col.dtype) or pd.api.types.is_bool_dtype(col.dtype)
        if allow_text_label and not numeric:
            y = np.array([None if v is pd.NA or (isinstance(v, float) and v != v) else v
                          for v in col.to_numpy(dtype=object)], dtype=object)
        else:
            y = col.to_numpy(dtype=np.float64, na_value=np.nan)
    return PartyData(ids, X, names, y)


def feature_matrix(frame, party, id_col, label_col=None, source=None, require_features=True):
    """``(ids, X, feature_names)`` of a party's frame (see :func:`party_data`)."""
    d = party_data(frame, party, id_col, label_col, source, require_features)
    return d.ids, d.X, d.feature_names
