"""scikit-learn estimators over a simulated federation (part of the public API layer).

It wires no party itself: each ``fit`` asks :mod:`vfl.api` for an in-process
:class:`vfl.api.Federation` (:func:`~vfl.api.federation_from_frames`; every
message still serialized to bytes). ``X`` comes in one of two forms.

**One table** (a numpy array, anything array-like, or a DataFrame), as every
scikit-learn tool passes it (``cross_val_score``, ``GridSearchCV``, ``Pipeline``);
the ``parties`` parameter says which columns each party holds::

    from vfl.estimators import VerticalBoostingClassifier
    clf = VerticalBoostingClassifier(mode="he", parties={"bank": ["age", "income"],
                                                         "telco": ["calls", "data_gb"]})
    clf.fit(X, y)                  # X: DataFrame with those four columns; y: one label per row
    proba = clf.predict_proba(X_new)

* ``parties``: ``{party name: [columns]}`` or a list of column lists (named
  ``party0``, ``party1``, ...); columns are labels of a DataFrame, positions
  (0, 1, ...) of an array. Every column goes to exactly one party; each passive
  party holds at least one column, the active party (the label holder) may hold
  none. Default (``parties=None``): the columns in order, split evenly over
  ``n_parties`` parties (``party0`` holds the label and, if the split is uneven,
  the fewer columns). ``parties``/``n_parties`` apply to this form only (``parties``
  with one DataFrame per party is an error; ``n_parties`` is then unused).
* ``label_party``: the party holding the label (default: the first one).
* Rows are matched by position (the estimator numbers them); a DataFrame must
  not hold the id column ``id_col`` unless ``parties`` gives it to a party as a
  feature. Predictions follow the rows of ``X``; ``feature_importances_``,
  ``feature_parties_`` (and ``feature_names_in_`` for a DataFrame with string
  column names) follow its columns.

**One DataFrame per party**: a dict ``{party name: DataFrame}`` (the first entry,
or ``label_party``, is the active party) or a list of DataFrames (``party0``,
``party1``, ...). Every frame has the id column ``id_col``; rows are matched across
parties by id (hashed), in any order; ``y`` and the predictions follow the rows of
the active party's frame::

    clf.fit({"bank": bank_df, "telco": telco_df}, y)          # y: one label per bank_df row
    proba = clf.predict_proba({"bank": bank_new, "telco": telco_new})

An estimator predicts from the form it was fitted on.

Conventions:

* ``n_estimators`` is the number of boosting rounds, as in XGBoost: one tree per round, one
  tree per class per round for a multiclass classifier (``n_estimators * n_classes`` trees).
* ``eval_set=(X_val, y_val)`` in ``fit`` gives per-round metrics
  (``evals_result_``) and enables ``early_stopping_rounds``; ``best_iteration_``
  is then used by ``predict``.
* ``sample_weight`` in ``fit``: one non-negative weight per row of ``X`` (of the
  active party's frame). Rows of weight 0 are left out, exactly as if absent (they
  shape no bin; a classifier's ``classes_`` are those of the other rows); the
  others train weighted (:meth:`vfl.api.Federation.fit`'s ``sample_weight``).
* Hyperparameters are the :class:`vfl.core.params.TrainParams` fields with XGBoost's
  names (also ``mode="dp"`` with ``epsilon``, and ``align="psi"``), with TrainParams'
  defaults, checked in ``fit`` (so ``clone``/``get_params``/``set_params`` work as in
  scikit-learn). ``mode`` defaults to ``"he"`` (real Paillier; ``scheme="ou"``: real
  Okamoto-Uchiyama, docs/schemes.md). ``random_state``
  (an int or a ``numpy.random.RandomState``), when set, gives the ``seed``; the simulated
  parties' DP noise never follows it (fresh OS noise), so a DP fit is not reproducible, others are.
* Credit-risk options (issue 15): ``categorical`` names columns to treat as categories
  (text and pandas ``category`` columns always are), ``monotone_constraints`` is
  ``{column: +1 | -1}`` over any party's columns (each goes to the party holding it;
  ``PARTY:COLUMN`` where several parties use a name), ``sample_weight`` in ``fit``.
* ``feature_importances_``: one value per feature, normalised to sum 1;
  ``importance_type`` ``"gain"`` (total gain; the simulated active party shares each
  passive party's split gains with it, see docs/learner.md) or ``"split"``. Each party
  computes its own part.
* Warm start (continue a model with more rounds; ``n_estimators`` is the new total, the other
  hyperparameters those of that model): ``fit(X, y, xgb_model=...)`` as in XGBoost (a fitted
  estimator of the same class, a :class:`vfl.api.Federation` or a model directory), or
  scikit-learn's ``warm_start=True``: the next ``fit`` of a fitted estimator continues its own
  model. With the same data, ``n`` rounds and then more give the trees of all rounds at once
  (docs/learner.md).
* A fitted estimator pickles (``pickle``/``joblib``): the federation is kept as the
  parties' model dicts (:meth:`vfl.api.Federation.model_dicts`, the model files'
  content), rebuilt on unpickling.
"""
from __future__ import annotations

