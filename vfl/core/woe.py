"""Weight of evidence (WOE) and information value (IV) of binned features (issue 33).

Everything here works on counts: per bin of a feature, its rows and its events (rows whose
binary label is 1). The active party computes WOE and IV from the counts the passive parties'
encrypted histograms give it, so the same functions serve its own features, a passive party's
and a naive centralised oracle (tests).

Conventions (those of optbinning where they agree):

* ``WOE_i = ln((nonevents_i / N) / (events_i / E))``: positive WOE, fewer events than average;
* ``IV = sum_i (nonevents_i / N - events_i / E) * WOE_i``;
* a bin without rows is left out (no WOE, no IV);
* a bin with rows but no events (or no non-events) has no finite WOE: it gets
  ``ln(((nonevents_i + s) / N) / ((events_i + s) / E))`` with ``s`` = :data:`ZERO_SMOOTHING` (0.5),
  and a note says so. optbinning gives such a bin WOE 0 and IV 0 instead (the one difference);
* the missing values are their own bin (the last slot), never merged with another.

Monotone WOE (:func:`monotone_groups`): adjacent (non-missing) bins are pooled until the event
rate, hence the WOE, is monotone in the bin order (pool-adjacent-violators, in the direction of
higher IV); :func:`min_share_groups` then pools any bin with fewer than a share of the rows with
a neighbour (pooling neighbours keeps a monotone sequence monotone). Both are decided from the
counts alone and expressed as groups of bin indices (:func:`groups_to_labels`), never as values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: counts added to a bin without events (or without non-events) to give it a finite WOE
ZERO_SMOOTHING = 0.5


class WOEError(ValueError):
    """Counts that have no WOE (no events at all, no non-events at all, no rows)."""


def check_binary_labels(y, where: str = "the label column") -> np.ndarray:
    """``y`` as an int8 0/1 array; a clear error for a label that is not binary (IV is defined for
    a binary target: multiclass and regression are refused)."""
    y = np.asarray(y)
    if y.size == 0:
        raise WOEError(f"{where} is empty")
    if y.dtype.kind == "f" and np.isnan(y).any():
        raise WOEError(f"{where} has missing values")
    values = np.unique(y)
    if len(values) > 2 or not set(values.tolist()) <= {0, 1, True, False, 0.0, 1.0}:
        shown = ", ".join(map(str, values[:6].tolist())) + (", ..." if len(values) > 6 else "")
        integral = y.dtype.kind in "iub" or bool(np.all(np.asarray(values, dtype=np.float64) % 1 == 0))
        kind = "a multiclass" if len(values) <= 20 and integral else "a non-binary"
        what = "" if integral else "; a regression label"
        raise WOEError(f"{where} is {kind} target (values {shown}{what}): information value and weight of evidence "
                       "are defined for binary targets only (label 0/1, 1 = event); screen a binary label")
    if len(values) < 2:
        raise WOEError(f"{where} has only one value ({values[0]}): no events or no non-events, so no WOE; "
                       "screening needs both classes")
    return y.astype(np.int8)


def woe_iv(rows, events, smoothing: float = ZERO_SMOOTHING) -> tuple[np.ndarray, np.ndarray, float, list[int]]:
    """WOE and IV contribution per bin from its ``rows`` and ``events`` (exact integers or noisy
    floats), and the total IV; bins without rows get NaN and add nothing. Returns
    ``(woe, iv_per_bin, iv, smoothed)`` where ``smoothed`` lists the bins whose WOE was smoothed
    (no events or no non-events)."""
    rows = np.asarray(rows, dtype=np.float64)
    events = np.asarray(events, dtype=np.float64)
    non = rows - events
    E, N = float(events.sum()), float(non.sum())
    if not E > 0:
        raise WOEError("no events among the rows: no WOE (the label has no 1)")
    if not N > 0:
        raise WOEError("no non-events among the rows: no WOE (the label has no 0)")
    woe = np.full(len(rows), np.nan)
    iv_bins = np.zeros(len(rows))
    smoothed = []
    for i in range(len(rows)):
        if not rows[i] > 0:
            continue
        e, n = events[i], non[i]
        if not (e > 0 and n > 0):
            smoothed.append(i)
            e, n = max(e, 0.0) + smoothing, max(n, 0.0) + smoothing
        woe[i] = math.log((n / N) / (e / E))
        iv_bins[i] = (non[i] / N - events[i] / E) * woe[i]
    return woe, iv_bins, float(iv_bins.sum()), smoothed


# --- merging bins ------------------------------------------------------------------------------
def _pav(rate: np.ndarray, weight: np.ndarray, increasing: bool) -> list[list[int]]:
    """Blocks of consecutive indices whose pooled rates are monotone (pool adjacent violators)."""
    blocks: list[list] = []          # [indices, sum of rate * weight, weight]
    for i in range(len(rate)):
        blocks.append([[i], rate[i] * weight[i], weight[i]])
        while len(blocks) > 1:
            a, b = blocks[-2], blocks[-1]
            ra, rb = a[1] / a[2], b[1] / b[2]
            if (ra > rb) if increasing else (ra < rb):
                blocks[-2:] = [[a[0] + b[0], a[1] + b[1], a[2] + b[2]]]
            else:
                break
    return [blk[0] for blk in blocks]


def _pooled(groups: list[list[int]], rows: np.ndarray, events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([rows[g].sum() for g in groups], dtype=np.float64),
            np.array([events[g].sum() for g in groups], dtype=np.float64))


def _nonempty_groups(rows: np.ndarray) -> list[list[int]]:
    """Consecutive bins, each empty bin pooled with the bin before it (or the first non-empty after)."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for i in range(len(rows)):
        if rows[i] > 0:
            groups.append(pending + [i])
            pending = []
        elif groups:
            groups[-1].append(i)
        else:
            pending.append(i)
    if pending:
        if groups:
            groups[-1].extend(pending)
        else:
            groups.append(pending)
    return groups


