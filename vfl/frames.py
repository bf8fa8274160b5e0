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
               source: str | None = None, require_features: bool = True,
               allow_text_label: bool = False) -> PartyData:
    """``allow_text_label``: the label may hold strings (class names); ``y`` is then an
    object array (missing labels as None), else float64."""
    from datasets.frames import PartyFrame, validate_party_frame

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
