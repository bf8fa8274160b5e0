"""What a training command prints per round: the training rows' metrics (the active party's
own rows and labels) and, with a validation set, the validation metrics."""
from __future__ import annotations

import math

from protocols.units import format_bytes

#: the hot-path stages, shown first
BREAKDOWN = ("encrypt", "histogram", "compress", "decrypt", "split_search", "total")


def round_timing(t: dict) -> str:
    """One round's time breakdown: the hot-path stages first, then the rest, then bytes."""
    keys = [k for k in BREAKDOWN if k in t] + [k for k in t if k not in BREAKDOWN and k != "bytes_sent"]
    parts = [f"{k} {t[k]:.3f}s" for k in keys]
    if "bytes_sent" in t:
        parts.append(f"sent {format_bytes(int(t['bytes_sent']))}")
    return ", ".join(parts)


def _metrics(values: dict) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in values.items() if isinstance(v, float) and math.isfinite(v))


def round_metrics(info: dict, train: bool = True) -> str:
    """``"train logloss 0.4132, auc 0.9120; validation logloss ..."`` of a round's ``info`` (the
    ``on_round`` dict: the history's last values, the round's validation metrics); ``train=False``
    leaves the training rows' metrics out (a DP released model: they are no part of the release)."""
    parts = []
    history = (info.get("history") or {}).get("train") or {}
    last = {k: float(v[-1]) for k, v in history.items() if v}
    if train and _metrics(last):
        parts.append("train " + _metrics(last))
    if info.get("validation"):
        parts.append("validation " + _metrics({k: float(v) for k, v in info["validation"].items()}))
    return "; ".join(parts)