def monotone_groups(rows, events) -> list[list[int]]:
    """Groups of consecutive bins (value bins only: pass the counts without the missing slot)
    whose pooled WOE is monotone in the bin order: increasing or decreasing, whichever keeps the
    higher IV. Empty bins are pooled with a neighbour."""
    rows = np.asarray(rows, dtype=np.float64)
    events = np.asarray(events, dtype=np.float64)
    base = _nonempty_groups(rows)
    if len(base) <= 1:
        return base
    r, e = _pooled(base, rows, events)
    rate = e / r
    best, best_iv = None, -1.0
    for increasing in (True, False):
        blocks = _pav(rate, r, increasing)
        groups = [sum((base[j] for j in blk), []) for blk in blocks]
        gr, ge = _pooled(groups, rows, events)
        try:
            iv = woe_iv(gr, ge)[2] if ge.sum() > 0 and (gr - ge).sum() > 0 else 0.0
        except WOEError:
            iv = 0.0
        if iv > best_iv + 1e-15:
            best, best_iv = groups, iv
    return best


def min_share_groups(groups: list[list[int]], rows, min_rows: float) -> list[list[int]]:
    """Pool every group with fewer than ``min_rows`` rows with its smaller neighbour until none is left
    (or one group remains)."""
    rows = np.asarray(rows, dtype=np.float64)
    groups = [list(g) for g in groups]
    while len(groups) > 1:
        sizes = [rows[g].sum() for g in groups]
        small = [i for i, s in enumerate(sizes) if s < min_rows]
        if not small:
            break
        i = min(small, key=lambda k: sizes[k])
        if i == 0:
            j = 1
        elif i == len(groups) - 1:
            j = i - 1
        else:
            j = i - 1 if sizes[i - 1] <= sizes[i + 1] else i + 1
        a, b = min(i, j), max(i, j)
        groups[a:b + 1] = [groups[a] + groups[b]]
    return groups


def groups_to_labels(groups: list[list[int]], n_value_bins: int) -> np.ndarray:
    """Group index of every value bin (what the passive party receives: bin-index groups)."""
    out = np.full(n_value_bins, -1, dtype=np.int32)
    for k, g in enumerate(groups):
        out[np.asarray(g, dtype=np.int64)] = k
    if (out < 0).any():
        raise ValueError("the groups do not cover every bin")
    return out


