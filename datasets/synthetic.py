"""Seeded synthetic vertically partitioned data in which every party matters."""

from __future__ import annotations

import math
import numbers

import numpy as np
import pandas as pd

from datasets.errors import InputError

from .frames import PartyFrame
from .split import _check_int, party_names

__all__ = ["make_synthetic"]

TASKS = ("binary", "regression", "multiclass")
# At most this many features of each party drive the label.
_MAX_INFORMATIVE = 8


def _check_features(n_features_per_party) -> list[int]:
    if isinstance(n_features_per_party, (str, bytes)) or not hasattr(n_features_per_party, "__iter__"):
        raise InputError(f"n_features_per_party must be a list of ints, got {n_features_per_party!r}")
    counts = list(n_features_per_party)
    if not counts:
        raise InputError("n_features_per_party must list at least one party (the active party)")
    names = party_names(len(counts))
    out = []
    for i, (name, c) in enumerate(zip(names, counts)):
        low = 0 if i == 0 else 1          # the active party may hold only the label
        out.append(_check_int(c, f"n_features_per_party entry for party {name!r}", low))
    if sum(out) == 0:
        raise InputError("n_features_per_party: the parties have no features at all")
    return out


def make_synthetic(
    n_samples: int,
    n_features_per_party: list[int],
    seed: int = 0,
    task: str = "binary",
    missing_rate: float = 0.0,
    n_classes: int = 3,
) -> list[PartyFrame]:
    """Make ``[active, passive1, passive2, ...]`` frames of standard-normal float32 features.

    The label (held by the active party, column ``y``) depends on up to 8 features of
    *every* party with equal weight per party -- a linear part, a squared term
    and a cross-party interaction -- so a federated model beats the active party alone.

    * ``task="binary"``: ``y`` in {0, 1} (int64), roughly balanced.
    * ``task="regression"``: ``y`` float64, signal plus small Gaussian noise.
    * ``task="multiclass"``: ``y`` in 0..n_classes-1 (int64).

    Ids (column ``id``) are the ints 0..n_samples-1; feature columns are named
    ``<party>_x<j>``. ``missing_rate`` in [0, 1) replaces that fraction of
    feature cells by NaN (after the label is computed). The result depends only
    on the arguments (numpy ``Generator`` seeded by ``seed``).
    """
    n_samples = _check_int(n_samples, "n_samples", 1)
    counts = _check_features(n_features_per_party)
    seed = _check_int(seed, "seed", 0)
    if task not in TASKS:
        raise InputError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if task == "multiclass":
        n_classes = _check_int(n_classes, "n_classes", 2)
    if (
        isinstance(missing_rate, bool)
        or not isinstance(missing_rate, numbers.Real)
        or math.isnan(float(missing_rate))
        or not 0.0 <= float(missing_rate) < 1.0
    ):
        raise InputError(f"missing_rate must be in [0, 1), got {missing_rate!r}")

    rng = np.random.default_rng(seed)
    n_out = n_classes if task == "multiclass" else 1
    blocks: list[np.ndarray] = []
    linear = np.zeros((n_samples, n_out), dtype=np.float64)
    squares = np.zeros((n_samples, n_out), dtype=np.float64)
    party_signal: list[np.ndarray] = []  # one standardized linear signal per party with features
    active = sum(1 for c in counts if c > 0)
    for d in counts:
        x = rng.standard_normal((n_samples, d), dtype=np.float32)
        blocks.append(x)
        if d == 0:
            continue
        k = min(d, _MAX_INFORMATIVE)
        cols = rng.choice(d, size=k, replace=False)
        w = rng.standard_normal((k, n_out))
        w /= np.linalg.norm(w, axis=0, keepdims=True)  # unit variance per output, per party
        inf = x[:, cols].astype(np.float64)
        part = inf @ w
        linear += part
        sq_col = inf[:, 0]
        sign = rng.choice([-1.0, 1.0], size=n_out)
        squares += np.outer((sq_col * sq_col - 1.0) / math.sqrt(2.0), sign)
        party_signal.append(part[:, 0])
    interaction = np.zeros((n_samples, n_out), dtype=np.float64)
    if len(party_signal) >= 2:
        for a, b in zip(party_signal, party_signal[1:] + party_signal[:1]):
            interaction[:, 0] += a * b
        if n_out > 1:
            interaction[:, 1:] = -interaction[:, :1] / (n_out - 1)
    score = (linear + 0.5 * squares + 0.5 * interaction / math.sqrt(max(1, len(party_signal)))) / math.sqrt(active)

    if task == "binary":
        z = score[:, 0]
        z = (z - z.mean()) / (z.std() + 1e-12)
        p = 1.0 / (1.0 + np.exp(-3.0 * z))
        y = (rng.random(n_samples) < p).astype(np.int64)
    elif task == "regression":
        y = score[:, 0] + 0.1 * rng.standard_normal(n_samples)
    else:
        logits = 3.0 * (score - score.mean(axis=0)) / (score.std(axis=0) + 1e-12)
        gumbel = -np.log(-np.log(rng.random((n_samples, n_out))))
        y = np.argmax(logits + gumbel, axis=1).astype(np.int64)

    if missing_rate > 0.0:
        # uint32 draws compared with rate * 2**32: as exact as float draws, ~3x faster
        threshold = np.uint32(min(int(round(float(missing_rate) * 2.0**32)), 2**32 - 1))
        for x in blocks:
            if x.shape[1]:
                x[rng.integers(0, 2**32, size=x.shape, dtype=np.uint32) < threshold] = np.nan

    ids = np.arange(n_samples, dtype=np.int64)
    parties = []
    for i, (name, x) in enumerate(zip(party_names(len(counts)), blocks)):
        frame = pd.DataFrame(x, columns=[f"{name}_x{j}" for j in range(x.shape[1])], copy=False)
        if i == 0:
            frame.insert(0, "y", y)
        frame.insert(0, "id", ids)
        parties.append(
            PartyFrame(name=name, frame=frame, id_col="id", label_col="y" if i == 0 else None)
        )
    return parties
