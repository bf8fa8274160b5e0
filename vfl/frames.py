"""Turning one party's DataFrame into ids, a float feature matrix and labels,
with errors that name the party, the file and the column."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from vfl.errors import InputError


class PartyData(NamedTuple):
    ids: np.ndarray
    X: np.ndarray
    feature_names: list[str]
    y: np.ndarray | None = None


def _where(party: str, source: str | None) -> str:
    return f"party {party!r}" + (f" (file {source})" if source else "")


def party_data(frame, party: str, id_col: str, label_col: str | None = None,
               source: str | None = None, require_features: bool = True) -> PartyData:
    where = _where(party, source)
    if not isinstance(frame, pd.DataFrame):
        raise InputError(f"{where}: data must be a pandas DataFrame, got {type(frame).__name__}")
    cols = [str(c) for c in frame.columns]
    if len(set(cols)) != len(cols):
        dup = sorted({c for c in cols if cols.count(c) > 1})
        raise InputError(f"{where}: duplicate column name(s) {dup}")
    if id_col not in cols:
        raise InputError(f"{where}: id column {id_col!r} not found (columns: {cols[:10]}"
                         f"{' ...' if len(cols) > 10 else ''})")
    if label_col is not None and label_col not in cols:
        raise InputError(f"{where}: label column {label_col!r} not found (columns: {cols[:10]}"
                         f"{' ...' if len(cols) > 10 else ''})")
    frame = frame.copy()
    frame.columns = cols
    ids = frame[id_col].to_numpy()
    if pd.isna(frame[id_col]).any():
        raise InputError(f"{where}: id column {id_col!r} has {int(pd.isna(frame[id_col]).sum())} empty values")
    names = [c for c in cols if c not in (id_col, label_col)]
    if require_features and not names:
        raise InputError(f"{where} has no feature columns (besides id {id_col!r}"
                         f"{f' and label {label_col!r}' if label_col else ''})")
    for c in names:
        s = frame[c]
        if not (pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s)):
            bad = s[pd.to_numeric(s, errors="coerce").isna() & s.notna()]
            example = bad.iloc[0] if len(bad) else s.iloc[0]
            raise InputError(f"{where}: feature column {c!r} is not numeric (e.g. value {example!r})")
    X = frame[names].to_numpy(dtype=np.float64) if names else np.zeros((len(frame), 0))
    if np.isinf(X).any():
        col = names[int(np.argwhere(np.isinf(X))[0, 1])]
        raise InputError(f"{where}: feature column {col!r} contains infinite values")
    y = None
    if label_col is not None:
        s = frame[label_col]
        if not (pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s)):
            y = s.to_numpy()
        else:
            y = s.to_numpy(dtype=np.float64)
    return PartyData(ids, X, names, y)


def feature_matrix(frame, party, id_col, label_col=None, source=None, require_features=True):
    """``(ids, X, feature_names)`` of a party's frame (see :func:`party_data`)."""
    d = party_data(frame, party, id_col, label_col, source, require_features)
    return d.ids, d.X, d.feature_names
