"""Per-round metrics, the validation set and early stopping, for the active party.

The validation rows are aligned like the training set: with ``align="hash"``
the active party hashes its validation ids with the federation's salt and
sends them in :class:`protocols.messages.EvalStart`; with ``align="psi"`` it
runs a PSI of purpose ``"validate"``. Every passive party finds its own rows
for them (loaded locally with ``PassiveParty.load_validation_data``; every
validation id must be held by every party) and keeps them as a prediction
session. After each round only **that round's trees** are evaluated for the
validation rows, by the default prediction protocol (one-round leaf masks:
one ``LeafMaskRequest`` per passive party that owns a split of the round, see
:mod:`vfl.core.leafmask`), and added to running raw scores, so the cost per round
does not grow with the number of trees.

History: ``{"train": {metric: [per round]}, "validation": {...}}`` with every
metric of the objective (``vfl.core.params.EVAL_METRICS``). With
``early_stopping_rounds`` training stops once the watched metric
(``eval_metric``, default the objective's first) has not improved for that
many rounds; the model keeps all rounds grown and ``best_iteration`` (0-based),
which predictions use by default.

Leakage: as in prediction. A passive party learns which of its rows are
validation rows (with ``hash`` alignment also their salted hashes) and, per
round, the shape of the round's trees and its own record ids in them; the
active party learns the passive party's decision at each of its nodes of the
round for every validation row.
"""
from __future__ import annotations

import secrets

import numpy as np

from datasets.errors import InputError
from parties.psi_align import psi_match
from parties.remote import leaf_mask_fetcher
from protocols import alignment
from protocols import messages as m
from vfl.core.metrics import evaluate, is_better
from vfl.core.model import BoostedModel
from vfl.core.params import EVAL_METRICS, Alignment
from vfl.core.rounds import RoundObserver, RoundRecord


class TrainingMonitor(RoundObserver):
    """Computes each round's metrics and decides early stopping (a round observer)."""

    def __init__(self, objective, params, y_train):
        self.loss, self.params, self.y_train = objective, params, y_train
        self.metrics = EVAL_METRICS[params.objective]
        self.metric = params.metric
        self.history: dict = {"train": {k: [] for k in self.metrics}}
        self.best_iteration: int | None = None
        self.best_score: float | None = None
        self.stopped_early = False
        self._val = None

    # -- validation ---------------------------------------------------------
    def start_validation(self, transport, passives, model_id, salt: bytes, active_name, active_features,
                         val_ids, X_val, y_val) -> None:
        """Check the validation labels and open a validation session at every passive party."""
        y = self.loss.encode_labels(y_val, active_name, "label (validation set)")
        if self.metric == "auc" and len(np.unique(y)) < 2:
            raise InputError("the validation set holds a single class: AUC (eval_metric) is undefined")
        session_id = secrets.token_hex(8)
        if self.params.align == Alignment.PSI:
            match = psi_match(transport, passives, active_name, val_ids, alignment.new_salt(), session_id,
                              "validate", model_id)
            for p, held in match.held.items():
                missing = int(np.sum(held < 0))
                if missing:
                    raise InputError(f"validation set does not align: party {p!r} has no row for {missing} "
                                     f"of the {len(held)} validation ids")
            transport.call_many({p: m.PsiResult(session_id, held) for p, held in match.held.items()})
        else:
            hashes = alignment.hash_ids(val_ids, salt)
            alignment.check_unique_hashes(hashes, active_name, "validation ids")
            transport.call_many({p: m.EvalStart(model_id, session_id, hashes) for p in passives})
        K = self.loss.n_targets
        self._val = {"fetch_masks": leaf_mask_fetcher(transport, session_id), "X": X_val, "y": y,
                     "raw": np.tile(self.loss.base_score(self.y_train), (len(y), 1)).astype(np.float64),
                     "model": BoostedModel(self.loss.name, K, [0.0] * K, self.params.learning_rate,
                                           active_name, list(active_features), list(passives), model_id,
                                           salt.hex())}
        self.history["validation"] = {k: [] for k in self.metrics}

    # -- per round ----------------------------------------------------------
    def _evaluate(self, y, raw) -> dict:
        return evaluate(self.metrics, y, self.loss.transform(raw), self.params.huber_slope)

    def _validate_round(self, r: int, trees) -> dict:
        """Add round ``r``'s trees to the validation scores; record the metrics; track the best."""
        v = self._val
        v["model"].rounds = [trees]       # only this round's trees
        v["raw"] += v["model"].predict_raw_one_round(v["X"], v["fetch_masks"])
        scores = self._evaluate(v["y"], v["raw"])
        for k, val in scores.items():
            self.history["validation"][k].append(val)
        if is_better(self.metric, scores[self.metric], self.best_score):
            self.best_score, self.best_iteration = scores[self.metric], r
        return scores

    def round_finished(self, record: RoundRecord) -> bool:
        """Metrics of the round (set on the record as ``validation`` and ``history``); True to stop."""
        r = record.round_idx
        for k, v in self._evaluate(self.y_train, record.raw).items():
            self.history["train"][k].append(v)
        stop = False
        if self._val is not None:
            record.validation = self._validate_round(r, record.trees)
            if self.params.early_stopping_rounds is not None and self.best_iteration is not None and \
                    r - self.best_iteration >= self.params.early_stopping_rounds:
                stop = self.stopped_early = True
        record.history = self.history
        return stop

    def restore(self, rounds, history: dict | None) -> None:
        """Resuming a training: the training history of the first rounds comes from the checkpoint
        (NaN where it has none); the validation scores of those rounds are recomputed, one round
        at a time, so that the running scores and the best iteration are as if never interrupted."""
        n = len(rounds)
        saved = (history or {}).get("train", {})
        for k in self.metrics:
            vals = list(saved.get(k, []))[:n]
            self.history["train"][k] = vals + [float("nan")] * (n - len(vals))
        if self._val is not None:
            for r, trees in enumerate(rounds):
                self._validate_round(r, trees)

    def finish(self, model: BoostedModel) -> None:
        model.history = self.history
        if self.params.early_stopping_rounds is not None:
            model.best_iteration = self.best_iteration
        model.params = {**model.params, "eval_metric": self.metric}
