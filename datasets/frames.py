"""One party's slice of a vertically partitioned data set, and its validation.

A :class:`PartyFrame` is what one party of a vertical federated learning job
holds: a table whose rows are samples keyed by an id column, with the party's
own feature columns and -- for the active party only -- the label.

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
           "party_data", "feature_matrix", "categorical_columns", "MAX_CATEGORIES"]

# How many offending values / column names a message shows at most.
_MAX_SHOWN = 5
# A categorical column with more distinct values than this is refused (an id, or a numeric column).
MAX_CATEGORIES = 10_000


@dataclass(eq=False)  # comparing DataFrames with == is ambiguous; identity equality
class PartyFrame:
    """The data one party holds.

    Attributes:
        name: party name, e.g. ``"active"``, ``"passive1"``.
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
    """``party 'active' (file '/x/active.csv')`` -- the prefix of every error message."""
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
    if what == "feature column":
        msg += (" (a column of numbers and text: if it holds categories, declare it categorical, "
                f"e.g. --categorical {col})")
    raise InputError(msg)


def _is_missing(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _is_text_column(series: pd.Series) -> bool:
    """A pandas ``category`` column, or a string/object column none of whose values is a number
    (``"12"`` counts as a number: a numeric column with a typo is an error, not categories)."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        return True
    if _is_allowed_numeric(series.dtype) or not (ptypes.is_string_dtype(series.dtype)
                                                 or ptypes.is_object_dtype(series.dtype)):
        return False
    values = [v for v in pd.unique(series.to_numpy(dtype=object)) if not _is_missing(v)]
    if not values or not all(isinstance(v, str) for v in values):
        return False
    for v in values:
        try:
            float(v)
            return False
        except ValueError:
            pass
    return True


def categorical_columns(pf: PartyFrame, declared=None) -> list[str]:
    """The categorical feature columns of a party's frame, in frame order: the ``declared`` ones
    (each must be a feature column) and every text or pandas ``category`` column."""
    features = pf.feature_names
    declared = [] if declared is None else ([declared] if isinstance(declared, str) else list(declared))
    unknown = [c for c in declared if c not in features]
    if unknown:
        raise InputError(f"{describe_party(pf)}: categorical column(s) {_show(unknown)} are not feature "
                         f"columns; feature columns are [{_show(features, 10)}]")
    return [c for c in features if c in declared or _is_text_column(pf.frame[c])]


def _category_key(v):
    return (0, float(v), "") if isinstance(v, (int, float, bool)) else (1, 0.0, str(v))


def _vocabulary(pf: PartyFrame, col) -> list:
    """The sorted distinct non-missing values of a categorical column, as plain Python values."""
    series = pf.frame[col]
    if isinstance(series.dtype, pd.CategoricalDtype):
        series = series.astype(object)
    values = {_plain(v) for v in pd.unique(series.to_numpy(dtype=object)) if not _is_missing(v)}
    values = {int(v) if isinstance(v, float) and v.is_integer() else v for v in values}
    if len(values) > MAX_CATEGORIES:
        raise InputError(f"{describe_party(pf)}: categorical column {col!r} has {len(values)} distinct "
                         f"values, more than the {MAX_CATEGORIES} allowed (is it an id or a numeric column? "
                         "bucket it or leave it numeric)")
    return sorted(values, key=_category_key)


def _encode_categories(series: pd.Series, vocabulary: list) -> np.ndarray:
    """Category codes: the position in ``vocabulary``, -1 for a value not in it, NaN for missing."""
    index = {(_category_key(v)[0], v): i for i, v in enumerate(vocabulary)}
    values = series.astype(object).to_numpy(dtype=object) if isinstance(series.dtype, pd.CategoricalDtype) \
        else series.to_numpy(dtype=object)
    inverse, distinct = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=True)
    codes = np.empty(len(distinct) + 1, dtype=np.float64)
    codes[-1] = np.nan                                  # factorize's -1: missing
    for i, v in enumerate(distinct):
        if _is_missing(v):
            codes[i] = np.nan
            continue
        v = _plain(v)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        codes[i] = index.get((_category_key(v)[0], v), -1)
    return codes[inverse]


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


def validate_party_frame(pf: PartyFrame, require_features: bool, allow_text_label: bool = False,
                         categorical=None, weight_col: str | None = None) -> None:
    """Check the structure of one party's frame; raise :class:`InputError` on any problem.

    Rules: the frame is a DataFrame with unique column names; the id column
    exists, has no missing or duplicated ids and holds ints or strings; the
    label column (if ``label_col`` is set) exists, differs from the id column
    and is numeric; every feature column is bool/int/float (NaN allowed, inf
    not); with ``require_features`` there is at least one feature column.
    With ``allow_text_label`` the label may also hold strings (class names of a
    multiclass task; the objective's own label check decides later). Categorical columns
    (``categorical``, declared, and every text or ``category`` column: see
    :func:`categorical_columns`) may hold any values.
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
    if weight_col is not None and weight_col in features:     # sample weights, not a feature
        features = [c for c in features if c != weight_col]
        check_weight_column(pf, weight_col)
    cats = set(categorical_columns(pf, categorical))
    for col in features:
        if col in cats:
            _vocabulary(pf, col)        # refuses too many categories
            continue
        _checked_feature(pf, col)
    if require_features and not features:
        raise InputError(
            f"{where}: no feature columns (columns are [{_show(frame.columns, 10)}])"
        )


def check_feature_column(pf: PartyFrame, col) -> np.ndarray:
    """A numeric feature column (bool/int/float, no inf) as float64, missing values NaN; an
    :class:`InputError` naming the party, file, column and rows otherwise."""
    values = _checked_feature(pf, col)
    return _to_float(pf.frame[col]) if values is None else values


def check_weight_column(pf: PartyFrame, col) -> None:
    """A column of sample weights: numbers, each finite (no NaN, no inf: every row needs a
    weight; 0 drops a row). The errors say "weight column" and what a weight may be (the feature
    wording would suggest NaN or a categorical declaration, neither of which a weight can be)."""
    _check_numeric_column(pf, col, "weight column")
    values = _to_float(pf.frame[col])
    bad = ~np.isfinite(values)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise InputError(
            f"{describe_party(pf)}: weight column {col!r} has {int(bad.sum())} missing or infinite values "
            f"(rows {_show(rows)}); every row needs a finite weight >= 0 (0 leaves the row out)")


def _checked_feature(pf: PartyFrame, col) -> np.ndarray | None:
    """The checks of :func:`check_feature_column`; the float64 values when they had to be made
    (a float column, checked for inf), None for a bool or int column (it cannot hold inf)."""
    _check_numeric_column(pf, col, "feature column")
    dtype = pf.frame[col].dtype
    if ptypes.is_bool_dtype(dtype) or ptypes.is_integer_dtype(dtype):
        return None
    values = _to_float(pf.frame[col])
    inf = np.isinf(values)
    n_inf = int(inf.sum())
    if n_inf:
        rows = np.flatnonzero(inf)
        raise InputError(
            f"{describe_party(pf)}: feature column {col!r} has {n_inf} infinite values (rows {_show(rows)}); "
            f"use NaN for missing values"
        )
    return values


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
    categories: dict | None = None      # {categorical column: its vocabulary}; X holds the codes


def _where(party: str, source: str | None) -> str:
    return f"party {party!r}" + (f" (file {source})" if source else "")


def party_data(frame, party: str, id_col: str, label_col: str | None = None,
               source: str | None = None, require_features: bool = True,
               allow_text_label: bool = False, categorical=None, categories: dict | None = None,
               consume: bool = False) -> PartyData:
    """``allow_text_label``: the label may hold strings (class names); ``y`` is then an
    object array (missing labels as None), else float64.

    ``consume``: the caller hands ``frame`` over; each column is removed from it once converted,
    so the frame and the arrays made of it are never both whole in memory (the frame is left
    with its id column only).

    Categorical columns (``categorical``: declared column names; text and pandas ``category``
    columns always) are encoded as category codes: their position in the column's vocabulary,
    -1 for a value not in it, NaN for missing. ``categories``: the vocabularies to use
    (``{column: [values]}``, e.g. the training data's, for new rows to predict on); the columns
    named there are categorical too. Without it each vocabulary is the column's sorted distinct
    values. ``PartyData.categories`` holds the vocabularies used."""
    if not isinstance(frame, pd.DataFrame):
        raise InputError(f"{_where(party, source)}: data must be a pandas DataFrame, got {type(frame).__name__}")
    declared = [] if categorical is None else ([categorical] if isinstance(categorical, str) else list(categorical))
    names = [c for c in frame.columns if c not in (id_col, label_col)]
    declared += [c for c in (categories or {}) if c in names and c not in declared]
    pf = PartyFrame(party, frame, id_col, label_col, source)
    validate_party_frame(pf, require_features, allow_text_label, declared)
    ids = frame[id_col].to_numpy()
    cats = categorical_columns(pf, declared)
    if categories is not None:      # new rows of a trained model: its categorical columns, no others
        extra = [c for c in cats if c not in categories]
        if extra:
            raise InputError(f"{_where(party, source)}: feature column(s) {_show(extra)} hold text, but the "
                             "model was trained on them as numeric columns")
    vocab = {c: (list(categories[c]) if categories and c in categories else _vocabulary(pf, c)) for c in cats}
    numeric = [c for c in names if c not in vocab]
    take = frame.pop if consume else frame.__getitem__
    # column-major: filling a column touches only its own pages (a row-major fill touches every page
    # of X at the first column, while the frame still holds all of its own)
    X = np.zeros((len(frame), len(names)), order="F")
    for c in numeric:           # a column at a time: no second rows x features copy
        X[:, names.index(c)] = take(c).to_numpy(dtype=np.float64, na_value=np.nan)
    for c in cats:
        X[:, names.index(c)] = _encode_categories(take(c), vocab[c])
    y = None
    if label_col is not None:
        col = take(label_col)
        numeric = pd.api.types.is_numeric_dtype(col.dtype) or pd.api.types.is_bool_dtype(col.dtype)
        if allow_text_label and not numeric:
            y = np.array([None if v is pd.NA or (isinstance(v, float) and v != v) else v
                          for v in col.to_numpy(dtype=object)], dtype=object)
        else:
            y = col.to_numpy(dtype=np.float64, na_value=np.nan)
    return PartyData(ids, X, names, y, vocab)


def feature_matrix(frame, party, id_col, label_col=None, source=None, require_features=True):
    """``(ids, X, feature_names)`` of a party's frame (see :func:`party_data`)."""
    d = party_data(frame, party, id_col, label_col, source, require_features)
    return d.ids, d.X, d.feature_names
