"""Objectives (the losses boosting minimises): binary log loss, softmax
(multiclass), squared error and pseudo-Huber (regression), with label checks
and the sizing of the fixed-point encoding for unbounded gradients.

Every objective has the interface of :class:`BinaryObjective`: ``name``,
``n_targets``, ``check_labels(y, party, column)`` (training labels: checked,
and for multiclass mapped to ``0..K-1``), ``encode_labels`` (validation labels,
with the training mapping), ``base_score(y)``, ``gradients(y, raw)`` returning
``(g, h)`` of shape ``(n_samples, n_targets)``, ``gradient_bounds(g, h)`` and
``transform(raw)``.

Gradient bounds and leakage. The packing layout sent to the passive parties
(:class:`crypto.packing.PackingLayout`) holds the gradient bound ``g_max``.
Bounded losses use constants (binary: ``|g| <= 1``, ``h <= 1/4``; softmax:
``|g| <= 1``, ``h <= 1/2``), so the layout reveals nothing. Regression
gradients are unbounded (the residuals ``raw - y``), so their bound is taken
from the data of the round and **rounded up to a power of two**: a passive
party learns ``ceil(log2(max |residual|))`` per round, nothing finer.
:func:`plan_precision` then picks the number of fractional bits so that no
encoded value or sum can leave float64's exact integer range; data too large
for any sensible precision raises :class:`InputError` (never a silent
overflow).
"""
from __future__ import annotations

import math

import numpy as np

from datasets.errors import InputError

MAX_CLASSES = 1024        # PackingLayout.from_dict refuses more targets
MIN_PRECISION_BITS = 8    # fewer fractional bits than this: refuse (labels far too large)
_FLOAT_EXACT_BITS = 53


def _where(party: str, column: str) -> str:
    return f"label column {column!r} of party {party!r}"


def _numeric_labels(y, party: str, column: str, task: str) -> np.ndarray:
    arr = np.asarray(y)
    if arr.dtype == object or arr.dtype.kind in "USO":
        examples = sorted({v for v in arr.tolist() if isinstance(v, str)})[:3]
        raise InputError(f"{_where(party, column)} is not numeric (e.g. {', '.join(map(repr, examples))}); "
                         f"a {task} objective "
                         "needs numbers" + (" (use objective='multiclass' for class names)"
                                            if task != "multiclass" else ""))
    return arr.astype(np.float64)


def pow2_ceil(x: float, floor: float = 2.0 ** -20) -> float:
    """Smallest power of two >= ``max(x, floor)``: what a data-driven bound reveals."""
    x = max(float(x), floor)
    if not math.isfinite(x):
        raise InputError("gradients are not finite (NaN or infinite raw scores)")
    m, e = math.frexp(x)          # x = m * 2**e, 0.5 <= m < 1
    return 2.0 ** (e - 1) if m == 0.5 else 2.0 ** e


def plan_precision(g_bound: float, h_bound: float, n_rows: int, max_precision: int,
                   weight_bound: float = 1.0) -> int:
    """Fractional bits of one round's fixed-point encoding.

    ``max_precision`` (``TrainParams.precision_bits``, 32 by default) is used
    unless ``n_rows * max(g_bound, h_bound) * 2**bits`` would reach ``2**53``:
    then every sum of encoded values would no longer be an exact float64 (and
    single values could break :func:`vfl.core.fixedpoint.encode_fixed`'s range), so
    fewer bits are used. Below :data:`MIN_PRECISION_BITS` the data are refused, naming the
    sample weights when they are what makes the bounds large (``weight_bound``: the largest
    weight rounded up to a power of two, already part of the bounds).
    """
    bound = max(float(g_bound), float(h_bound), 2.0 ** -20)
    room = _FLOAT_EXACT_BITS - math.ceil(math.log2(bound)) - int(n_rows).bit_length()
    bits = min(int(max_precision), room)
    if bits < MIN_PRECISION_BITS:
        head = (f"gradients up to {bound:.4g} over {n_rows} rows leave only {max(bits, 0)} fractional bits of "
                f"fixed-point precision (at least {MIN_PRECISION_BITS} are needed): ")
        if weight_bound > 1 and bound / weight_bound < 2.0 ** (_FLOAT_EXACT_BITS - MIN_PRECISION_BITS
                                                              - int(n_rows).bit_length()):
            raise InputError(head + f"the sample weights are too large (up to {weight_bound:.4g}); scale them "
                             "down (e.g. divide every weight by their mean) before training")
        raise InputError(head + "the label is too large; scale it down (e.g. divide by a power of ten) before "
                         "training")
    return bits


