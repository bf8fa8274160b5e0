"""Credit-risk metrics for a model-risk review: KS, Gini, the decile table and calibration.

Every function takes the true labels and the model's transformed output on the same rows
(probability of class 1 for a binary model, class probabilities ``(n, K)`` for multiclass,
predictions for regression) and returns plain, JSON-ready values (an undefined value, such as
the AUC of rows of one class, is ``None``).

* :func:`ks` -- the Kolmogorov-Smirnov distance between the scores of events and non-events
  and the score where it is reached (rows scoring above it are "bad");
* :func:`gini` -- ``2 AUC - 1``;
* :func:`decile_table` -- rows, events, event rate, cumulative capture and lift per decile of
  the score (highest first);
* :func:`calibration` -- reliability bins (mean score and event rate per equal-width bin of the
  probability) and the Brier score;
* :func:`credit_report` -- all of them per objective (multiclass: one-vs-rest per class;
  regression: RMSE, MAE and the decile table of the prediction), overall and per segment.
"""
from __future__ import annotations

import math

import numpy as np

from datasets.errors import InputError
from vfl.core import metrics

#: deciles of the decile table, bins of the reliability diagram
N_DECILES = 10
N_CALIBRATION_BINS = 10
#: points kept of a curve drawn in a report (ROC, KS): enough for a figure, small in JSON
CURVE_POINTS = 201
#: the most segments a report splits into (a segment column is a category: region, product, ...)
MAX_SEGMENTS = 50


def _num(x) -> float | None:
    """A JSON-ready number: None for NaN or an infinity."""
    x = float(x)
    return x if math.isfinite(x) else None


def _binary(y, p) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y, dtype=np.float64).ravel()
    p = np.asarray(p, dtype=np.float64).ravel()
    if y.shape != p.shape:
        raise InputError(f"labels and scores differ in length ({y.size} and {p.size})")
    if y.size and not np.isin(y, (0.0, 1.0)).all():
        raise InputError("binary credit metrics need labels 0 and 1")
    if not np.isfinite(p).all():
        raise InputError("scores must be finite")
    return y > 0.5, p


def _cdfs(y: np.ndarray, p: np.ndarray):
    """``(scores, F_events, F_nonevents)``: the empirical distribution functions of the events'
    and non-events' scores at every distinct score (``F(t)``: share scoring at most ``t``)."""
    order = np.argsort(p, kind="mergesort")
    sp, sy = p[order], y[order]
    last = np.r_[sp[1:] != sp[:-1], True] if sp.size else np.zeros(0, bool)     # a distinct score's last row
    n_pos, n_neg = int(sy.sum()), int((~sy).sum())
    f_pos = np.cumsum(sy)[last] / max(n_pos, 1)
    f_neg = np.cumsum(~sy)[last] / max(n_neg, 1)
    return sp[last], f_pos, f_neg


def ks(y, p) -> dict:
    """``{"ks", "threshold"}``: the largest distance between the empirical distribution functions
    of the events' and the non-events' scores (``scipy.stats.ks_2samp``'s statistic), and the score
    ``t`` where it is reached (the cut "score > t" separates them best). None without both classes."""
    y, p = _binary(y, p)
    if y.all() or not y.any():
        return {"ks": None, "threshold": None}
    scores, f_pos, f_neg = _cdfs(y, p)
    gap = np.abs(f_neg - f_pos)
    i = int(np.argmax(gap))
    return {"ks": float(gap[i]), "threshold": float(scores[i])}


def ks_curve(y, p, points: int = CURVE_POINTS) -> dict:
    """The two distribution functions behind :func:`ks`, at most ``points`` scores (for a figure)."""
    y, p = _binary(y, p)
    scores, f_pos, f_neg = _cdfs(y, p)
    keep = np.unique(np.linspace(0, max(len(scores) - 1, 0), min(points, len(scores))).round().astype(int)) \
        if len(scores) else np.zeros(0, int)
    return {"score": scores[keep].tolist(), "events": f_pos[keep].tolist(), "non_events": f_neg[keep].tolist()}


def roc_curve(y, p, points: int = CURVE_POINTS) -> dict:
    """False- and true-positive rates of the cuts "score >= t" (from the highest score down),
    at most ``points`` of them, starting at (0, 0) and ending at (1, 1)."""
    y, p = _binary(y, p)
    scores, f_pos, f_neg = _cdfs(y, p)
    tpr = np.r_[0.0, (1 - f_pos)[::-1][1:], 1.0] if len(scores) else np.array([0.0, 1.0])
    fpr = np.r_[0.0, (1 - f_neg)[::-1][1:], 1.0] if len(scores) else np.array([0.0, 1.0])
    keep = np.unique(np.linspace(0, len(tpr) - 1, min(points, len(tpr))).round().astype(int))
    return {"fpr": fpr[keep].tolist(), "tpr": tpr[keep].tolist()}


