"""Splitting data: columns among parties (vertical), rows into train/test."""

from __future__ import annotations

import math
import numbers

import numpy as np
import pandas as pd
from pandas.api import types as ptypes

from datasets.errors import InputError
from datasets.ids import normalize_ids

from .frames import PartyFrame, _plain, describe_party

__all__ = ["vertical_split", "train_test_split_parties", "party_names", "join_parties"]

# A label with at most this many distinct integer values counts as "classification-like".
_MAX_STRATIFY_CLASSES = 20


def party_names(n_parties: int) -> list[str]:
    """``["active", "passive1", "passive2", ...]`` for ``n_parties`` parties."""
    return ["active"] + [f"passive{i}" for i in range(1, n_parties)]


def _check_int(value, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        rng = f"{low}..{high}" if high is not None else f">= {low}"
        raise InputError(f"{name} must be in {rng}, got {value}")
    return value


def vertical_split(
    df: pd.DataFrame,
    id_col: str,
    label_col: str | None,
    n_parties: int,
    names: list[str] | None = None,
) -> list[PartyFrame]:
    """Split a joined table column-wise into ``n_parties`` party frames.

    The feature columns (all but id and label) are cut into ``n_parties``
    contiguous chunks as evenly as possible (earlier chunks get the extra
    column, like ``numpy.array_split``). Every party keeps the id column; the
    first party (the active party) also gets the label and the first chunk.
    """
    if not isinstance(df, pd.DataFrame):
        raise InputError(f"vertical_split expects a pandas DataFrame, got {type(df).__name__}")
    for col, what in ((id_col, "id column"), (label_col, "label column")):
        if col is not None and col not in df.columns:
            raise InputError(f"vertical_split: {what} {col!r} not found in the data")
    features = [c for c in df.columns if c != id_col and c != label_col]
    n_parties = _check_int(n_parties, "n_parties", 1, max(1, len(features)))
    if names is None:
        names = party_names(n_parties)
    elif len(names) != n_parties or len(set(names)) != n_parties:
        raise InputError(f"vertical_split: need {n_parties} distinct party names, got {names!r}")
    sizes = [len(features) // n_parties + (1 if i < len(features) % n_parties else 0) for i in range(n_parties)]
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    parties = []
    for i, name in enumerate(names):
        chunk = features[bounds[i] : bounds[i + 1]]
        if i == 0 and label_col is not None:
            cols = [id_col, label_col] + chunk
            lab = label_col
        else:
            cols = [id_col] + chunk
            lab = None
        parties.append(PartyFrame(name=name, frame=df[cols].copy(), id_col=id_col, label_col=lab))
    return parties


def _is_classification_like(labels: pd.Series) -> bool:
    dtype = labels.dtype
    if ptypes.is_bool_dtype(dtype):
        return True
    if not ptypes.is_numeric_dtype(dtype) or ptypes.is_complex_dtype(dtype):
        return False
    values = labels.to_numpy(dtype=np.float64, na_value=np.nan)
    if not np.all(np.isfinite(values)):
        return False
    if not np.all(values == np.round(values)):
        return False
    return len(np.unique(values)) <= _MAX_STRATIFY_CLASSES


def _stratified_test_mask(labels: np.ndarray, n_test: int, rng: np.random.Generator) -> np.ndarray | None:
    """Test-row mask with per-class proportions; None when stratification is impossible."""
    n = len(labels)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    k = len(classes)
    if counts.min() < 2 or n_test < k or n - n_test < k:
        return None
    exact = counts * (n_test / n)
    alloc = np.floor(exact).astype(int)
    remainder = n_test - int(alloc.sum())
    if remainder:
        # largest fractional parts first, ties broken randomly (deterministic by seed)
        frac = exact - alloc
        order = np.lexsort((rng.random(k), -frac))
        alloc[order[:remainder]] += 1
    # every class keeps at least one row on each side
    alloc = np.clip(alloc, 1, counts - 1)
    # the clip can move the total off by a few; repair on the largest classes
    diff = n_test - int(alloc.sum())
    for idx in np.argsort(-counts):
        if diff == 0:
            break
        if diff > 0 and alloc[idx] < counts[idx] - 1:
            step = min(diff, counts[idx] - 1 - alloc[idx])
            alloc[idx] += step
            diff -= step
        elif diff < 0 and alloc[idx] > 1:
            step = min(-diff, alloc[idx] - 1)
            alloc[idx] -= step
            diff += step
    mask = np.zeros(n, dtype=bool)
    for c in range(k):
        rows = np.flatnonzero(inverse == c)
        mask[rng.permutation(rows)[: alloc[c]]] = True
    return mask


def _subset(pf: PartyFrame, mask: np.ndarray) -> PartyFrame:
    frame = pf.frame.loc[mask].reset_index(drop=True)
    return PartyFrame(name=pf.name, frame=frame, id_col=pf.id_col, label_col=pf.label_col, source=pf.source)


def train_test_split_parties(
    parties: list[PartyFrame],
    test_size: float = 0.2,
    seed: int = 0,
    stratify: bool = True,
    what: str = "test_size",
) -> tuple[list[PartyFrame], list[PartyFrame]]:
    """Split every party's rows into train and test consistently, by the active party's ids.

    The active party is ``parties[0]`` and must hold the label. Its rows are split
    (stratified on the label when ``stratify`` and the label is
    classification-like: bool or integer-valued with at most 20 classes, each
    with at least 2 rows); every other party keeps the rows whose id falls in
    the active party's train / test ids, in its own row order. Rows of a passive party whose
    id the active party does not have go to neither side, since they can never be
    aligned. Each side keeps the active party's original row order.
    """
    if not isinstance(parties, (list, tuple)) or not parties:
        raise InputError("train_test_split_parties needs a non-empty list of PartyFrame")
    for pf in parties:
        if not isinstance(pf, PartyFrame):
            raise InputError(f"train_test_split_parties expects PartyFrame objects, got {type(pf).__name__}")
    if (
        isinstance(test_size, bool)
        or not isinstance(test_size, numbers.Real)
        or math.isnan(float(test_size))
        or not 0.0 < float(test_size) < 1.0
    ):
        raise InputError(f"{what} must be a fraction strictly between 0 and 1, got {test_size!r}")
    seed = _check_int(seed, "seed", 0)
    active = parties[0]
    if active.label_col is None:
        raise InputError(
            f"train_test_split_parties: the first party ({active.name!r}) must be the active party holding the label"
        )
    for pf in (active, *parties[1:]):
        if pf.id_col not in pf.frame.columns:
            raise InputError(f"{describe_party(pf)}: id column {pf.id_col!r} not found")
    if active.label_col not in active.frame.columns:
        raise InputError(f"{describe_party(active)}: label column {active.label_col!r} not found")

    n = len(active.frame)
    n_test = int(math.ceil(float(test_size) * n))
    if n_test < 1 or n - n_test < 1:
        raise InputError(
            f"{describe_party(active)}: cannot split {n} rows with test_size={test_size} "
            f"(train and test must both be non-empty)"
        )
    rng = np.random.default_rng(seed)
    labels = active.frame[active.label_col]
    mask = None
    if stratify and _is_classification_like(labels):
        mask = _stratified_test_mask(labels.to_numpy(dtype=np.float64), n_test, rng)
    if mask is None:
        mask = np.zeros(n, dtype=bool)
        mask[rng.permutation(n)[:n_test]] = True

    active_ids = active.frame[active.id_col]
    canon = np.asarray(normalize_ids(active_ids), dtype=object)     # THE id rule (datasets.ids)
    test_ids = canon[mask]
    train_ids = canon[~mask]
    train_parties = [_subset(active, ~mask)]
    test_parties = [_subset(active, mask)]
    for pf in parties[1:]:
        ids = pf.frame[pf.id_col]
        own = pd.Series(normalize_ids(ids), dtype=object)
        in_train = own.isin(train_ids).to_numpy()
        in_test = own.isin(test_ids).to_numpy()
        if not (in_train.any() or in_test.any()):
            example_a = _plain(active_ids.iloc[0]) if n else None
            example_h = _plain(ids.iloc[0]) if len(ids) else None
            raise InputError(
                f"{describe_party(pf)} shares no ids with {describe_party(active)} "
                f"(e.g. active party id {example_a!r} of dtype {active_ids.dtype}, "
                f"{pf.name} id {example_h!r} of dtype {ids.dtype})"
            )
        train_parties.append(_subset(pf, in_train))
        test_parties.append(_subset(pf, in_test))
    return train_parties, test_parties


def common_rows(parties: list[PartyFrame], what: str = "test") -> list[PartyFrame]:
    """Every party's rows whose id all the parties hold (THE id rule), each in its own row order:
    the rows that can be scored. A split by the active party's ids leaves, with a partial
    overlap, test rows some passive party has no features for (issue 36, item 1)."""
    canon = [pd.Series(normalize_ids(pf.frame[pf.id_col]), dtype=object) for pf in parties]
    shared = set(canon[0])
    for c in canon[1:]:
        shared &= set(c)
    if not shared:
        raise InputError(f"no {what} row is held by every party ({', '.join(describe_party(pf) for pf in parties)}): "
                         "their ids do not overlap there")
    return [_subset(pf, c.isin(shared).to_numpy()) for pf, c in zip(parties, canon)]


def join_parties(parties: list[PartyFrame]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The centralised view of a vertical split: ``(X, y, ids)``.

    Every party's features of the rows all parties share, in the first
    (label-holding) party's row order; columns in party order. It is what a
    non-federated reference model (e.g. XGBoost) trains on. ``y`` keeps the
    label column's values as they are.
    """
    active = parties[0]
    X = active.frame.set_index(active.id_col)[active.feature_names].add_prefix(f"{active.name}:")
    for pf in parties[1:]:
        X = X.join(pf.frame.set_index(pf.id_col)[pf.feature_names].add_prefix(f"{pf.name}:"), how="inner")
    y = active.frame.set_index(active.id_col).loc[X.index, active.label_col].to_numpy()
    return X.to_numpy(dtype=np.float64), y, X.index.to_numpy()