def check_sample_weight(weight, n_rows: int, party: str = "active", column: str | None = None) -> np.ndarray:
    """Sample weights as float64: one finite value >= 0 per row, not all zero."""
    where = f"sample weights of party {party!r}" + (f" (column {column!r})" if column else "")
    try:
        w = np.asarray(weight, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{where} must be numbers") from None
    if w.ndim != 1 or len(w) != n_rows:
        raise InputError(f"{where}: expected one weight per row ({n_rows}), got shape {w.shape}")
    bad = ~np.isfinite(w)
    if bad.any():
        raise InputError(f"{where}: {int(bad.sum())} NaN/inf weights (rows {np.flatnonzero(bad)[:5].tolist()})")
    neg = w < 0
    if neg.any():
        raise InputError(f"{where}: {int(neg.sum())} negative weights (rows {np.flatnonzero(neg)[:5].tolist()}, "
                         f"e.g. {float(w[neg][0])}); weights must be >= 0")
    if n_rows and not w.sum() > 0:
        raise InputError(f"{where} are all zero")
    return w


def weight_bound(weight: np.ndarray | None) -> float:
    """The largest weight rounded up to a power of two (what the gradient bounds are scaled by, so
    a passive party learns only ``ceil(log2(max weight))``); 1 without weights."""
    if weight is None or not len(weight):
        return 1.0
    return pow2_ceil(float(np.max(weight)))


def _mean(y, weight=None) -> float:
    y = np.asarray(y, dtype=np.float64)
    if weight is None:
        return float(np.mean(y))
    return float(np.sum(y * weight) / np.sum(weight))


def weighted_median(y, weight=None) -> float:
    """The median; with weights, the median of the rows repeated ``weight`` times (for integer
    weights exactly ``np.median`` of the repeated rows)."""
    y = np.asarray(y, dtype=np.float64)
    if weight is None:
        return float(np.median(y))
    order = np.argsort(y, kind="stable")
    ys, cw = y[order], np.cumsum(np.asarray(weight, dtype=np.float64)[order])
    half = cw[-1] / 2.0
    lo = ys[min(np.searchsorted(cw, half, side="left"), len(ys) - 1)]
    hi = ys[min(np.searchsorted(cw, half, side="right"), len(ys) - 1)]
    return float((lo + hi) / 2.0)


# --------------------------------------------------------------------------- binary
def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


class BinaryObjective:
    """Binary logistic loss (XGBoost ``binary:logistic``)."""

    name = "binary"
    n_targets = 1

    def encode_labels(self, y, party: str = "active", column: str = "label", ids=None) -> np.ndarray:
        """Labels as float 0/1 (``ids``, accepted like the other losses', are not needed here); a
        validation set may hold a single class."""
        if np.asarray(y).dtype == object:
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

    def check_labels(self, y, party: str = "active", column: str = "label", ids=None) -> np.ndarray:
        """Training labels: :meth:`encode_labels`, and both classes present. A single class leaves
        nothing to learn (every tree would be empty, every prediction the class's rate): refused."""
        y = self.encode_labels(y, party, column, ids)
        classes = np.unique(y)
        if len(y) and classes.size < 2:
            raise InputError(f"label column {column!r} of party {party!r} holds a single class "
                             f"({int(classes[0])}) on the {len(y)} training rows: a binary objective needs both "
                             "0 and 1")
        return y

    def base_score(self, y, weight=None) -> np.ndarray:
        p = float(np.clip(_mean(y, weight), 1e-6, 1 - 1e-6))
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


# --------------------------------------------------------------------------- multiclass
def softmax(raw) -> np.ndarray:
    z = np.asarray(raw, dtype=np.float64)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class SoftmaxObjective:
    """Multiclass softmax (XGBoost ``multi:softprob``): one tree per class per round.

    Labels may be any integers or strings; they are mapped to ``0..K-1`` in
    sorted order (``classes``), and predictions map back. ``h = 2 p (1 - p)``
    as in XGBoost. The base score is the log of the class priors.
    """

    name = "multiclass"

    def __init__(self):
        self.classes: list | None = None
        self.n_targets = 0

    @property
    def mapping(self) -> dict:
        """``{original label: class index}``."""
        return {c: i for i, c in enumerate(self.classes or [])}

    def _values(self, y, party, column, ids=None) -> list:
        arr = np.asarray(y)
        if arr.dtype == object or arr.dtype.kind in "US":
            vals = arr.tolist()
            nan = [i for i, v in enumerate(vals) if v is None or (isinstance(v, float) and math.isnan(v))]
            if nan:
                where = f"ids {np.asarray(ids)[nan[:5]].tolist()}" if ids is not None else f"rows {nan[:5]}"
                raise InputError(f"{_where(party, column)} has {len(nan)} missing labels ({where})")
            kinds = {type(v) for v in vals}
            if not all(issubclass(k, str) for k in kinds):
                if all(issubclass(k, (int, float, np.integer, np.floating)) and not issubclass(k, bool)
                       for k in kinds):
                    arr = np.asarray(vals, dtype=np.float64)
                else:
                    raise InputError(f"{_where(party, column)} mixes strings and numbers "
                                     f"({sorted(k.__name__ for k in kinds)}); use one kind of class label")
            else:
                return vals
        y = arr.astype(np.float64)
        bad = ~np.isfinite(y)
        if bad.any():
            raise InputError(f"{_where(party, column)} has {int(bad.sum())} NaN/inf values")
        frac = np.unique(y[y != np.round(y)])
        if frac.size:
            raise InputError(f"{_where(party, column)} holds non-integer values {frac[:5].tolist()}: class "
                             "labels must be integers or strings (use objective='regression' for a "
                             "continuous target)")
        return [int(v) for v in y.tolist()]

    def check_labels(self, y, party: str = "active", column: str = "label", ids=None) -> np.ndarray:
        vals = self._values(y, party, column, ids)
        classes = sorted(set(vals))
        if len(classes) < 2:
            raise InputError(f"{_where(party, column)} holds a single class {classes}: a multiclass "
                             "objective needs at least 2 classes")
        if len(classes) > MAX_CLASSES:
            raise InputError(f"{_where(party, column)} holds {len(classes)} distinct values, more than the "
                             f"{MAX_CLASSES} classes supported (is it a regression target?)")
        self.classes = classes
        self.n_targets = len(classes)
        index = self.mapping
        return np.array([index[v] for v in vals], dtype=np.float64)

    def encode_labels(self, y, party: str = "active", column: str = "label", ids=None) -> np.ndarray:
        """Labels of another set (validation) with the training mapping."""
        if self.classes is None:
            raise RuntimeError("encode_labels before check_labels")
        vals = self._values(y, party, column, ids)
        index = self.mapping
        unknown = sorted({v for v in vals if v not in index}, key=str)
        if unknown:
            raise InputError(f"{_where(party, column)} holds classes {unknown[:5]} that are not in the "
                             f"training labels {self.classes[:10]}")
        return np.array([index[v] for v in vals], dtype=np.float64)

    def base_score(self, y, weight=None) -> np.ndarray:
        counts = np.bincount(np.asarray(y, dtype=np.int64), weights=weight,
                             minlength=self.n_targets).astype(np.float64)
        prior = np.clip(counts / counts.sum(), 1e-6, 1.0)
        logp = np.log(prior)
        return logp - logp.mean()

    def gradients(self, y, raw):
        p = softmax(raw)
        onehot = np.zeros_like(p)
        onehot[np.arange(len(y)), np.asarray(y, dtype=np.int64)] = 1.0
        g = p - onehot
        h = np.maximum(2.0 * p * (1.0 - p), 1e-16)
        return g, h

    def gradient_bounds(self, g, h) -> tuple[float, float]:
        """Constant: ``|g| <= 1``, ``h <= 1/2``; the layout reveals nothing."""
        return 1.0, 0.5

    def transform(self, raw):
        return softmax(raw)


# --------------------------------------------------------------------------- regression
class _RegressionObjective:
    n_targets = 1

    def check_labels(self, y, party: str = "active", column: str = "label", ids=None) -> np.ndarray:
        y = _numeric_labels(y, party, column, "regression")
        bad = ~np.isfinite(y)
        if bad.any():
            rows = np.flatnonzero(bad)
            where = f"ids {np.asarray(ids)[rows[:5]].tolist()}" if ids is not None else f"rows {rows[:5].tolist()}"
            raise InputError(f"{_where(party, column)} has {int(bad.sum())} NaN/inf values "
                             f"({where}); a regression target must be finite")
        return y

    encode_labels = check_labels

    def gradient_bounds(self, g, h) -> tuple[float, float]:
        """Data-driven: ``max |g|`` rounded up to a power of two; ``h <= 1``."""
        g = np.asarray(g)
        return pow2_ceil(float(np.max(np.abs(g))) if g.size else 0.0), 1.0

    def transform(self, raw):
        return np.asarray(raw, dtype=np.float64)[:, 0]


class SquaredErrorObjective(_RegressionObjective):
    """``(raw - y)^2 / 2`` (XGBoost ``reg:squarederror``); base score = mean label."""

    name = "regression"

    def base_score(self, y, weight=None) -> np.ndarray:
        # exactly rounded, so independent of the row order (which follows the salted id hashes)
        y = np.asarray(y, dtype=np.float64)
        if weight is not None:
            w = np.asarray(weight, dtype=np.float64)
            return np.array([math.fsum((y * w).tolist()) / math.fsum(w.tolist())])
        return np.array([math.fsum(y.tolist()) / max(len(y), 1)])

    def gradients(self, y, raw):
        g = raw[:, 0] - y
        return g[:, None], np.ones((len(y), 1))


class PseudoHuberObjective(_RegressionObjective):
    """``d^2 (sqrt(1 + (r/d)^2) - 1)`` with ``d = huber_slope`` (XGBoost ``reg:pseudohubererror``).

    ``g = r / sqrt(1 + (r/d)^2)`` (so ``|g| < d``), ``h = (1 + (r/d)^2)^(-3/2)``;
    the base score is the median label (robust, like the loss).
    """

    name = "pseudohuber"

    def __init__(self, huber_slope: float = 1.0):
        if not (isinstance(huber_slope, (int, float)) and math.isfinite(huber_slope) and huber_slope > 0):
            raise InputError(f"parameter huber_slope must be a positive number, got {huber_slope!r}")
        self.huber_slope = float(huber_slope)

    def base_score(self, y, weight=None) -> np.ndarray:
        return np.array([weighted_median(y, weight)])

    def gradients(self, y, raw):
        r = raw[:, 0] - y
        s = 1.0 + (r / self.huber_slope) ** 2
        g = r / np.sqrt(s)
        h = np.maximum(1.0 / (s * np.sqrt(s)), 1e-16)
        return g[:, None], h[:, None]


OBJECTIVE_ALIASES = {
    "binary:logistic": "binary", "multi:softprob": "multiclass", "multi:softmax": "multiclass",
    "softmax": "multiclass", "reg:squarederror": "regression", "squared_error": "regression",
    "reg:pseudohubererror": "pseudohuber", "pseudo_huber": "pseudohuber",
}


def get_objective(objective: str, huber_slope: float = 1.0):
    """The objective object of a name (or an XGBoost-style alias)."""
    objective = OBJECTIVE_ALIASES.get(objective, objective)
    if objective == "binary":
        return BinaryObjective()
    if objective == "multiclass":
        return SoftmaxObjective()
    if objective == "regression":
        return SquaredErrorObjective()
    if objective == "pseudohuber":
        return PseudoHuberObjective(huber_slope)
    raise InputError(f"unknown objective {objective!r}")