def gini(y, p) -> float | None:
    """The Gini coefficient ``2 AUC - 1`` (None without both classes)."""
    y, p = _binary(y, p)
    return _num(2.0 * metrics.auc(y, p) - 1.0)


def _decile_groups(score: np.ndarray, n_bins: int) -> np.ndarray:
    """Decile of every row: rows sorted by score, highest first (ties in input order), cut into
    ``n_bins`` groups of equal size (the first ones one row larger where it does not divide)."""
    order = np.argsort(-score, kind="mergesort")
    group = np.empty(score.size, dtype=np.int64)
    group[order] = np.arange(score.size) * n_bins // max(score.size, 1)
    return group


def decile_table(y, score, n_bins: int = N_DECILES) -> list[dict]:
    """One row per decile of the score (decile 1: the highest scores): ``rows``, ``events``,
    ``event_rate``, the score range, ``cum_rows``, ``cum_events``, ``cum_capture`` (share of all
    events in this decile and above) and ``lift`` / ``cum_lift`` (event rate over the overall
    rate). For regression ``y`` is the target and "events" its sum (``event_rate`` its mean)."""
    y = np.asarray(y, dtype=np.float64).ravel()
    score = np.asarray(score, dtype=np.float64).ravel()
    if y.shape != score.shape:
        raise InputError(f"labels and scores differ in length ({y.size} and {score.size})")
    n_bins = min(int(n_bins), max(score.size, 1))
    group = _decile_groups(score, n_bins)
    rows = np.bincount(group, minlength=n_bins)
    events = np.bincount(group, weights=y, minlength=n_bins)
    total_events = float(y.sum())
    overall = total_events / y.size if y.size else float("nan")
    out, cum_rows, cum_events = [], 0, 0.0
    for d in range(n_bins):
        in_d = score[group == d]
        cum_rows += int(rows[d])
        cum_events += float(events[d])
        rate = events[d] / rows[d] if rows[d] else float("nan")
        cum_rate = cum_events / cum_rows if cum_rows else float("nan")
        out.append({"decile": d + 1, "rows": int(rows[d]), "events": float(events[d]), "event_rate": _num(rate),
                    "min_score": _num(in_d.min()) if in_d.size else None,
                    "max_score": _num(in_d.max()) if in_d.size else None,
                    "cum_rows": cum_rows, "cum_events": cum_events,
                    "cum_capture": _num(cum_events / total_events) if total_events else None,
                    "lift": _num(rate / overall) if overall else None,
                    "cum_lift": _num(cum_rate / overall) if overall else None})
    return out


def brier(y, p) -> float | None:
    """The Brier score: mean squared difference of probability and outcome."""
    y, p = _binary(y, p)
    return _num(np.mean((p - y) ** 2)) if y.size else None


def calibration(y, p, n_bins: int = N_CALIBRATION_BINS) -> dict:
    """Reliability bins: ``n_bins`` equal-width bins ``(lo, hi]`` of the probability on [0, 1] (the
    first one closed; the binning of ``sklearn.calibration.calibration_curve(strategy="uniform")``), each
    non-empty one with its ``rows``, ``mean_predicted`` and ``event_rate``; and the ``brier`` score."""
    y, p = _binary(y, p)
    if p.size and (p.min() < 0 or p.max() > 1):
        raise InputError("calibration needs probabilities in [0, 1]")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.searchsorted(edges[1:-1], p, side="left")
    rows = np.bincount(idx, minlength=n_bins)
    sums = np.bincount(idx, weights=p, minlength=n_bins)
    hits = np.bincount(idx, weights=y.astype(np.float64), minlength=n_bins)
    bins = [{"lo": float(edges[b]), "hi": float(edges[b + 1]), "rows": int(rows[b]),
             "mean_predicted": float(sums[b] / rows[b]), "event_rate": float(hits[b] / rows[b])}
            for b in range(n_bins) if rows[b]]
    return {"bins": bins, "brier": brier(y, p)}


def binary_report(y, p, curves: bool = True) -> dict:
    """Every credit metric of one binary score: ``n``, ``events``, ``event_rate``, ``auc``,
    ``gini``, ``ks``, ``ks_threshold``, ``brier``, ``deciles``, ``calibration`` and (``curves``)
    the ROC and KS curves for figures."""
    yb, p = _binary(y, p)
    k = ks(yb, p)
    auc = metrics.auc(yb, p) if yb.size else float("nan")
    out = {"n": int(yb.size), "events": int(yb.sum()), "event_rate": _num(yb.mean()) if yb.size else None,
           "auc": _num(auc), "gini": _num(2 * auc - 1), "ks": k["ks"], "ks_threshold": k["threshold"],
           "brier": brier(yb, p), "deciles": decile_table(yb, p), "calibration": calibration(yb, p)["bins"]}
    if curves:
        out["roc"] = roc_curve(yb, p)
        out["ks_curve"] = ks_curve(yb, p)
    return out


