"""Warm start on the active side: continue a completed model with more rounds (issue 37).

A warm-started training is a *new* model (a new model id) that starts from the saved model's
rounds, like XGBoost's ``xgb_model``:

* the saved model's id salt is kept (the rows align in the same order, and every passive party
  finds the base's records under the same salt);
* the raw scores of the training rows after the saved rounds are the saved model's predictions
  of those rows (the ordinary prediction protocol, before any round): the base score plus the
  leaf values in the order training added them, so bit for bit the scores an uninterrupted
  training had;
* every passive party is told, right after ``TrainSetup``, which of its completed models to
  continue (``TrainContinue``; :mod:`parties.passive_warm` holds it to its rules); its records
  keep their ids, the new rounds' records follow;
* rounds are numbered on from the saved model's, so each round's row sample (keyed on the round
  index and the row, :mod:`vfl.core.sampling`) is the one an all-at-once training draws.

With the same data and parameters, ``n`` rounds and then ``m`` more give the trees of ``n + m``
rounds at once. What may change: ``n_estimators`` (the new total, more than the saved rounds),
the mode between ``he`` and ``plain`` (the same trees), the key and encryption settings, and
``eval_metric``/``early_stopping_rounds``. The saved model's base score is kept.
"""
from __future__ import annotations

import numpy as np

from datasets.errors import InputError
from parties.checkpoint import RESUMABLE_CHANGES, _param, records_per_party
from vfl.core.model import BoostedModel
from vfl.core.params import Mode, TrainParams

#: parameters a warm start may change (besides the RESUMABLE_CHANGES of a resume)
WARM_CHANGES = RESUMABLE_CHANGES + ("mode", "eval_metric", "early_stopping_rounds")


class WarmStart:
    """The saved model a training continues, checked against this training's parties and parameters."""

    def __init__(self, model, active_party: str, passives, params: TrainParams, feature_names, categories):
        if not isinstance(model, BoostedModel):
            raise InputError(f"warm_start must be a trained model (BoostedModel) or its directory, got "
                             f"{type(model).__name__}")
        self.model = model
        where = f"warm start from model {model.model_id!r}"
        if Mode.DP in (params.mode, model.params.get("mode")) or params.dp_model is not None \
                or model.dp_model is not None:
            raise InputError(f"{where}: dp-mode trainings and DP released models cannot be continued (each "
                             "noisy release happens once per training)")
        if model.active_party != active_party:
            raise InputError(f"{where}: it belongs to active party {model.active_party!r}, not {active_party!r}")
        if list(model.passives) != list(passives):
            raise InputError(f"{where}: it was trained with passive parties {list(model.passives)} (in this "
                             f"order), not {list(passives)}")
        if list(model.active_features) != list(feature_names):
            raise InputError(f"{where}: it was trained on active features {list(model.active_features)[:10]}, "
                             f"this party has {list(feature_names)[:10]}")
        if {f: list(v) for f, v in (model.categories or {}).items()} != \
                {f: list(v) for f, v in (categories or {}).items()}:
            raise InputError(f"{where}: the categories of the active party's categorical features differ from "
                             "the saved model's")
        new = params.to_dict()
        diff = sorted(k for k in set(new) | set(model.params)
                      if k not in WARM_CHANGES and k != "privacy" and _param(new, k) != _param(model.params, k))
        if diff:
            raise InputError(f"{where}: training parameters differ from the saved model's: " + ", ".join(
                f"{k} {_param(model.params, k)!r} -> {_param(new, k)!r}" for k in diff))
        if params.n_estimators <= model.n_rounds:
            raise InputError(f"{where}: the saved model has {model.n_rounds} rounds; n_estimators "
                             f"{params.n_estimators} is the new total and must be larger")
        self.n_rounds = model.n_rounds
        self.records = records_per_party(model.rounds, list(passives))

    @property
    def salt(self) -> bytes:
        return bytes.fromhex(self.model.salt)

    def booster_kwargs(self, raw: np.ndarray, rounds: list | None = None) -> dict:
        """The booster's start: the saved rounds (appended to ``rounds`` if given) and the raw scores."""
        rounds = [] if rounds is None else rounds
        rounds[:] = [list(r) for r in self.model.rounds]
        return {"rounds": rounds, "start_round": self.n_rounds, "raw": np.array(raw, dtype=np.float64)}

    def base_score(self) -> list[float]:
        return [float(b) for b in self.model.base_score]