import numbers

import numpy as np
import pandas as pd
from scipy import sparse
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.exceptions import NotFittedError
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, column_or_1d, validate_data

from datasets.errors import InputError
from datasets.frames import PartyFrame
from vfl.api import Federation, federation_from_frames, split_constraints
from vfl.core import credit_metrics
from vfl.core.objectives import get_objective
from vfl.core.params import Objective, TrainParams

__all__ = ["VerticalBoostingClassifier", "VerticalBoostingRegressor"]
_D = TrainParams.default        # the hyperparameter defaults are TrainParams' (one place)

_LABEL = "__vfl_label__"
_ROW_ID = "__vfl_row__"         # the id column of the single-table form (row positions)
_COMMON = ("n_estimators", "max_depth", "learning_rate", "max_bin", "reg_lambda", "min_child_weight", "gamma",
           "subsample", "goss", "top_rate", "other_rate", "early_stopping_rounds", "eval_metric", "mode",
           "key_bits", "encryption", "scheme", "precision_bits", "seed", "align", "epsilon", "epsilon_per_feature",
           "dp_unsafe_noise_seed", "active_only_rounds", "min_node_rows")
_SHOWN = 8                      # column names an error message lists at most

def _show(values) -> str:
    values = list(values)
    text = ", ".join(repr(v.item() if isinstance(v, np.generic) else v) for v in values[:_SHOWN])
    return text + (f", ... ({len(values)} in total)" if len(values) > _SHOWN else "")


def _is_party_form(X) -> bool:
    """One DataFrame per party (a dict, or a list/tuple holding DataFrames) rather than one table."""
    if isinstance(X, dict):
        return not sparse.issparse(X)         # scipy's dok matrix is a dict
    return isinstance(X, (list, tuple)) and any(isinstance(v, pd.DataFrame) for v in X)


def _party_frames(X, what: str = "X") -> list[tuple[str, pd.DataFrame]]:
    items = [(str(k), v) for k, v in X.items()] if isinstance(X, dict) else \
        [(f"party{i}", v) for i, v in enumerate(X)]
    if not items:
        raise InputError(f"{what} holds no party")
    for name, frame in items:
        if not isinstance(frame, pd.DataFrame):
            raise InputError(f"{what}: party {name!r} must be a pandas DataFrame, got {type(frame).__name__}")
    return items


def _as_input_error(exc: ValueError) -> InputError:
    return exc if isinstance(exc, InputError) else InputError(str(exc))