def regression_report(y, pred) -> dict:
    """``n``, ``rmse``, ``mae``, ``mean_target`` and the decile table of the prediction."""
    y, pred = np.asarray(y, dtype=np.float64).ravel(), np.asarray(pred, dtype=np.float64).ravel()
    return {"n": int(y.size), "rmse": _num(metrics.rmse(y, pred)) if y.size else None,
            "mae": _num(metrics.mae(y, pred)) if y.size else None,
            "mean_target": _num(y.mean()) if y.size else None, "deciles": decile_table(y, pred)}


def _report(objective: str, y, output, classes, curves: bool) -> dict:
    if objective == "binary":
        return binary_report(y, output, curves)
    if objective == "multiclass":
        codes = np.asarray(y, dtype=np.int64).ravel()
        output = np.asarray(output, dtype=np.float64)
        names = list(classes) if classes is not None else list(range(output.shape[1]))
        return {"n": int(codes.size),
                "per_class": {str(c): binary_report(codes == k, output[:, k], curves) for k, c in enumerate(names)}}
    return regression_report(y, output)


def credit_report(objective: str, y, output, classes=None, segments=None, segment_name: str | None = None,
                  curves: bool = True) -> dict:
    """The credit metrics of a model's ``output`` on rows with labels ``y`` (multiclass: the class
    codes ``0..K-1``, ``classes`` their labels), by ``objective`` ("binary", "multiclass", anything
    else: regression): ``{"objective", "overall": {...}}`` and, given ``segments`` (one value per
    row of the column ``segment_name``), ``"segments": {value: {...}}`` (without curves)."""
    output = np.asarray(output, dtype=np.float64)
    n = len(output)
    if len(np.asarray(y).ravel()) != n:
        raise InputError(f"labels and predictions differ in length ({len(np.asarray(y).ravel())} and {n})")
    out = {"objective": str(objective), "overall": _report(objective, y, output, classes, curves)}
    if segments is not None:
        seg = np.asarray(segments, dtype=object).ravel()
        if seg.size != n:
            raise InputError(f"segment column {segment_name!r} has {seg.size} values for {n} rows")
        keys = ["(missing)" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in seg]
        if len(set(keys)) > MAX_SEGMENTS:
            raise InputError(f"segment column {segment_name!r} has {len(set(keys))} distinct values, more than "
                             f"{MAX_SEGMENTS}: segments are categories (a region, a product); bin a numeric column")
        keys = np.asarray(keys, dtype=object)
        y_arr = np.asarray(y)
        out["segment"] = segment_name
        out["segments"] = {k: _report(objective, y_arr[keys == k], output[keys == k], classes, False)
                           for k in sorted(set(keys.tolist()))}
    return out


def encode_labels(objective: str, y, classes=None, where: str = "the labels") -> np.ndarray:
    """The labels of rows to evaluate as :func:`credit_report` takes them: binary 0/1, multiclass
    the class codes of ``classes`` (a label the model never saw: an InputError), regression floats."""
    values = np.asarray(y).ravel()
    if objective == "multiclass":
        names = list(classes) if classes is not None else None
        out = []
        for v in values.tolist():
            v = int(v) if isinstance(v, float) and v.is_integer() else v
            if names is None:
                code = v if isinstance(v, int) else -1
            else:
                code = names.index(v) if v in names else (names.index(str(v)) if str(v) in map(str, names) else -1)
            if code < 0:
                raise InputError(f"{where}: label {v!r} is not one of the model's classes {names}")
            out.append(code)
        return np.asarray(out, dtype=np.int64)
    try:
        out = values.astype(np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{where}: labels must be numbers for a {objective} model") from None
    if np.isnan(out).any():
        raise InputError(f"{where}: {int(np.isnan(out).sum())} row(s) have no label; evaluation needs every "
                         "row's label")
    if objective == "binary" and not np.isin(out, (0.0, 1.0)).all():
        raise InputError(f"{where}: a binary model's labels must be 0 or 1")
    return out


def headline(report: dict) -> dict:
    """The one-line numbers of a :func:`credit_report` section (binary: AUC, Gini, KS and its
    threshold, Brier; multiclass: those per class; regression: RMSE, MAE)."""
    def one(r):
        if "per_class" in r:
            return {c: one(v) for c, v in r["per_class"].items()}
        keys = ("auc", "gini", "ks", "ks_threshold", "brier") if "ks" in r else ("rmse", "mae")
        return {k: r.get(k) for k in keys}
    return one(report["overall"])
