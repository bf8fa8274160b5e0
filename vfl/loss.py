"""Losses: gradients, hessians, their bounds for packing, and the link."""
from __future__ import annotations

import numpy as np

from datasets.errors import InputError


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


class BinaryLogLoss:
    """Binary logistic loss (XGBoost ``binary:logistic``)."""

    name = "binary"
    n_targets = 1

    def check_labels(self, y, party: str = "active", column: str = "label", ids=None) -> np.ndarray:
        """Labels as float 0/1 (``ids``, accepted like the other losses', are not needed here)."""
        if np.asarray(y).dtype == object:
            from vfl.objectives import _numeric_labels
            _numeric_labels(y, party, column, "binary")
        y = np.asarray(y, dtype=np.float64)
        bad = ~np.isfinite(y)
        if bad.any():
            raise InputError(f"label column {column!r} of party {party!r} has {int(bad.sum())} NaN/inf values")
        wrong = np.unique(y[(y != 0) & (y != 1)])
        if wrong.size:
            raise InputError(f"label column {column!r} of party {party!r} must hold only 0 and 1 for a "
                             f"binary objective; found {wrong[:5].tolist()}")
        return y

    encode_labels = check_labels   # validation labels: the same check

    def base_score(self, y) -> np.ndarray:
        p = float(np.clip(np.mean(y), 1e-6, 1 - 1e-6))
        return np.array([np.log(p / (1 - p))])

    def gradients(self, y, raw):
        p = sigmoid(raw[:, 0])
        g = p - y
        h = np.maximum(p * (1.0 - p), 1e-16)
        return g[:, None], h[:, None]

    def gradient_bounds(self, g, h) -> tuple[float, float]:
        """Bounds used to size the packing; constant, so the layout reveals nothing."""
        return 1.0, 0.25

    def transform(self, raw):
        return sigmoid(raw[:, 0])


def get_loss(objective: str, huber_slope: float = 1.0):
    if objective in ("binary", "binary:logistic"):
        return BinaryLogLoss()
    from vfl.objectives import make_loss  # multiclass, regression, pseudohuber
    return make_loss(objective, huber_slope)
