"""scikit-learn estimators over a simulated federation (part of the public API layer).

It wires no party itself: each ``fit`` asks :mod:`vfl.api` for an in-process
:class:`vfl.api.Federation` (:func:`~vfl.api.federation_from_frames`; every
message still serialized to bytes) built from **one DataFrame per party**::

    from vfl import VerticalBoostingClassifier
    clf = VerticalBoostingClassifier(n_estimators=20, mode="he", key_bits=2048)
    clf.fit({"bank": bank_df, "telco": telco_df}, y)         # y: one label per bank_df row
    proba = clf.predict_proba({"bank": bank_new, "telco": telco_new})

Conventions:

* ``X`` is a dict ``{party name: DataFrame}`` (the first entry is the active
  party, the label holder) or a list of DataFrames (named ``party0``,
  ``party1``, ...). Every frame has the id column ``id_col``; rows are matched
  across parties by id (hashed), in any order. Predictions follow the rows of
  the active party's frame.
* ``y`` has one label per row of the active party's frame, in its order.
* ``eval_set=(X_val, y_val)`` in ``fit`` gives per-round metrics
  (``evals_result_``) and enables ``early_stopping_rounds``; ``best_iteration_``
  is then used by ``predict``.
* Hyperparameters are the :class:`vfl.params.TrainParams` fields with XGBoost's
  names (also ``mode="dp"`` with ``epsilon``, and ``align="psi"``), with TrainParams'
  defaults, checked in ``fit`` (so ``clone``/``get_params``/``set_params`` work as in
  scikit-learn). ``mode`` defaults to ``"he"`` (real Paillier).
* ``feature_importances_``: one value per feature, parties in order and each
  party's features in frame order (``feature_names_in_``, ``feature_parties_``),
  normalised to sum 1; ``importance_type`` ``"gain"`` (total gain; the simulated
  active party shares each passive party's split gains with it, see README) or
  ``"split"``. Each party computes its own part.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.exceptions import NotFittedError

from datasets.errors import InputError
from datasets.frames import PartyFrame
from vfl.api import federation_from_frames
from vfl.objectives import get_objective
from vfl.params import Objective, TrainParams

__all__ = ["VerticalBoostingClassifier", "VerticalBoostingRegressor"]
_D = TrainParams.default        # the hyperparameter defaults are TrainParams' (one place)

_LABEL = "__vfl_label__"
_COMMON = ("n_estimators", "max_depth", "learning_rate", "max_bin", "reg_lambda", "min_child_weight", "gamma",
           "subsample", "goss", "top_rate", "other_rate", "early_stopping_rounds", "eval_metric", "mode",
           "key_bits", "encryption", "precision_bits", "seed", "align", "epsilon", "epsilon_per_feature")


def _party_frames(X, what: str = "X") -> list[tuple[str, pd.DataFrame]]:
    if isinstance(X, dict):
        items = [(str(k), v) for k, v in X.items()]
    elif isinstance(X, (list, tuple)):
        items = [(f"party{i}", v) for i, v in enumerate(X)]
    else:
        raise InputError(f"{what} must be a dict {{party name: DataFrame}} or a list of DataFrames (one per "
                         f"party), got {type(X).__name__}")
    if not items:
        raise InputError(f"{what} holds no party")
    for name, frame in items:
        if not isinstance(frame, pd.DataFrame):
            raise InputError(f"{what}: party {name!r} must be a pandas DataFrame, got {type(frame).__name__}")
    return items


class _VerticalBoosting(BaseEstimator):
    _objective_default = "binary"

    def __init__(self, n_estimators=_D("n_estimators"), max_depth=_D("max_depth"),
                 learning_rate=_D("learning_rate"), max_bin=_D("max_bin"), reg_lambda=_D("reg_lambda"),
                 min_child_weight=_D("min_child_weight"), gamma=_D("gamma"), subsample=_D("subsample"),
                 goss=_D("goss"), top_rate=_D("top_rate"), other_rate=_D("other_rate"),
                 early_stopping_rounds=_D("early_stopping_rounds"), eval_metric=_D("eval_metric"),
                 mode=_D("mode"), key_bits=_D("key_bits"), encryption=_D("encryption"),
                 precision_bits=_D("precision_bits"), seed=_D("seed"), id_col="id", importance_type="gain",
                 align=_D("align"), epsilon=_D("epsilon"), epsilon_per_feature=_D("epsilon_per_feature")):
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.max_bin = max_bin
        self.reg_lambda = reg_lambda
        self.min_child_weight = min_child_weight
        self.gamma = gamma
        self.subsample = subsample
        self.goss = goss
        self.top_rate = top_rate
        self.other_rate = other_rate
        self.early_stopping_rounds = early_stopping_rounds
        self.eval_metric = eval_metric
        self.mode = mode
        self.key_bits = key_bits
        self.encryption = encryption
        self.precision_bits = precision_bits
        self.seed = seed
        self.id_col = id_col
        self.importance_type = importance_type
        self.align = align
        self.epsilon = epsilon
        self.epsilon_per_feature = epsilon_per_feature

    # -- helpers ------------------------------------------------------------
    def _train_params(self, objective: str, **extra) -> TrainParams:
        return TrainParams(objective=objective, **{k: getattr(self, k) for k in _COMMON}, **extra)

    def _frames_with_label(self, X, y, what):
        items = _party_frames(X, what)
        active_name, active = items[0]
        if self.id_col not in active.columns:
            raise InputError(f"{what}: party {active_name!r} has no id column {self.id_col!r}")
        if _LABEL in active.columns:
            raise InputError(f"{what}: party {active_name!r} has a column named {_LABEL!r} (reserved)")
        y = np.asarray(y, dtype=object) if not isinstance(y, np.ndarray) else y
        if y.ndim != 1 or len(y) != len(active):
            raise InputError(f"y has {np.shape(y)} labels but the active party {active_name!r} has "
                             f"{len(active)} rows in {what}: give one label per row of its frame")
        frame = active.copy()
        frame.insert(1 if frame.columns[0] == self.id_col else 0, _LABEL, y)
        return [(active_name, frame)] + items[1:]

    def _fit(self, X, y, eval_set, objective, **extra):
        params = self._train_params(objective, **extra)
        if not isinstance(self.importance_type, str) or self.importance_type not in ("gain", "split"):
            raise InputError(f"parameter importance_type must be 'gain' or 'split', got {self.importance_type!r}")
        items = self._frames_with_label(X, self._encode_y(y), "X")
        fed = federation_from_frames([PartyFrame(name, frame, self.id_col, _LABEL if i == 0 else None)
                                      for i, (name, frame) in enumerate(items)])
        validation = None
        if eval_set is not None:
            if not (isinstance(eval_set, (tuple, list)) and len(eval_set) == 2):
                raise InputError("eval_set must be a pair (X_val, y_val)")
            val_items = self._frames_with_label(eval_set[0], self._encode_y(eval_set[1], fit=False), "eval_set")
            names = [n for n, _ in items]
            if [n for n, _ in val_items] != names:
                raise InputError(f"eval_set parties {[n for n, _ in val_items]} differ from the parties of X {names}")
            validation = dict(val_items)
        elif params.early_stopping_rounds is not None:
            raise InputError("early_stopping_rounds needs an eval_set=(X_val, y_val) in fit")
        fed.fit(params, validation=validation)
        self.federation_ = fed
        self.model_ = fed.model
        self.party_names_ = [n for n, _ in items]
        names, parties = [], []
        for name, frame in items:
            feats = [c for c in frame.columns if c not in (self.id_col, _LABEL)]
            names += feats
            parties += [name] * len(feats)
        self.feature_names_in_ = np.array(names, dtype=object)
        self.feature_parties_ = np.array(parties, dtype=object)
        self.n_features_in_ = len(names)
        self.evals_result_ = fed.model.history
        self.best_iteration_ = fed.model.best_iteration
        self._importance_cache = None
        return self

    def _check_fitted(self):
        if not hasattr(self, "federation_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet: call fit first")

    def _predict_frames(self, X) -> dict:
        self._check_fitted()
        items = _party_frames(X)
        names = [n for n, _ in items]
        if names != self.party_names_:
            raise InputError(f"X has parties {names}, the model was fitted with {self.party_names_}")
        return dict(items)

    def _raw(self, X) -> np.ndarray:
        frames = self._predict_frames(X)        # checks fitted first
        return self.federation_.predict_raw(frames)

    @property
    def feature_importances_(self) -> np.ndarray:
        self._check_fitted()
        if self._importance_cache is None:
            imp = self.federation_.feature_importance(self.importance_type)
            vals = np.array([imp[p].get(f, 0.0) for p, f in zip(self.feature_parties_, self.feature_names_in_)])
            total = vals.sum()
            self._importance_cache = vals / total if total > 0 else vals
        return self._importance_cache


class VerticalBoostingClassifier(ClassifierMixin, _VerticalBoosting):
    """Federated gradient-boosted trees for classification (binary or multiclass softmax).

    Two classes train the binary objective, more the multiclass one; labels may be
    any integers or strings (``classes_``, sorted).
    """

    def _encode_y(self, y, fit=True):
        y = np.asarray(y)
        if y.ndim != 1:
            raise InputError(f"y must be one-dimensional, got shape {y.shape}")
        if fit:
            vals = pd.Series(y)
            if vals.isna().any():
                raise InputError(f"y has {int(vals.isna().sum())} missing labels")
            try:
                self.classes_ = np.unique(y)
            except TypeError:
                raise InputError("y mixes strings and numbers; use one kind of class label") from None
            if len(self.classes_) < 2:
                raise InputError(f"y holds a single class {self.classes_.tolist()}: need at least 2")
        index = {c: i for i, c in enumerate(self.classes_.tolist())}
        unknown = sorted({v for v in y.tolist() if v not in index}, key=str)
        if unknown:
            raise InputError(f"eval_set labels {unknown[:5]} are not among the training classes "
                             f"{self.classes_.tolist()[:10]}")
        return np.array([index[v] for v in y.tolist()], dtype=np.int64)

    def fit(self, X, y, eval_set=None):
        self._encode_y(y)           # sets classes_ (and checks y) before the objective is chosen
        objective = Objective.BINARY.value if len(self.classes_) == 2 else Objective.MULTICLASS.value
        return self._fit(X, y, eval_set, objective)

    def predict_proba(self, X) -> np.ndarray:
        """``(n_samples, n_classes)`` class probabilities, columns in ``classes_`` order."""
        raw = self._raw(X)
        out = get_objective(self.model_.objective).transform(raw)
        return np.column_stack([1.0 - out, out]) if out.ndim == 1 else out

    def predict(self, X) -> np.ndarray:
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]


class VerticalBoostingRegressor(RegressorMixin, _VerticalBoosting):
    """Federated gradient-boosted trees for regression: ``objective`` ``"regression"``
    (squared error) or ``"pseudohuber"`` (with ``huber_slope``)."""

    def __init__(self, n_estimators=_D("n_estimators"), max_depth=_D("max_depth"),
                 learning_rate=_D("learning_rate"), max_bin=_D("max_bin"), reg_lambda=_D("reg_lambda"),
                 min_child_weight=_D("min_child_weight"), gamma=_D("gamma"), subsample=_D("subsample"),
                 goss=_D("goss"), top_rate=_D("top_rate"), other_rate=_D("other_rate"),
                 early_stopping_rounds=_D("early_stopping_rounds"), eval_metric=_D("eval_metric"),
                 mode=_D("mode"), key_bits=_D("key_bits"), encryption=_D("encryption"),
                 precision_bits=_D("precision_bits"), seed=_D("seed"), id_col="id", importance_type="gain",
                 align=_D("align"), epsilon=_D("epsilon"), epsilon_per_feature=_D("epsilon_per_feature"),
                 objective=Objective.REGRESSION.value, huber_slope=_D("huber_slope")):
        super().__init__(n_estimators=n_estimators, max_depth=max_depth, learning_rate=learning_rate,
                         max_bin=max_bin, reg_lambda=reg_lambda, min_child_weight=min_child_weight, gamma=gamma,
                         subsample=subsample, goss=goss, top_rate=top_rate, other_rate=other_rate,
                         early_stopping_rounds=early_stopping_rounds, eval_metric=eval_metric, mode=mode,
                         key_bits=key_bits, encryption=encryption, precision_bits=precision_bits, seed=seed,
                         id_col=id_col, importance_type=importance_type, align=align, epsilon=epsilon,
                         epsilon_per_feature=epsilon_per_feature)
        self.objective = objective
        self.huber_slope = huber_slope

    def _encode_y(self, y, fit=True):
        try:
            y = np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError("y must hold numbers for a regressor") from None
        if y.ndim != 1:
            raise InputError(f"y must be one-dimensional, got shape {y.shape}")
        bad = ~np.isfinite(y)
        if bad.any():
            raise InputError(f"y has {int(bad.sum())} NaN/inf values (rows {np.flatnonzero(bad)[:5].tolist()}); "
                             "a regression target must be finite")
        return y

    def fit(self, X, y, eval_set=None):
        if self.objective not in (Objective.REGRESSION, Objective.PSEUDOHUBER):
            raise InputError(f"parameter objective must be 'regression' or 'pseudohuber', got {self.objective!r}")
        return self._fit(X, y, eval_set, self.objective, huber_slope=self.huber_slope)

    def predict(self, X) -> np.ndarray:
        return self._raw(X)[:, 0]
