"""Evaluating a scoring job batch by batch (issue 34): the true labels (and segment values) kept from
the active party's rows, the model's output beside them, and the credit metrics at the end
(:func:`vfl.core.credit_metrics.credit_report`). Used by `vfl predict --label-col`."""
from __future__ import annotations

import numpy as np
import pandas as pd

from datasets.errors import InputError
from vfl.core import credit_metrics


class BatchEvaluation:
    """Labels and outputs of every batch of ``data`` (its first batch ``first`` checked at once:
    a missing label or segment column is an error before any row is scored)."""

    def __init__(self, model, first: pd.DataFrame, data: str, label_col: str | None, segment: str | None):
        if label_col is None:
            raise InputError(f"--segment {segment!r} needs --label-col: segments split an evaluation, and "
                             "evaluating needs the true labels")
        cols = [str(c) for c in first.columns]
        if label_col not in first.columns:
            raise InputError(f"{data}: no label column {label_col!r}, so this batch cannot be evaluated (its columns: "
                             f"{', '.join(cols[:20])}{', ...' if len(cols) > 20 else ''}); score it without "
                             "--label-col, or give the column that holds the true labels")
        if label_col in model.active_features:
            raise InputError(f"--label-col {label_col!r} is one of the model's features, not a label")
        if segment is not None and segment not in first.columns:
            raise InputError(f"{data}: segment column {segment!r} is not a column of the active party's data (its "
                             f"columns: {', '.join(cols[:20])}{', ...' if len(cols) > 20 else ''})")
        self.model, self.data, self.label_col, self.segment = model, data, label_col, segment
        self.labels, self.segments, self.outputs = [], [], []

    def add(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Keep a batch's labels (and segments); returns the frame to score (without the label)."""
        if self.label_col not in frame.columns:
            raise InputError(f"{self.data}: a batch lacks the label column {self.label_col!r}")
        self.labels.append(credit_metrics.encode_labels(self.model.objective, frame[self.label_col].to_numpy(),
                                                        self.model.classes, f"{self.data}: column {self.label_col!r}"))
        if self.segment is not None:
            self.segments.append(frame[self.segment].to_numpy(dtype=object))
        return frame.drop(columns=[self.label_col])

    def add_output(self, output) -> None:
        self.outputs.append(np.asarray(output, dtype=np.float64))

    def report(self) -> dict:
        y = np.concatenate(self.labels) if self.labels else np.zeros(0)
        out = np.concatenate(self.outputs) if self.outputs else np.zeros(0)
        seg = np.concatenate(self.segments) if self.segment is not None and self.segments else None
        return credit_metrics.credit_report(self.model.objective, y, out, self.model.classes, segments=seg,
                                            segment_name=self.segment)