class _VerticalBoosting(BaseEstimator):

    def __init__(self, n_estimators=_D("n_estimators"), max_depth=_D("max_depth"),
                 learning_rate=_D("learning_rate"), max_bin=_D("max_bin"), reg_lambda=_D("reg_lambda"),
                 min_child_weight=_D("min_child_weight"), gamma=_D("gamma"), subsample=_D("subsample"),
                 goss=_D("goss"), top_rate=_D("top_rate"), other_rate=_D("other_rate"),
                 early_stopping_rounds=_D("early_stopping_rounds"), eval_metric=_D("eval_metric"),
                 mode=_D("mode"), key_bits=_D("key_bits"), encryption=_D("encryption"), scheme=_D("scheme"),
                 precision_bits=_D("precision_bits"), seed=_D("seed"), id_col="id", importance_type="gain",
                 align=_D("align"), epsilon=_D("epsilon"), epsilon_per_feature=_D("epsilon_per_feature"),
                 parties=None, n_parties=2, label_party=None, random_state=None, categorical=None,
                 monotone_constraints=None, dp_unsafe_noise_seed=_D("dp_unsafe_noise_seed"),
                 active_only_rounds=_D("active_only_rounds"), min_node_rows=_D("min_node_rows"), warm_start=False):
        self.active_only_rounds = active_only_rounds     # first rounds on the label holder's features only
        self.min_node_rows = min_node_rows               # rows of every node and both children of every split
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
        self.scheme = scheme
        self.precision_bits = precision_bits
        self.seed = seed
        self.id_col = id_col
        self.importance_type = importance_type
        self.align = align
        self.epsilon = epsilon
        self.epsilon_per_feature = epsilon_per_feature
        self.parties = parties
        self.n_parties = n_parties
        self.label_party = label_party
        self.random_state = random_state
        self.categorical = categorical
        self.monotone_constraints = monotone_constraints
        self.dp_unsafe_noise_seed = dp_unsafe_noise_seed       # NOT PRIVATE: tests only
        self.warm_start = warm_start    # scikit-learn's: a fitted estimator's next fit continues its model

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True        # missing values are a learned direction of every split
        return tags

    # -- hyperparameters ----------------------------------------------------
    def _seed(self) -> int:
        if self.random_state is None:
            return self.seed
        if isinstance(self.random_state, numbers.Integral) and not isinstance(self.random_state, bool):
            if self.random_state < 0:
                raise InputError(f"parameter random_state must be >= 0, got {self.random_state}")
            return int(self.random_state)
        try:
            return int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        except ValueError:
            raise InputError(f"parameter random_state must be None, an integer or a numpy RandomState, got "
                             f"{self.random_state!r}") from None

    def _train_params(self, objective: str, **extra) -> TrainParams:
        values = {k: getattr(self, k) for k in _COMMON}
        values["seed"] = self._seed()
        return TrainParams(objective=objective, **values, **extra)

    # -- the single-table form ----------------------------------------------
    def _check_table(self, X, reset: bool):
        """Validate a single table (sklearn's rules: 2-D, no inf, n_features_in_, feature names)."""
        try:
            if isinstance(X, pd.DataFrame):       # columns go to the parties as they are (dtypes kept)
                validate_data(self, X, skip_check_array=True, reset=reset)
                if X.shape[0] == 0 or X.shape[1] == 0:
                    raise InputError(f"X has no {'row' if X.shape[0] == 0 else 'column'} (shape {X.shape})")
                return X
            return validate_data(self, X, reset=reset, dtype="numeric", ensure_all_finite="allow-nan")
        except ValueError as exc:
            raise _as_input_error(exc) from None

    def _resolve_layout(self, X) -> list[tuple[str, list[int]]]:
        """``[(party, [column positions])]`` from ``parties`` / ``n_parties`` / ``label_party``,
        the active party first; every column in exactly one party."""
        labels = list(X.columns) if isinstance(X, pd.DataFrame) else list(range(X.shape[1]))
        n = len(labels)
        for reserved in (_ROW_ID, _LABEL):
            if reserved in labels:
                raise InputError(f"X has a column named {reserved!r} (reserved)")
        spec = self.parties
        if spec is None:
            k = self.n_parties
            if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
                raise InputError(f"parameter n_parties must be an integer >= 1, got {k!r}")
            k = int(k)
            if n < k - 1:
                raise InputError(f"n_parties={k} needs at least {k - 1} feature columns, one per passive party, "
                                 f"but X has {n} feature(s): lower n_parties or give parties=")
            sizes = [len(c) for c in np.array_split(np.arange(n), k)][::-1]  # the active party: the fewer
            bounds = np.cumsum([0] + sizes)
            layout = [(f"party{i}", list(range(bounds[i], bounds[i + 1]))) for i in range(k)]
        else:
            if isinstance(spec, dict):
                entries = list(spec.items())
            elif isinstance(spec, (list, tuple)):
                entries = [(f"party{i}", cols) for i, cols in enumerate(spec)]
            else:
                raise InputError("parameter parties must be a dict {party name: [columns]} or a list of column "
                                 f"lists, got {type(spec).__name__}")
            if not entries:
                raise InputError("parameter parties holds no party")
            position = {label: j for j, label in enumerate(labels)}
            owner: dict[int, str] = {}
            layout = []
            for name, cols in entries:
                if not isinstance(name, str) or not name:
                    raise InputError(f"parties: party names must be non-empty strings, got {name!r}")
                if isinstance(cols, (str, bytes)) or not isinstance(cols, (list, tuple, np.ndarray, pd.Index)):
                    raise InputError(f"parties: party {name!r} must map to a list of columns, got {cols!r}")
                positions = []
                for col in cols:
                    j = self._column_position(col, position, X)
                    if j is None and not isinstance(X, pd.DataFrame) and isinstance(col, str):
                        raise InputError(
                            f"parties: party {name!r} names column {col!r}, but X is an array without column "
                            f"names (a Pipeline step such as SimpleImputer or StandardScaler outputs arrays): "
                            f"make the steps before this estimator output DataFrames, "
                            f"pipeline.set_output(transform=\"pandas\") (keeps the names; a ColumnTransformer "
                            f"also needs verbose_feature_names_out=False), or give parties column positions "
                            f"0..{n - 1}")
                    if j is None:
                        have = "columns " + _show(labels) if isinstance(X, pd.DataFrame) else \
                            f"columns 0..{n - 1} (an array: give positions)"
                        raise InputError(f"parties: party {name!r} names column {col!r}, which X does not have "
                                         f"(X has {have})")
                    if j in owner:
                        raise InputError(f"parties: column {labels[j]!r} is given to both party {owner[j]!r} and "
                                         f"party {name!r}; each column belongs to one party")
                    owner[j] = name
                    positions.append(j)
                layout.append((name, positions))
            if isinstance(X, pd.DataFrame) and self.id_col in position and position[self.id_col] not in owner:
                raise InputError(self._id_column_message())
            unassigned = [labels[j] for j in range(n) if j not in owner]
            if unassigned:
                raise InputError(f"parties: column(s) {_show(unassigned)} of X belong to no party; give every "
                                 f"column to exactly one party (drop the others before fit)")
        if spec is None and isinstance(X, pd.DataFrame) and self.id_col in labels:
            raise InputError(self._id_column_message())
        names = [name for name, _ in layout]
        if self.label_party is not None:
            if self.label_party not in names:
                raise InputError(f"label_party {self.label_party!r} is not one of the parties {names}")
            layout.sort(key=lambda entry: entry[0] != self.label_party)     # stable: the label holder first
        for name, positions in layout[1:]:
            if not positions:
                raise InputError(f"parties: passive party {name!r} has no column (a passive party holds at "
                                 f"least one feature)")
        return layout

    def _id_column_message(self) -> str:
        return (f"X has the id column {self.id_col!r}, but a single table's rows are matched by position: "
                f"drop it, give it to a party in parties= to use it as a feature, or pass one DataFrame per party")

    @staticmethod
    def _column_position(col, position: dict, X) -> int | None:
        if isinstance(X, pd.DataFrame):
            try:
                return position.get(col)
            except TypeError:           # unhashable
                return None
        if isinstance(col, bool) or not isinstance(col, numbers.Integral):
            return None
        return int(col) if 0 <= col < len(position) else None

    def _table_frames(self, X, labels=None, predict: bool = False) -> list[tuple[str, pd.DataFrame]]:
        """The parties' frames of a validated table (the fitted layout), the label in the active one.
        A table's rows have no identity: training rows are numbered 0..n-1, prediction rows -1..-n
        (new rows to every party: mode dp refuses to route the ids it released in training)."""
        ids = -1 - np.arange(X.shape[0]) if predict else np.arange(X.shape[0])
        items = []
        for i, (name, positions) in enumerate(self._layout):
            cols = [self._column_names[j] for j in positions]
            if isinstance(X, pd.DataFrame):
                frame = X.iloc[:, positions].reset_index(drop=True)
                frame.columns = cols
            else:
                frame = pd.DataFrame(X[:, positions], columns=cols)
            frame.insert(0, _ROW_ID, ids)
            if i == 0 and labels is not None:
                frame.insert(1, _LABEL, labels)
            items.append((name, frame))
        return items

    # -- fitting ------------------------------------------------------------
    def _require_y(self, y):
        if y is None:
            raise InputError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        return y

    def _check_y_length(self, y, n: int, what: str, whose: str):
        y = self._y_1d(self._require_y(y))
        if len(y) != n:
            raise InputError(f"y has {np.shape(y)} labels but {whose} has {n} rows in {what}: give one label "
                             f"per row")
        return y

    @staticmethod
    def _y_1d(y) -> np.ndarray:
        y = np.asarray(y) if not isinstance(y, np.ndarray) else y
        if y.ndim == 2 and y.shape[1] == 1:
            return column_or_1d(y, warn=True)      # DataConversionWarning, as every sklearn estimator
        if y.ndim != 1:
            raise InputError(f"y must be one-dimensional, got shape {y.shape}")
        return y

    def _labelled_items(self, X, y, what: str, keep=None):
        """``(items, y)``: the parties' frames with the encoded label in the active one; ``keep``: a mask
        of the rows that train (the others, of weight 0, are left out)."""
        if self._table:
            X = self._check_table(X, reset=what == "X")
            if what == "X":
                self._fit_layout(X)
            y = self._check_y_length(y, X.shape[0], what, "X")
            if keep is not None:
                X, y = (X.iloc[keep] if isinstance(X, pd.DataFrame) else X[keep]), y[keep]
            return self._table_frames(X, self._encode_y(y, fit=what == "X")), y
        items = self._ordered_party_frames(X, what)
        active_name, active = items[0]
        if self.id_col not in active.columns:
            raise InputError(f"{what}: party {active_name!r} has no id column {self.id_col!r}")
        if _LABEL in active.columns:
            raise InputError(f"{what}: party {active_name!r} has a column named {_LABEL!r} (reserved)")
        y = self._check_y_length(y, len(active), what, f"the active party {active_name!r}")
        if keep is not None:
            active, y = active.iloc[keep], y[keep]
        frame = active.copy()
        frame.insert(1 if frame.columns[0] == self.id_col else 0, _LABEL, self._encode_y(y, fit=what == "X"))
        return [(active_name, frame)] + items[1:], y

    def _ordered_party_frames(self, X, what: str):
        if self.parties is not None:
            raise InputError(f"{what} is already one DataFrame per party: parties= applies to a single table X; "
                             "leave it None")
        items = _party_frames(X, what)
        if self.label_party is not None:
            names = [n for n, _ in items]
            if self.label_party not in names:
                raise InputError(f"label_party {self.label_party!r} is not one of the parties {names} of {what}")
            items.sort(key=lambda item: item[0] != self.label_party)
        return items

    def _fit_layout(self, X):
        self._layout = self._resolve_layout(X)
        labels = list(X.columns) if isinstance(X, pd.DataFrame) else list(range(X.shape[1]))
        named = isinstance(X, pd.DataFrame) and all(isinstance(c, str) for c in labels)
        self._column_names = [str(c) for c in labels] if named else [f"f{j}" for j in range(len(labels))]

    def _fit(self, X, y, weights, keep, eval_set, objective, xgb_model=None, **extra):
        params = self._train_params(objective, **extra)
        if not isinstance(self.importance_type, str) or self.importance_type not in ("gain", "split"):
            raise InputError(f"parameter importance_type must be 'gain' or 'split', got {self.importance_type!r}")
        self._table = not _is_party_form(X)
        items, y = self._labelled_items(X, y, "X", keep)
        id_col = _ROW_ID if self._table else self.id_col
        frames = [PartyFrame(name, frame, id_col, _LABEL if i == 0 else None) for i, (name, frame) in enumerate(items)]
        monotone = None
        if self.monotone_constraints:       # each constraint goes to the party holding its column
            per_party = split_constraints(frames, self.monotone_constraints)
            params = TrainParams.from_dict({**params.to_dict(),
                                            "monotone_constraints": per_party[frames[0].name] or None})
            monotone = {f"{n}:{f}": c for n, cs in per_party.items() if n != frames[0].name for f, c in cs.items()}
        fed = federation_from_frames(frames, categorical=self.categorical, monotone=monotone)
        if params.dp_unsafe_noise_seed is not None:     # NOT PRIVATE: an explicit test option, never seed
            fed.unsafe_seed_dp_noise(params.dp_unsafe_noise_seed)
        validation = None
        if eval_set is not None:
            if not (isinstance(eval_set, (tuple, list)) and len(eval_set) == 2):
                raise InputError("eval_set must be a pair (X_val, y_val)")
            if _is_party_form(eval_set[0]) == self._table:
                raise InputError("eval_set: X_val must have the form of X (" +
                                 ("one table" if self._table else "one DataFrame per party") + ")")
            val_items, _ = self._labelled_items(eval_set[0], eval_set[1], "eval_set")
            names = [n for n, _ in items]
            if [n for n, _ in val_items] != names:
                raise InputError(f"eval_set parties {[n for n, _ in val_items]} differ from the parties of X {names}")
            validation = dict(val_items)
        elif params.early_stopping_rounds is not None:
            raise InputError("early_stopping_rounds needs an eval_set=(X_val, y_val) in fit")
        fit_kw = {} if weights is None else {"sample_weight": weights}
        if not isinstance(self.warm_start, (bool, np.bool_)):
            raise InputError(f"parameter warm_start must be True or False, got {self.warm_start!r}")
        if xgb_model is None and self.warm_start and hasattr(self, "federation_"):
            xgb_model = self.federation_        # scikit-learn's warm_start: continue the last fit
        if xgb_model is not None:       # XGBoost's name: continue that model (n_estimators: the new total)
            fit_kw["warm_start"] = self._warm_base(xgb_model)
        fed.fit(params, validation=validation, **fit_kw)
        self._set_fitted(fed, items, id_col)
        return self

    def _warm_base(self, xgb_model):
        """What ``fit(xgb_model=...)`` continues: a fitted estimator's federation, a Federation, or a
        model directory (:meth:`vfl.api.Federation.fit`'s ``warm_start``)."""
        if isinstance(xgb_model, _VerticalBoosting):
            if not hasattr(xgb_model, "federation_"):
                raise InputError("xgb_model: the estimator given is not fitted")
            if type(xgb_model) is not type(self):
                raise InputError(f"xgb_model: a {type(xgb_model).__name__} cannot be continued by a "
                                 f"{type(self).__name__}")
            return xgb_model.federation_
        return xgb_model

    def _sample_weights(self, sample_weight, y):
        """``(weights, keep)``: the weights of the rows that train (None: unweighted) and the mask of
        those rows (None: all). Checked like scikit-learn does; rows of weight 0 are left out, exactly
        as if absent (so they shape no bin either)."""
        if sample_weight is None:
            return None, None
        try:
            w = _check_sample_weight(sample_weight, np.empty((len(y), 0)), ensure_non_negative=True)
        except ValueError as exc:
            raise InputError(f"sample_weight: {exc}") from None
        self._check_weighted_labels(y, w)
        keep = w > 0
        return w[keep], (None if keep.all() else keep)

    def _check_weighted_labels(self, y, w):
        """What the labels must satisfy once zero-weight rows are gone (the classifier's: 2 classes)."""

    def _set_fitted(self, fed: Federation, items, id_col: str):
        self.federation_ = fed
        self.model_ = fed.model
        self._fitted_id_col = id_col
        self.party_names_ = [n for n, _ in items]
        features = []                   # (party, feature name) in the order of X's columns
        if self._table:
            party_of = {j: name for name, positions in self._layout for j in positions}
            features = [(party_of[j], self._column_names[j]) for j in range(len(self._column_names))]
            self.parties_ = {name: [self._column_label(j) for j in positions] for name, positions in self._layout}
        else:
            for name, frame in items:
                features += [(name, c) for c in frame.columns if c not in (self.id_col, _LABEL)]
            self.feature_names_in_ = np.array([f for _, f in features], dtype=object)
            self.n_features_in_ = len(features)
            self.parties_ = {name: [f for p, f in features if p == name] for name in self.party_names_}
        self._features = features
        self.feature_parties_ = np.array([p for p, _ in features], dtype=object)
        self.evals_result_ = fed.model.history
        self.best_iteration_ = fed.model.best_iteration
        self._importance_cache = None

    def _column_label(self, j: int):
        names = getattr(self, "feature_names_in_", None)
        return str(names[j]) if names is not None else j

    # -- prediction ---------------------------------------------------------
    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "federation_")

    def _check_fitted(self):
        if not hasattr(self, "federation_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet: call fit first")

    def _predict_frames(self, X) -> dict:
        self._check_fitted()
        if self._table:
            if _is_party_form(X):
                raise InputError("this estimator was fitted on a single table X (split by parties=): predict from "
                                 "a table with the same columns, not from one DataFrame per party")
            return dict(self._table_frames(self._check_table(X, reset=False), predict=True))
        if not _is_party_form(X):
            raise InputError(f"this estimator was fitted on one DataFrame per party {self.party_names_}: predict "
                             f"from the same parties' frames (a dict or a list of DataFrames)")
        items = _party_frames(X)
        names = sorted(n for n, _ in items)
        if names != sorted(self.party_names_):
            raise InputError(f"X has parties {[n for n, _ in items]}, the model was fitted with {self.party_names_}")
        return dict(items)

    def _raw(self, X) -> np.ndarray:
        frames = self._predict_frames(X)        # checks fitted first
        return self.federation_.predict_raw(frames)

    def credit_report(self, X, y, segments=None) -> dict:
        """The credit metrics of the model on rows ``X`` with true labels ``y``
        (:func:`vfl.core.credit_metrics.credit_report`: KS and its threshold, Gini, the decile table,
        calibration and Brier; one-vs-rest per class for more than two classes; RMSE, MAE and the
        deciles of the prediction for a regressor), also per value of ``segments`` (one per row)."""
        raw = self._raw(X)
        output = get_objective(self.model_.objective).transform(raw)
        classes = getattr(self, "classes_", None)
        if classes is not None:
            index = {c: i for i, c in enumerate(classes.tolist())}
            values = self._y_1d(y).tolist()
            unknown = [v for v in values if v not in index]
            if unknown:
                raise InputError(f"y holds label {unknown[0]!r}, not one of the classes {classes.tolist()}")
            y = np.array([index[v] for v in values], dtype=np.int64)
            classes = classes.tolist()
        else:
            y = self._encode_y(y)
        return credit_metrics.credit_report(self.model_.objective, y, output, classes,
                                            segments=None if segments is None else np.asarray(segments, dtype=object),
                                            segment_name="segments")

    def explain(self, X, top: int | None = None, adverse: str = "high") -> pd.DataFrame:
        """Per-decision explanations (grouped TreeSHAP, :mod:`vfl.core.explain`) of the rows of ``X``
        (the same form as :meth:`predict`'s): one line per row (multiclass: per row and class)
        with ``base``, one column per active-party feature, one per passive party (its features
        grouped), and ``margin`` (the raw score: ``base`` + the attributions); ``top`` K adds the
        reason codes (the K players that pushed the score most towards the adverse side; "high":
        towards ``classes_[1]`` for a binary classifier, a larger value for a regressor)."""
        frames = self._predict_frames(X)        # checks fitted first
        table = self.federation_.explain(frames, top=top, adverse=adverse)
        if self._table:                 # ids made up for the split: the line's row of X instead
            id_col = self.federation_.active.id_col
            n_lines = len(table) // max(len(frames[self.party_names_[0]]), 1)
            table.index = np.repeat(np.arange(len(table) // max(n_lines, 1)), n_lines)
            table = table.drop(columns=[id_col])
        return table

    @property
    def feature_importances_(self) -> np.ndarray:
        self._check_fitted()
        if self._importance_cache is None:
            # in process, every party is this estimator's: sharing the gains leaks to no one
            imp = self.federation_.feature_importance(self.importance_type, share_gains=True)
            vals = np.array([imp.get(f"{p}:{f}", 0.0) for p, f in self._features])
            total = vals.sum()
            self._importance_cache = vals / total if total > 0 else vals
        return self._importance_cache

    # -- pickling: the federation as the parties' model dicts ----------------
    def __getstate__(self):
        state = super().__getstate__()
        if "federation_" in state:
            state = dict(state)
            state["federation_"] = {"model_dicts": self.federation_.model_dicts()}
            state.pop("model_", None)
        return state

    def __setstate__(self, state):
        fed = state.get("federation_")
        if isinstance(fed, dict):
            state = dict(state)
            fed = Federation.from_model_dicts(list(fed["model_dicts"].values()), state["_fitted_id_col"],
                                              where="the pickled estimator")
            state["federation_"], state["model_"] = fed, fed.model
        super().__setstate__(state)


class VerticalBoostingClassifier(ClassifierMixin, _VerticalBoosting):
    """Federated gradient-boosted trees for classification (binary or multiclass softmax).

    Two classes train the binary objective, more the multiclass one; labels may be
    any integers or strings (``classes_``, sorted). ``X``: one table split by
    ``parties`` / ``n_parties``, or one DataFrame per party (see :mod:`vfl.estimators`).
    """

    def _encode_y(self, y, fit=True):
        y = self._y_1d(y)
        if fit:
            vals = pd.Series(y)
            if vals.isna().any():
                raise InputError(f"y has {int(vals.isna().sum())} missing labels")
            if y.dtype.kind == "f" and np.isinf(y).any():
                rows = np.flatnonzero(np.isinf(y))
                raise InputError(f"y has {len(rows)} infinite labels (rows {rows[:5].tolist()})")
            try:
                classes = np.unique(y)
            except TypeError:
                raise InputError("y mixes strings and numbers; use one kind of class label") from None
            try:
                check_classification_targets(y)
            except ValueError as exc:
                raise _as_input_error(exc) from None
            if len(classes) < 2:
                raise InputError(f"y holds one class only ({classes.tolist()}): a classifier needs at least 2")
            self.classes_ = classes
        index = {c: i for i, c in enumerate(self.classes_.tolist())}
        unknown = sorted({v for v in y.tolist() if v not in index}, key=str)
        if unknown:
            raise InputError(f"eval_set labels {unknown[:5]} are not among the training classes "
                             f"{self.classes_.tolist()[:10]}")
        return np.array([index[v] for v in y.tolist()], dtype=np.int64)

    def _check_weighted_labels(self, y, w):
        kept = np.unique(np.asarray(y)[w > 0])
        if len(kept) < 2:
            raise InputError(f"sample_weight leaves one class only ({kept.tolist()}) with a positive weight: a "
                             f"classifier needs at least 2")

    def fit(self, X, y, sample_weight=None, eval_set=None, xgb_model=None):
        """Train on ``X`` (one table, or one DataFrame per party) and labels ``y``; returns self.
        ``xgb_model``: continue that model with more rounds (a fitted estimator of this class, a
        :class:`vfl.api.Federation` or a model directory; ``n_estimators`` is the new total)."""
        y = self._y_1d(self._require_y(y))
        self._encode_y(y)           # checks y and sets classes_ before the objective is chosen
        weights, keep = self._sample_weights(sample_weight, y)
        if keep is not None:
            self._encode_y(y[keep])     # the classes of the rows that train
        objective = Objective.BINARY.value if len(self.classes_) == 2 else Objective.MULTICLASS.value
        return self._fit(X, y, weights, keep, eval_set, objective, xgb_model=xgb_model)

    def decision_function(self, X) -> np.ndarray:
        """Raw scores (log-odds): ``(n_samples,)`` for two classes (positive: ``classes_[1]``),
        ``(n_samples, n_classes)`` for more."""
        raw = self._raw(X)
        return raw[:, 0] if len(self.classes_) == 2 else raw

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
    (squared error) or ``"pseudohuber"`` (with ``huber_slope``). ``X``: one table split
    by ``parties`` / ``n_parties``, or one DataFrame per party (see :mod:`vfl.estimators`)."""

    def __init__(self, n_estimators=_D("n_estimators"), max_depth=_D("max_depth"),
                 learning_rate=_D("learning_rate"), max_bin=_D("max_bin"), reg_lambda=_D("reg_lambda"),
                 min_child_weight=_D("min_child_weight"), gamma=_D("gamma"), subsample=_D("subsample"),
                 goss=_D("goss"), top_rate=_D("top_rate"), other_rate=_D("other_rate"),
                 early_stopping_rounds=_D("early_stopping_rounds"), eval_metric=_D("eval_metric"),
                 mode=_D("mode"), key_bits=_D("key_bits"), encryption=_D("encryption"), scheme=_D("scheme"),
                 precision_bits=_D("precision_bits"), seed=_D("seed"), id_col="id", importance_type="gain",
                 align=_D("align"), epsilon=_D("epsilon"), epsilon_per_feature=_D("epsilon_per_feature"),
                 parties=None, n_parties=2, label_party=None, random_state=None, categorical=None,
                 monotone_constraints=None, objective=Objective.REGRESSION.value, huber_slope=_D("huber_slope"),
                 dp_unsafe_noise_seed=_D("dp_unsafe_noise_seed"), active_only_rounds=_D("active_only_rounds"),
                 min_node_rows=_D("min_node_rows"), warm_start=False):
        super().__init__(active_only_rounds=active_only_rounds, min_node_rows=min_node_rows,
                         n_estimators=n_estimators, max_depth=max_depth, learning_rate=learning_rate,
                         max_bin=max_bin, reg_lambda=reg_lambda, min_child_weight=min_child_weight, gamma=gamma,
                         subsample=subsample, goss=goss, top_rate=top_rate, other_rate=other_rate,
                         early_stopping_rounds=early_stopping_rounds, eval_metric=eval_metric, mode=mode,
                         key_bits=key_bits, encryption=encryption, scheme=scheme, precision_bits=precision_bits,
                         seed=seed,
                         id_col=id_col, importance_type=importance_type, align=align, epsilon=epsilon,
                         epsilon_per_feature=epsilon_per_feature, parties=parties, n_parties=n_parties,
                         label_party=label_party, random_state=random_state, categorical=categorical,
                         monotone_constraints=monotone_constraints, dp_unsafe_noise_seed=dp_unsafe_noise_seed,
                         warm_start=warm_start)
        self.objective = objective
        self.huber_slope = huber_slope

    def _encode_y(self, y, fit=True):
        y = self._y_1d(y)
        try:
            y = np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError("y must hold numbers for a regressor") from None
        bad = ~np.isfinite(y)
        if bad.any():
            raise InputError(f"y has {int(bad.sum())} NaN/inf values (rows {np.flatnonzero(bad)[:5].tolist()}); "
                             "a regression target must be finite")
        return y

    def fit(self, X, y, sample_weight=None, eval_set=None, xgb_model=None):
        """Train on ``X`` (one table, or one DataFrame per party) and targets ``y``; returns self.
        ``xgb_model``: continue that model with more rounds (as for the classifier)."""
        if self.objective not in (Objective.REGRESSION, Objective.PSEUDOHUBER):
            raise InputError(f"parameter objective must be 'regression' or 'pseudohuber', got {self.objective!r}")
        y = self._y_1d(self._require_y(y))
        weights, keep = self._sample_weights(sample_weight, y)
        return self._fit(X, y, weights, keep, eval_set, self.objective, xgb_model=xgb_model,
                         huber_slope=self.huber_slope)

    def predict(self, X) -> np.ndarray:
        return self._raw(X)[:, 0]
