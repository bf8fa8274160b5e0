"""One boosting round, as the records the round pipeline hands around.

A round reads top to bottom (:meth:`vfl.core.boosting.Booster.fit`):

1. the objective gives gradients and hessians; rows are sampled; the
   gradients are quantised to fixed point (:mod:`vfl.core.fixedpoint`) with a
   precision planned from their bounds: a :class:`RoundGradients`;
2. observers hear :meth:`RoundObserver.round_started` (the active party
   packs and encrypts the round's gradients here, once for every passive
   party), then every histogram source receives the round;
3. the trees of the round are grown (:class:`vfl.core.grower.TreeGrower`);
4. observers receive the finished :class:`RoundRecord` (metrics and early
   stopping, checkpoints, progress, the caller's callback), any of which may
   stop training.

Timing lives in one place: the round's :class:`RoundTiming`, to which every
stage adds its seconds, whichever party or thread measured them.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from vfl.core.tree import Tree


class RoundTiming:
    """Seconds of one round by stage, and the bytes the round sent (thread-safe: histogram
    sources of several passive parties add their stages from fan-out threads).

    Stages: ``gradients`` (objective, sampling, quantisation, encryption and sending),
    ``histograms`` (the wall time of building every level's histograms), ``split_search``,
    ``apply_splits``, ``total``; the active party adds ``encrypt`` and ``decrypt`` (its own
    crypto), ``histogram`` and ``compress`` (the passive parties' reported compute time).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.bytes_sent: int | None = None

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + float(seconds)

    def get(self, stage: str) -> float:
        return self.seconds.get(stage, 0.0)

    def as_dict(self) -> dict:
        """``{stage: seconds, ..., "bytes_sent": n}`` (the per-tree breakdown users see)."""
        out = dict(self.seconds)
        if self.bytes_sent is not None:
            out["bytes_sent"] = int(self.bytes_sent)
        return out


@dataclass(frozen=True)
class RoundGradients:
    """What a round hands to whoever encrypts and to every histogram source: fixed-point
    integers, their bounds and precision (never floats, never a packing decision)."""

    round_idx: int
    g: np.ndarray                 # int64 (n_rows, n_targets), fixed point with ``precision_bits``
    h: np.ndarray                 # int64 (n_rows, n_targets)
    g_bound: float                # |g| <= g_bound for every row (what sizes the packing)
    h_bound: float                # 0 <= h <= h_bound
    precision_bits: int
    in_any_sample: np.ndarray | None   # rows some tree of the round uses (None: all rows)
    timing: RoundTiming

    @property
    def n_rows(self) -> int:
        return int(self.g.shape[0])

    @property
    def n_targets(self) -> int:
        return int(self.g.shape[1])

    def as_float(self) -> tuple[np.ndarray, np.ndarray]:
        """The quantised gradients as floats: what every node and histogram sum is made of. Made
        once per round and shared by every caller (read-only: one copy in memory, not one each)."""
        cached = self.__dict__.get("_float")
        if cached is None:
            scale = float(2 ** self.precision_bits)
            cached = (self.g / scale, self.h / scale)
            for a in cached:
                a.flags.writeable = False
            object.__setattr__(self, "_float", cached)
        return cached


@dataclass
class RoundRecord:
    """A finished round: its trees, the training rows' raw scores after it, its timing, and what
    the observers added (training and validation metrics, the running history)."""

    round_idx: int
    trees: list[Tree]
    raw: np.ndarray
    timing: RoundTiming
    validation: dict | None = None           # this round's validation metrics (monitor)
    history: dict = field(default_factory=dict)   # {"train": {metric: [...]}, "validation": {...}}

    def info(self) -> dict:
        """The dict a plain ``on_round(round_idx, info)`` callback receives: ``raw``, ``trees``,
        ``timing`` (the per-stage dict), ``history`` and, with a validation set, ``validation``."""
        out = {"raw": self.raw, "trees": self.trees, "timing": self.timing.as_dict(), "history": self.history}
        if self.validation is not None:
            out["validation"] = self.validation
        return out


class RoundObserver:
    """Something that follows the rounds of a training. Both methods are optional."""

    def round_started(self, gradients: RoundGradients) -> None:
        """Before any histogram source receives the round."""

    def round_finished(self, record: RoundRecord) -> bool | None:
        """After the round's trees are grown and the raw scores updated; True stops training
        (the round is kept)."""


class CallbackObserver(RoundObserver):
    """A plain ``on_round(round_idx, info)`` function as an observer (see :meth:`RoundRecord.info`)."""

    def __init__(self, on_round):
        self.on_round = on_round

    def round_finished(self, record: RoundRecord) -> bool | None:
        return self.on_round(record.round_idx, record.info())
