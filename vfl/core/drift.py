"""Population drift: the training rows' bin counts of a party's own inputs, and the population
stability index (PSI) of a scoring batch against them.

At training end every party keeps, in its own model file, a :func:`fit_reference` of its own
features on the training rows (the active party also one of the model's score): per feature up
to ten bins cut at the training deciles (a categorical feature: one bin per category, one for a
category never seen in training), a bin for missing values, and the training rows' count in each.
On a scoring batch each party counts its own rows in the same bins (:class:`DriftCounts`, a batch
at a time) and computes, locally,

    PSI = sum over bins of (a - e) * ln(a / e)

where ``e`` and ``a`` are the training and the batch's shares of rows in the bin, each at least
:data:`PSI_FLOOR` (an empty bin would make the sum infinite). Read with the usual thresholds
(:func:`flag`): below 0.1 stable, 0.1 to 0.25 a moderate shift, 0.25 and above a major one.
"""
from __future__ import annotations

import math

import numpy as np

from datasets.errors import InputError

REFERENCE_VERSION = 1
#: bins per numeric feature (cut at the training deciles; fewer where values repeat)
DRIFT_BINS = 10
#: the smallest share a bin counts with in the PSI (an empty bin would be infinitely surprising)
PSI_FLOOR = 1e-4
#: the thresholds of :func:`flag`
MODERATE, MAJOR = 0.1, 0.25
#: what a model file without drift counts (written before they existed) is reported as
NO_TRAINING_COUNTS = "no training counts"


def flag(psi: float | None) -> str:
    """``stable`` (PSI < 0.1), ``moderate`` (0.1 <= PSI < 0.25) or ``major`` (PSI >= 0.25)."""
    if psi is None:
        return "unknown"
    return "major" if psi >= MAJOR else "moderate" if psi >= MODERATE else "stable"


def _edges(x: np.ndarray, n_bins: int) -> list[float]:
    """Cut points at the ``n_bins``-quantiles of the non-missing values (distinct ones only)."""
    x = x[~np.isnan(x)]
    if x.size == 0:
        return []
    qs = np.quantile(x, np.arange(1, n_bins) / n_bins, method="lower")
    return sorted(set(float(q) for q in qs if q < x.max()))


def _category_edges(n_categories: int) -> list[float]:
    """One bin per category code and, first, one for code -1 (a category never seen in training)."""
    return [i - 0.5 for i in range(n_categories)]


def _counts(edges: list[float], x: np.ndarray) -> np.ndarray:
    """Rows per bin ``(-inf, e0], (e0, e1], ..., (e_last, inf)`` and, last, the missing ones."""
    x = np.asarray(x, dtype=np.float64).ravel()
    missing = np.isnan(x)
    idx = np.searchsorted(np.asarray(edges, dtype=np.float64), x[~missing], side="left")
    return np.r_[np.bincount(idx, minlength=len(edges) + 1), missing.sum()].astype(np.int64)


def fit_reference(X, names, categories: dict | None = None, n_bins: int = DRIFT_BINS) -> dict:
    """The drift reference of the training rows ``X`` (``(n, d)``, columns ``names``; a feature in
    ``categories`` holds category codes, -1 for unseen, NaN for missing): per feature its bin
    edges and the training rows' count per bin (the last: missing values)."""
    X = np.asarray(X, dtype=np.float64)
    names = list(names)
    if X.ndim != 2 or X.shape[1] != len(names):
        raise InputError(f"drift reference: {X.shape} values for {len(names)} features")
    categories = categories or {}
    feats = []
    for j, name in enumerate(names):
        col = X[:, j]
        if name in categories:
            edges, kind = _category_edges(len(categories[name])), "categorical"
        else:
            edges, kind = _edges(col, n_bins), "numeric"
        feats.append({"name": str(name), "kind": kind, "edges": edges, "counts": _counts(edges, col).tolist()})
    return {"version": REFERENCE_VERSION, "n_rows": int(X.shape[0]), "features": feats}


def check_reference(ref, source: str, field: str = "drift_reference") -> dict:
    """A drift reference read from a model file, checked (an InputError naming ``source`` and the field)."""
    def bad(why):
        return InputError(f"{source}: field {field!r}: {why} (a damaged model file)")
    if not isinstance(ref, dict) or ref.get("version") != REFERENCE_VERSION \
            or not isinstance(ref.get("features"), list):
        raise bad(f"expected a version-{REFERENCE_VERSION} drift reference")
    for i, f in enumerate(ref["features"]):
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise bad(f"features[{i}] has no name")
        edges, counts = f.get("edges"), f.get("counts")
        if not isinstance(edges, list) or not all(isinstance(e, (int, float)) and not isinstance(e, bool)
                                                  for e in edges):
            raise bad(f"features[{i}].edges must be a list of numbers")
        if list(edges) != sorted(edges):
            raise bad(f"features[{i}].edges must increase")
        if not isinstance(counts, list) or len(counts) != len(edges) + 2 or \
                not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise bad(f"features[{i}].counts must be {len(edges) + 2} counts")
    return ref


def psi(expected, actual, floor: float = PSI_FLOOR) -> float | None:
    """The population stability index of the counts ``actual`` against ``expected`` (same bins);
    None when either has no rows."""
    e = np.asarray(expected, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if e.shape != a.shape:
        raise InputError(f"PSI of {a.size} bins against {e.size}")
    if e.sum() <= 0 or a.sum() <= 0:
        return None
    e = np.maximum(e / e.sum(), floor)
    a = np.maximum(a / a.sum(), floor)
    return float(math.fsum(((a - e) * np.log(a / e)).tolist()))


class DriftCounts:
    """A scoring batch's counts in a reference's bins, added a batch of rows at a time."""

    def __init__(self, reference: dict):
        self.reference = reference
        self.counts = [np.zeros(len(f["counts"]), dtype=np.int64) for f in reference["features"]]
        self.n_rows = 0

    def add(self, X) -> None:
        """Count the rows of ``X`` (``(n, d)``, the reference's features in its order)."""
        X = np.asarray(X, dtype=np.float64)
        feats = self.reference["features"]
        if X.ndim != 2 or X.shape[1] != len(feats):
            raise InputError(f"drift: rows of {X.shape[-1] if X.ndim else 0} features for a reference of {len(feats)}")
        for j, f in enumerate(feats):
            self.counts[j] += _counts(f["edges"], X[:, j])
        self.n_rows += int(X.shape[0])

    def psi(self) -> list[float | None]:
        """PSI per feature (the reference's order)."""
        return [psi(f["counts"], c) for f, c in zip(self.reference["features"], self.counts)]


def feature_psi(reference: dict, X) -> list[float | None]:
    """PSI per feature of the rows ``X`` against ``reference`` (one batch)."""
    c = DriftCounts(reference)
    c.add(X)
    return c.psi()


def score_columns(objective: str, output, classes=None) -> tuple[np.ndarray, list[str]]:
    """The model's score as columns for a drift reference: ``score`` (binary: the probability of
    class 1; regression: the prediction) or ``score[c]`` per class (multiclass)."""
    out = np.asarray(output, dtype=np.float64)
    if out.ndim == 2 and out.shape[1] > 1:
        names = [f"score[{c}]" for c in (classes if classes is not None else range(out.shape[1]))]
        return out, names
    return out.reshape(-1, 1), ["score"]


def entries(names, values, party: str | None = None) -> list[dict]:
    """Report rows ``{"feature", "psi", "flag"}`` (a feature given by position where its name is not shared)."""
    return [{"feature": n, "psi": v, "flag": flag(v)} | ({"party": party} if party else {})
            for n, v in zip(names, values)]
