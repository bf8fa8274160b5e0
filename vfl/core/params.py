"""Training hyperparameters, validated once with errors that name the parameter, and the
project's vocabulary: the str-valued enums every layer validates with and the CLI takes its
choices from.

Names and defaults follow XGBoost where one exists. The fields of :class:`TrainParams` are
THE hyperparameter defaults: the CLI options, :class:`vfl.compare.CompareConfig` and the
estimators read theirs through :meth:`TrainParams.default`.
"""
from __future__ import annotations

import enum
import math
from dataclasses import MISSING, asdict, dataclass, fields

import numpy as np

from datasets.errors import InputError
from vfl.core.dp_bins_file import check_dp_bins
from vfl.core.dp_budget import DP_TREES, gradient_bounds, parse_budget
from vfl.core.objectives import OBJECTIVE_ALIASES


class Vocabulary(str, enum.Enum):
    """A str-valued enum: ``Mode.HE == "he"``, ``str(Mode.HE) == "he"``; the fields of
    :class:`TrainParams` hold the plain string values, so JSON and model files are unchanged."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)


class Mode(Vocabulary):
    """Training mode: SecureBoost with Paillier, the same protocol unencrypted, or DP only."""
    HE = "he"
    PLAIN = "plain"
    DP = "dp"


class Objective(Vocabulary):
    BINARY = "binary"
    MULTICLASS = "multiclass"
    REGRESSION = "regression"
    PSEUDOHUBER = "pseudohuber"


class Alignment(Vocabulary):
    """Sample alignment: salted mmh3 hashes, or ECDH private set intersection over X25519."""
    HASH = "hash"
    PSI = "psi"


class Prediction(Vocabulary):
    """Prediction protocol: one message of leaf masks per passive party, or node-by-node routing."""
    ONE_ROUND = "one-round"
    NODE = "node"


class Encryption(Vocabulary):
    """Paillier randomness: short-exponent ``fast`` or phe-style ``standard``."""
    FAST = "fast"
    STANDARD = "standard"


class Scheme(Vocabulary):
    """The additively homomorphic scheme of mode ``he``: Paillier (the default) or Okamoto-Uchiyama
    (``crypto.ou``: ciphertexts mod n instead of n^2, fewer packed values per ciphertext)."""
    PAILLIER = "paillier"
    OU = "ou"


MODES = Mode.values()
OBJECTIVES = Objective.values()
ALIGNMENTS = Alignment.values()
PREDICTIONS = Prediction.values()
DEFAULT_PREDICTION = Prediction.ONE_ROUND.value
#: the most boosting rounds (n_estimators) a training may have; the wire bound of every round
#: index is the same (protocols.messages.MAX_ROUNDS: a round 2**70 is refused there)
MAX_ROUNDS = 1_000_000
ENCRYPTIONS = Encryption.values()
SCHEMES = Scheme.values()
# metrics per objective (the first is the default eval_metric); see vfl.core.metrics
EVAL_METRICS = {
    "binary": ("logloss", "auc", "error"),
    "multiclass": ("mlogloss", "merror"),
    "regression": ("rmse", "mae"),
    "pseudohuber": ("mphe", "rmse", "mae"),
}


@dataclass
class TrainParams:
    """The training hyperparameters, one field each, with their defaults (the CLI options, the
    estimators and ``vfl compare`` take theirs from here: :meth:`default`).

    ``n_estimators`` (scikit-learn's and XGBoost's name) is the number of boosting ROUNDS: a round
    grows one tree, or one tree per class (K trees) for a K-class multiclass model. The CLI calls
    it ``--rounds``; a model's ``n_rounds`` counts rounds, a result's ``n_trees`` the trees grown.
    """
    n_estimators: int = 10
    max_depth: int = 4
    learning_rate: float = 0.3
    max_bin: int = 32
    reg_lambda: float = 1.0
    min_child_weight: float = 1.0
    gamma: float = 0.0
    objective: str = "binary"
    mode: str = "he"
    key_bits: int = 2048
    precision_bits: int = 32
    encryption: str = "fast"      # "fast" (short-exponent) or "standard"
    scheme: str = "paillier"      # mode he: "paillier" or "ou" (Okamoto-Uchiyama), see docs/schemes.md
    seed: int = 0
    align: str = "hash"           # "hash" or "psi" (see protocols/psi.py)
    epsilon: float | None = None              # mode dp: each passive party's total (see vfl.core.dp)
    epsilon_per_feature: float | None = None  # mode dp: alternatively, per released feature
    dp_buckets: int | str = "auto"            # mode dp: buckets per released feature, "auto" from epsilon
    dp_debias: bool = True                    # mode dp: the active party debiases the release (vfl.core.dp_debias)
    dp_select: int | str | None = "auto"      # mode dp: release only this many features per party (None/"none": all)
    dp_edge_share: float = 0.1                # mode dp: share of a party's budget for its DP bucket edges
    dp_unsafe_noise_seed: int | None = None   # NOT PRIVATE: seeds the DP noise (tests only); None: cryptographic noise
    # --- learner options (issue 4); names follow XGBoost / LightGBM ---
    huber_slope: float = 1.0               # pseudohuber objective
    subsample: float = 1.0                 # row fraction per tree, in (0, 1]
    goss: bool = False                     # gradient-based one-side sampling (LightGBM)
    top_rate: float = 0.2                  # GOSS: share of largest-gradient rows kept
    other_rate: float = 0.1                # GOSS: share of the other rows sampled
    early_stopping_rounds: int | None = None
    eval_metric: str | None = None         # None: the objective's default (EVAL_METRICS)
    # --- a DP released model (issue 14, vfl.core.dp_model); modes he and plain ---
    dp_model: float | None = None          # total epsilon of the released model (inf: non-private)
    dp_delta: float | None = None          # None: pure epsilon (Laplace); else Gaussian leaves, RDP accounting
    dp_clip: float | None = None           # public gradient bound g* (needed for objective regression)
    dp_budget: str | None = None           # relative shares "sketch,splits,leaves" (default: per dp_trees)
    dp_trees: str = "selected"             # one feature per tree chosen by DP ("selected") or in turn ("cyclic"),
    #                                        or "exponential": split candidates of every feature
    dp_bins: dict | None = None            # public bounds/edges {column: {"lo","hi"} | {"edges"}} (no sketch budget)
    # --- credit-risk options (issue 15); names follow LightGBM / XGBoost ---
    # category bins of a categorical feature (the rest pooled): 254 + the pooled bin + the missing bin
    # = 256 slots, one byte per bin (issue 26: 64 pooled away 0.004-0.016 test AUC on 150-200 categories)
    max_cat: int = 254
    cat_smooth: float = 10.0               # categorical splits: G/(H + cat_smooth) orders the bins
    min_data_per_group: int = 100          # categorical splits: samples per group of bins
    max_cat_threshold: int = 32            # categorical splits: bins going left at most
    monotone_constraints: dict | None = None   # the active party's {feature: +1 | -1}
    # --- trust (issue 22): no histogram of a node with fewer (sampled) rows than this; agreed with the
    # passive parties at setup (a federation setting). 2: the smallest node ever split, so no model changes
    min_node_rows: int = 2
    # --- screening (issue 33): drop every feature whose information value is below this before training
    # (the passive parties screened as in parties/screen.py; each told the positions it keeps); None: keep all
    min_iv: float | None = None
    # --- issue 31: the first rounds grow on the active party's own features only (FATE's complete_secure,
    # SecretFlow's first_tree_with_label_holder_feature): no passive party takes part in them, so the
    # first instance space a passive party sees is of residual gradients; a passive party may require it
    active_only_rounds: int = 0

    @classmethod
    def default(cls, name: str):
        """The default of field ``name``: the one place hyperparameter defaults are written."""
        for f in fields(cls):
            if f.name == name:
                if f.default is MISSING:
                    raise KeyError(f"TrainParams.{name} has no default")
                return f.default
        raise KeyError(f"TrainParams has no field {name!r}")

    def __post_init__(self):
        self.validate()

    def validate(self) -> "TrainParams":
        def num(name, lo=None, hi=None, lo_open=False, integer=False):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                    (isinstance(v, float) and math.isnan(v)):
                raise InputError(f"parameter {name} must be a number, got {v!r}")
            if integer and int(v) != v:
                raise InputError(f"parameter {name} must be an integer, got {v!r}")
            if lo is not None and (v <= lo if lo_open else v < lo):
                raise InputError(f"parameter {name} must be {'>' if lo_open else '>='} {lo}, got {v}")
            if hi is not None and v > hi:
                raise InputError(f"parameter {name} must be <= {hi}, got {v}")
            setattr(self, name, int(v) if integer else float(v))

        num("n_estimators", 1, MAX_ROUNDS, integer=True)
        num("max_depth", 1, 30, integer=True)
        num("learning_rate", 0, 1e6, lo_open=True)
        num("max_bin", 2, 256, integer=True)
        num("reg_lambda", 0, 1e12)
        num("min_child_weight", 0, 1e12)
        num("gamma", 0, 1e12)
        num("min_node_rows", 1, 1 << 20, integer=True)
        if self.min_iv is not None:
            num("min_iv", 0.0, 100.0)
            if self.mode == Mode.DP:
                raise InputError("min_iv (drop features below an IV cut before training) screens with exact counts: "
                                 "not in mode dp; screen with `vfl screen --mode dp` and train on the kept columns")
        num("active_only_rounds", 0, 1 << 20, integer=True)
        num("key_bits", integer=True)
        num("precision_bits", 8, 48, integer=True)
        num("seed", 0, integer=True)
        num("huber_slope", 0, 1e12, lo_open=True)
        num("subsample", 0, 1, lo_open=True)
        num("top_rate", 0, 1, lo_open=True)
        num("other_rate", 0, 1, lo_open=True)
        if not isinstance(self.goss, (bool, np.bool_)):
            raise InputError(f"parameter goss must be True or False, got {self.goss!r}")
        self.goss = bool(self.goss)
        if self.goss and self.top_rate + self.other_rate > 1:
            raise InputError(f"parameters top_rate + other_rate must be <= 1 for GOSS, got "
                             f"{self.top_rate} + {self.other_rate}")
        if self.goss and self.subsample < 1:
            raise InputError("parameters goss and subsample < 1 cannot be combined: GOSS is the row sampling")
        if self.early_stopping_rounds is not None:
            num("early_stopping_rounds", 1, integer=True)
        num("max_cat", 1, 1024, integer=True)
        num("cat_smooth", 0, 1e12)
        num("min_data_per_group", 0, integer=True)
        num("max_cat_threshold", 1, integer=True)
        self.monotone_constraints = check_monotone(self.monotone_constraints)
        if isinstance(self.objective, str):
            self.objective = OBJECTIVE_ALIASES.get(self.objective, self.objective)
        self.mode = _member(Mode, "mode", self.mode)
        self.objective = _member(Objective, "objective", self.objective)
        if self.encryption not in ENCRYPTIONS:
            raise InputError(f"parameter encryption must be 'fast' or 'standard', got {self.encryption!r}")
        self.encryption = Encryption(self.encryption).value
        self.scheme = _member(Scheme, "scheme", self.scheme)
        if self.eval_metric is not None and self.eval_metric not in EVAL_METRICS[self.objective]:
            raise InputError(f"parameter eval_metric {self.eval_metric!r} does not fit objective "
                             f"{self.objective!r}; choose one of {EVAL_METRICS[self.objective]}")
        self.align = _member(Alignment, "align", self.align)
        self._validate_dp()
        self._validate_dp_model()
        return self

    @property
    def metric(self) -> str:
        """The metric that early stopping watches."""
        return self.eval_metric or EVAL_METRICS[self.objective][0]

    def _validate_dp(self):
        given = [n for n in ("epsilon", "epsilon_per_feature") if getattr(self, n) is not None]
        self._validate_dp_options()
        if self.mode != "dp":
            if given:
                raise InputError(f"parameter {given[0]} applies to mode 'dp' only (mode is {self.mode!r})")
            return
        if len(given) != 1:
            raise InputError("mode 'dp' needs exactly one of epsilon (each passive party's total, split "
                             "evenly over its features) and epsilon_per_feature; inf means no noise")
        setattr(self, given[0], check_epsilon(getattr(self, given[0]), given[0]))
        if given[0] == "epsilon_per_feature" and self.dp_select not in (None, "auto"):
            raise InputError(f"epsilon_per_feature charges each of a passive party's d features this epsilon per row "
                             f"(its total is d x epsilon_per_feature); dp_select={self.dp_select} would release "
                             "fewer features, each at that total / K, so the name would not hold: give the "
                             "party's total with epsilon, or dp_select 'none'")

    def _validate_dp_options(self):
        share = self.dp_edge_share
        if isinstance(share, bool) or not isinstance(share, (int, float, np.integer, np.floating)) \
                or not 0 < float(share) < 1:
            raise InputError(f"parameter dp_edge_share must be a number in (0, 1), got {share!r}")
        self.dp_edge_share = float(share)
        seed = self.dp_unsafe_noise_seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise InputError(f"parameter dp_unsafe_noise_seed must be an integer >= 0 (NOT PRIVATE: tests only) "
                             f"or None, got {seed!r}")
        q = self.dp_buckets
        if isinstance(q, str) and q.strip().lower() == "auto":
            self.dp_buckets = "auto"
        else:
            try:
                ok = not isinstance(q, bool) and float(q) == int(float(q)) and 2 <= int(float(q)) <= 256
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise InputError(f"parameter dp_buckets must be 'auto' or an integer in [2, 256], got {q!r}")
            self.dp_buckets = int(float(q))
        if not isinstance(self.dp_debias, (bool, np.bool_)):
            raise InputError(f"parameter dp_debias must be True or False, got {self.dp_debias!r}")
        self.dp_debias = bool(self.dp_debias)
        if self.dp_select is not None:
            k = self.dp_select
            if isinstance(k, str) and k.strip().lower() in ("auto", "none"):
                self.dp_select = "auto" if k.strip().lower() == "auto" else None
                return
            try:
                ok = not isinstance(k, bool) and float(k) == int(float(k)) and int(float(k)) >= 1
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise InputError(f"parameter dp_select must be 'auto', 'none' or an integer >= 1 (features released "
                                 f"per passive party), got {k!r}")
            self.dp_select = int(float(k))
    def _validate_dp_model(self):
        """``dp_model`` and its companions (see :mod:`vfl.core.dp_model`)."""
        extra = [n for n in ("dp_delta", "dp_clip", "dp_budget") + (("dp_bins",) if self.mode != Mode.DP else ())
                 if getattr(self, n) is not None]
        extra += ["dp_trees"] if self.dp_trees != DP_TREES[0] else []
        if self.dp_model is None:
            if extra:
                raise InputError(f"parameter {extra[0]} applies with dp_model only (--dp-model EPS)"
                                 + (" or mode dp" if extra[0] == "dp_bins" else ""))
            if self.dp_bins is not None:     # mode dp: public bucket edges (no edge budget)
                self.dp_bins = check_dp_bins(self.dp_bins, "parameter dp_bins") or None
            return
        if self.mode == Mode.DP:
            raise InputError("dp_model applies to modes 'he' and 'plain': mode 'dp' releases each passive "
                             "party's features as noisy buckets (local DP) and trains on them; a DP released "
                             "model is asked for with --mode he (or plain) --dp-model EPS")
        self.dp_model = check_epsilon(self.dp_model, "dp_model")
        if self.dp_delta is not None:
            d = self.dp_delta
            if isinstance(d, bool) or not isinstance(d, (int, float, np.integer, np.floating)) or \
                    math.isnan(float(d)) or not 0 < float(d) < 1:
                raise InputError(f"parameter dp_delta must be a number in (0, 1), got {d!r}")
            self.dp_delta = float(d)
        if self.dp_clip is not None:
            c = self.dp_clip
            if isinstance(c, bool) or not isinstance(c, (int, float, np.integer, np.floating)) or \
                    not math.isfinite(float(c)) or not float(c) > 0:
                raise InputError(f"parameter dp_clip must be a finite number > 0, got {c!r}")
            self.dp_clip = float(c)
        if self.dp_budget is not None:
            self.dp_budget = ",".join(f"{s:.6g}" for s in parse_budget(self.dp_budget))
        if self.dp_bins is not None:
            self.dp_bins = check_dp_bins(self.dp_bins, "parameter dp_bins") or None
        if self.dp_trees not in DP_TREES:
            raise InputError(f"parameter dp_trees must be one of {DP_TREES}, got {self.dp_trees!r}")
        if math.isinf(self.dp_model):
            return
        if self.goss:
            raise InputError("dp_model cannot be combined with goss: GOSS samples rows by their gradients, "
                             "a data-dependent choice no DP accounting covers (use subsample < 1)")
        if self.early_stopping_rounds is not None:
            raise InputError("dp_model cannot be combined with early_stopping_rounds: the budget is planned "
                             "for n_estimators rounds")
        gradient_bounds(self.objective, self.dp_clip, self.huber_slope)    # regression needs dp_clip

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["dp_model"] is not None and math.isinf(d["dp_model"]):
            d["dp_model"] = "inf"
        for k in ("epsilon", "epsilon_per_feature"):
            if d[k] is not None and math.isinf(d[k]):
                d[k] = "inf"    # JSON has no infinity; check_epsilon reads it back
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainParams":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise InputError(f"unknown training parameter(s): {sorted(unknown)}")
        return cls(**d)


def check_monotone(constraints, what: str = "parameter monotone_constraints") -> dict | None:
    """``{feature: +1 | -1}`` (0 entries dropped; "+1"/"-1"/"increasing"/"decreasing" accepted),
    or None for no constraint."""
    if constraints is None:
        return None
    if not isinstance(constraints, dict):
        raise InputError(f"{what} must be a dict {{feature: +1 or -1}}, got {type(constraints).__name__}")
    words = {"+1": 1, "1": 1, "-1": -1, "0": 0, "increasing": 1, "decreasing": -1}
    out = {}
    for f, v in constraints.items():
        if isinstance(v, str):
            v = words.get(v.strip().lower(), v)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer, float)) or v not in (-1, 0, 1):
            raise InputError(f"{what}: the constraint of feature {f!r} must be +1 (increasing), -1 "
                             f"(decreasing) or 0, got {v!r}")
        if v:
            out[str(f)] = int(v)
    return out or None


def check_epsilon(value, name: str = "epsilon") -> float:
    """A privacy parameter: a number > 0, ``inf`` allowed (no noise); NaN, 0 and negatives refused."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "infinity", "+infinity"):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"parameter {name} must be a number > 0 (or inf for no noise), got {value!r}")
    v = float(value)
    if math.isnan(v):
        raise InputError(f"parameter {name} must be a number > 0 (or inf for no noise), got NaN")
    if not v > 0:
        raise InputError(f"parameter {name} must be > 0 (or inf for no noise), got {v}")
    return v


def _member(vocabulary: type[Vocabulary], name: str, value) -> str:
    """``value`` checked against ``vocabulary``; returned as the plain string (an enum member too)."""
    if value not in vocabulary.values():
        raise InputError(f"parameter {name} must be one of {vocabulary.values()}, got {value!r}")
    return vocabulary(value).value