def check_group_labels(labels: np.ndarray, n_value_bins: int) -> list[list[int]]:
    """The groups of a label array, refused unless they are consecutive runs numbered 0, 1, ... in bin
    order (the only merges screening makes)."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.shape != (n_value_bins,):
        raise ValueError(f"{len(labels)} group labels for {n_value_bins} value bins")
    if n_value_bins and (labels[0] != 0 or np.any(np.diff(labels) < 0) or np.any(np.diff(labels) > 1)):
        raise ValueError("group labels must number consecutive runs of bins 0, 1, 2, ... in bin order")
    return [np.flatnonzero(labels == k).tolist() for k in range(int(labels.max()) + 1 if n_value_bins else 0)]


# --- one feature's screening -------------------------------------------------------------------
@dataclass
class FeatureScreen:
    """The screening of one feature: its bins (each a group of the binner's value bins, then the
    missing slot), their rows, events and WOE, its IV and the share of missing values."""
    party: str
    position: int                 # the feature's index among its party's features
    feature: str                  # its name (a passive party's feature: "#<position>" unless known locally)
    groups: list                  # per reported bin: the binner's bin indices it pools ([] for missing)
    rows: np.ndarray
    events: np.ndarray
    woe: np.ndarray
    iv_bins: np.ndarray
    iv: float
    missing_share: float
    n_rows: float
    notes: list = field(default_factory=list)
    labels: list | None = None    # per reported bin, a value range (only where its owner's edges are known)

    def bins_table(self) -> list[dict]:
        out = []
        for k, g in enumerate(self.groups):
            missing = k == len(self.groups) - 1
            out.append({"bin": "missing" if missing else k,
                        "bins": "missing" if missing else (f"{g[0]}" if len(g) == 1 else f"{g[0]}-{g[-1]}"),
                        **({"range": self.labels[k]} if self.labels is not None else {}),
                        "rows": _num(self.rows[k]), "events": _num(self.events[k]),
                        "woe": None if not np.isfinite(self.woe[k]) else float(self.woe[k]),
                        "iv": float(self.iv_bins[k])})
        return out

    def to_dict(self) -> dict:
        return {"party": self.party, "position": self.position, "feature": self.feature, "iv": self.iv,
                "missing_share": self.missing_share, "n_rows": _num(self.n_rows), "n_bins": len(self.groups) - 1,
                "notes": list(self.notes), "bins": self.bins_table()}


def _num(x):
    x = float(x)
    return int(x) if x.is_integer() else x


def screen_feature(party: str, position: int, feature: str, rows, events, monotone: bool = False,
                   min_share: float = 0.0) -> tuple[FeatureScreen, np.ndarray]:
    """Screen one feature from its per-slot counts (the binner's value bins, the missing slot last).
    Returns the screening and the group label of every value bin (what the owner is told)."""
    rows = np.asarray(rows, dtype=np.float64)
    events = np.asarray(events, dtype=np.float64)
    n_value = len(rows) - 1
    vr, ve = rows[:n_value], events[:n_value]
    notes = []
    total = float(rows.sum())
    if monotone:
        groups = monotone_groups(vr, ve)
    else:
        groups = _nonempty_groups(vr) if n_value else []
    if min_share > 0 and groups:
        groups = min_share_groups(groups, vr, min_share * total)
    if not groups:
        groups = [[]]
    labels = groups_to_labels(groups, n_value) if n_value else np.zeros(0, dtype=np.int32)
    gr, ge = _pooled(groups, vr, ve) if n_value else (np.zeros(1), np.zeros(1))
    grp_rows = np.concatenate([gr, rows[n_value:]])
    grp_events = np.concatenate([ge, events[n_value:]])
    nonempty_value = int(np.count_nonzero(gr > 0))
    if nonempty_value <= 1 and not rows[n_value] > 0 or nonempty_value == 0:
        notes.append("constant feature: all its rows fall in one bin (IV 0)")
    elif nonempty_value <= 1:
        notes.append("constant feature apart from its missing values: one value bin")
    woe, iv_bins, iv, smoothed = woe_iv(grp_rows, grp_events)
    for kind, which in (("no events", [i for i in smoothed if not grp_events[i] > 0]),
                        ("no non-events", [i for i in smoothed if grp_events[i] > 0])):
        if which:
            names = ", ".join("missing" if i == len(grp_rows) - 1 else str(i) for i in which)
            notes.append(f"bin(s) {names} have {kind}: their WOE is smoothed (+{ZERO_SMOOTHING} to both counts)")
    full_groups = [list(g) for g in groups] + [[]]
    fs = FeatureScreen(party, int(position), str(feature), full_groups, grp_rows, grp_events, woe, iv_bins, iv,
                       float(rows[n_value] / total) if total > 0 else 0.0, total, notes)
    return fs, labels


def naive_counts(bins: np.ndarray, y: np.ndarray, n_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows and events per slot of one binned column (the centralised computation)."""
    bins = np.asarray(bins, dtype=np.int64)
    return (np.bincount(bins, minlength=n_slots).astype(np.float64),
            np.bincount(bins, weights=np.asarray(y, dtype=np.float64), minlength=n_slots))


def kept_positions(ivs, min_iv: float) -> np.ndarray:
    """Positions of the features whose IV reaches ``min_iv`` (``--min-iv``)."""
    ivs = np.asarray(ivs, dtype=np.float64)
    return np.flatnonzero(ivs >= float(min_iv)).astype(np.int64)
