"""Scorecard points: the usual scaling of a binary model's log-odds to points.

``--points PDO,BASE_SCORE,BASE_ODDS``: a row whose odds of "good" (class 0) to "bad" (class 1,
the event the model predicts, e.g. a default) are ``BASE_ODDS`` scores ``BASE_SCORE`` points,
and every doubling of those odds adds ``PDO`` points (points to double the odds)::

    factor = PDO / ln 2
    offset = BASE_SCORE - factor * ln(BASE_ODDS)
    points = offset + factor * ln(odds),   odds = (1 - p) / p = exp(-margin)

so higher points mean lower risk (``600,50,20`` is the common choice: 600 points at 50:1 odds
... with PDO 20 written ``20,600,50``: PDO first). The margin is the model's raw log-odds of
class 1 (the sum of the trees and the base score), taken from the probability without loss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from datasets.errors import InputError


@dataclass(frozen=True)
class PointsScale:
    pdo: float          # points to double the odds (> 0)
    base_score: float   # the points of a row whose odds are base_odds
    base_odds: float    # odds good:bad (> 0) that score base_score

    @classmethod
    def parse(cls, text: str, what: str = "--points") -> "PointsScale":
        """``"PDO,BASE_SCORE,BASE_ODDS"`` (e.g. ``"20,600,50"``), each a finite number, PDO and
        BASE_ODDS above 0; else an InputError naming ``what``."""
        parts = [p.strip() for p in str(text).split(",")]
        if len(parts) != 3:
            raise InputError(f"{what} takes PDO,BASE_SCORE,BASE_ODDS (e.g. 20,600,50: 600 points at odds 50:1, "
                             f"20 more points each time the odds double), got {text!r}")
        try:
            pdo, base, odds = (float(p) for p in parts)
        except ValueError:
            raise InputError(f"{what}: {text!r} holds something that is not a number") from None
        if not all(math.isfinite(v) for v in (pdo, base, odds)):
            raise InputError(f"{what}: every value must be a finite number, got {text!r}")
        if pdo <= 0:
            raise InputError(f"{what}: PDO (points to double the odds) must be > 0, got {pdo:g}")
        if odds <= 0:
            raise InputError(f"{what}: BASE_ODDS (good:bad odds scoring BASE_SCORE) must be > 0, got {odds:g}")
        return cls(pdo, base, odds)

    @property
    def factor(self) -> float:
        return self.pdo / math.log(2.0)

    @property
    def offset(self) -> float:
        return self.base_score - self.factor * math.log(self.base_odds)

    def from_margin(self, margin) -> np.ndarray:
        """Points of raw log-odds of class 1 (``margin``): ``offset - factor * margin``."""
        return self.offset - self.factor * np.asarray(margin, dtype=np.float64)

    def from_proba(self, proba) -> np.ndarray:
        """Points of probabilities of class 1 (``ln((1 - p) / p)`` computed without cancellation)."""
        p = np.asarray(proba, dtype=np.float64)
        if p.ndim != 1:
            raise InputError("scorecard points need a binary model (one probability per row)")
        with np.errstate(divide="ignore"):
            log_odds = np.log1p(-p) - np.log(p)
        return self.offset + self.factor * log_odds

    def to_dict(self) -> dict:
        return {"pdo": self.pdo, "base_score": self.base_score, "base_odds": self.base_odds,
                "factor": self.factor, "offset": self.offset}
