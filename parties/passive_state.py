"""The passive party's state: what its handler groups read and change.

One :class:`PassiveState` per :class:`parties.passive.PassiveParty`. It holds

* the party's own data (ids and feature columns; new rows to predict on; validation rows) and
  its local settings (which alignment and prediction methods it allows, its DP policy);
* the **training session** (:class:`TrainingSession`): the aligned rows, the bins, the public
  key, the row shards on the executor's workers and the current round's gradients
  (:class:`crypto.shards.ShardedGradients`: only metadata; the values live on the shards' workers),
  the last node assignment;
* the model: its id, the id salt, the **lookup table** of split records (:class:`LookupTable`),
  the DP release ledger;
* the prediction and validation **sessions** (rows by session id) and pending PSI exchanges.

The handler groups (``passive_align``, ``passive_train``, ``passive_predict``, ``dp``) are
functions ``(state, request) -> reply`` over it; nothing else reaches into it.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from crypto import parallel
from crypto.executor import Executor, InlineExecutor, LocalExecutor
from crypto.parallel import resolve_workers
from crypto.shards import ShardedGradients, ShardSet
from datasets.errors import InputError, ProtocolError
from parties.settings import Settings
from vfl.core.binning import Binner
from vfl.core.params import ALIGNMENTS, PREDICTIONS
from vfl.core.split import goes_left

#: pending PSI exchanges kept at once (older, abandoned ones are forgotten)
MAX_PSI_PENDING = 8


@dataclass(eq=False)
class TrainingSession:
    """One training: alignment, setup (bins), key, the current round."""
    hashes: object = None                      # own salted id hashes, sorted (hash alignment, until its result)
    rows: np.ndarray | None = None             # own rows in the aligned order
    mode: str | None = None                    # "he", "plain" or "dp"
    binner: Binner | None = None
    bin_idx: np.ndarray | None = None          # (aligned rows, features) bin indices (None: on the workers)
    reader: object = None                      # parties.shard_ops.ShardReader: workers read a Parquet table
    data_digest: str | None = None             # with a reader: the workers' fingerprint of the aligned rows
    scheme: str = "paillier"                   # the key's scheme (TrainSetup.scheme; crypto.schemes)
    public_key: object = None                  # the active party's public key (crypto.schemes)
    nsquare: object = None                     # the ciphertext modulus of that key (gmpy2): n^2 Paillier, n OU
    plain_bits: int | None = None              # that key's plaintext space in bits (what a layout may fill)
    round_idx: int | None = None               # the round of the last gradients (kept after TrainEnd)
    grads: ShardedGradients | None = None      # the round's gradients (values on the shards' workers)
    shards: ShardSet | None = None             # the aligned rows' shards on the executor's workers
    assignment: np.ndarray | None = None       # node of every row, per tree, of the last histogram request
    dp_released: np.ndarray | None = None      # mode dp: the aligned rows already released (bool)
    dp_domain: object = None                   # mode dp: vfl.core.dp.ReleaseDomain (None: epsilon inf)
    dp_X: np.ndarray | None = None             # mode dp: the aligned rows' raw values (never sent)
    dp_edges: dict = field(default_factory=dict)   # mode dp: {feature: edges of its latest release}
    intake: object = None                      # the round's parties.passive_train.RoundIntake (overlap)
    protocol: object = None                    # parties.passive_checks.TrainingProtocol: what is allowed
    randomizer: object = None                  # crypto.obfuscators.ReplyRandomizer: fresh randomness for replies
    candidates: object = None                  # parties.passive_splits.CandidateExchange (None: per-bin sums)
    settings: Settings = field(default_factory=Settings)   # read once, at TrainSetup
    screen_mode: str | None = None             # a screening session (parties.passive_screen): its mode
    screen_epsilon: float | None = None        # ... the DP noise on the counts it returns (inf: none)
    screen_groups: dict = field(default_factory=dict)   # ... {feature: groups of bins the active party pooled}
    screen_id: str | None = None               # ... its id
    screen_max_bin: int = 32                   # ... its bins per feature
    screen_n_bins: np.ndarray | None = None    # ... the slots per feature it announced (ScreenBins)
    overlap: dict = field(default_factory=lambda: {"eager": 0, "fallback": 0, "partials": 0,
                                                   "partials_before_request": 0})   # root levels, for tests

    def end_intake(self) -> None:
        """Stop the round's intake thread (a new round, the end of training)."""
        intake, self.intake = self.intake, None
        if intake is not None:
            intake.close()


class LookupTable:
    """This party's split records: ``record_id -> (feature, threshold, default side)``.

    ``records`` is a list of dicts (the model file's ``records``); the columns the router needs
    are kept as arrays, rebuilt only when the list changes (records are only ever appended, or
    the whole list replaced)."""

    def __init__(self, records: list[dict] | None = None):
        self.records: list[dict] = [] if records is None else records
        self._cols = None

    def __len__(self) -> int:
        return len(self.records)

    def add(self, party: str, feature_names: list[str], binner: Binner, feature_idx: int, bin_idx: int,
            default_left, round_idx: int, tree: int, node_id: int) -> int:
        """Store the split "feature <= threshold of bin_idx"; its record id."""
        f, b = feature_idx, bin_idx
        if not 0 <= f < len(feature_names) or not 0 <= b < binner.missing_bin(f):
            raise ProtocolError(f"no feature {f} / bin {b} at party {party!r}")
        if binner.is_categorical(f):
            raise ProtocolError(f"feature {f} of party {party!r} is categorical: a threshold split is not possible")
        rid = len(self.records)
        self.records.append({"record_id": rid, "round": round_idx, "tree": tree, "node_id": node_id,
                             "feature_idx": f, "feature": feature_names[f],
                             "threshold": binner.threshold(f, b), "default_left": bool(default_left)})
        return rid

    def add_categorical(self, party: str, feature_names: list[str], binner: Binner, feature_idx: int,
                        left_bins: np.ndarray, default_left, n_categories: int, round_idx: int, tree: int,
                        node_id: int) -> int:
        """Store the split "feature is one of these categories" (the codes whose bins go left, the
        pooled bin expanded to its categories); its record id."""
        f = feature_idx
        if not 0 <= f < len(feature_names) or not binner.is_categorical(f):
            raise ProtocolError(f"no categorical feature {f} at party {party!r}")
        left_bins = np.asarray(left_bins, dtype=np.int64)
        if left_bins.size and (left_bins.min() < 0 or left_bins.max() >= binner.missing_bin(f)) \
                or len(np.unique(left_bins)) != left_bins.size:
            raise ProtocolError(f"bad category bins for feature {f} at party {party!r}")
        rid = len(self.records)
        self.records.append({"record_id": rid, "round": round_idx, "tree": tree, "node_id": node_id,
                             "feature_idx": f, "feature": feature_names[f], "threshold": None,
                             "categories": binner.left_codes(f, left_bins, n_categories),
                             "default_left": bool(default_left)})
        return rid

    def _columns(self):
        cols = self._cols
        if cols is None or cols[0] is not self.records or cols[1] != len(self.records):
            cols = (self.records, len(self.records),
                    np.array([np.nan if r["threshold"] is None else r["threshold"] for r in self.records],
                             dtype=np.float64),
                    np.array([r["default_left"] for r in self.records], dtype=bool),
                    {i: r["categories"] for i, r in enumerate(self.records) if r.get("categories") is not None})
            self._cols = cols
        return cols

    def go_left(self, record_ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Split decisions of records ``record_ids`` on raw values ``x`` (same shape; NaN: the
        record's default side)."""
        _, _, thr, dl, cats = self._columns()
        record_ids = np.asarray(record_ids, dtype=np.int64)
        out = goes_left(x, thr[record_ids], dl[record_ids])
        if cats:
            rb = np.broadcast_to(record_ids, np.shape(out))
            x = np.asarray(x, dtype=np.float64)
            for r in np.intersect1d(np.unique(rb), np.fromiter(cats, dtype=np.int64)).tolist():
                sel = rb == r
                out[sel] = goes_left(x[sel], None, dl[r], categories=cats[r])
        return out

    def tree_keys(self) -> np.ndarray:
        """Per record, an index of its tree ((round, tree) pairs numbered in order of appearance); -1
        for a record of no known tree (mode dp registers its splits without one)."""
        keys: dict = {}
        return np.array([keys.setdefault((r["round"], r["tree"]), len(keys)) if r["round"] >= 0 and r["tree"] >= 0
                         else -1 for r in self.records], dtype=np.int64)

    def default_left(self, record_ids: np.ndarray) -> np.ndarray:
        """Each record's default side (where a missing value goes)."""
        return self._columns()[3][np.asarray(record_ids, dtype=np.int64)]

    def features(self, record_ids: np.ndarray) -> np.ndarray:
        """The feature column of each record."""
        return np.array([self.records[r]["feature_idx"] for r in record_ids.tolist()], dtype=np.int64)

    def check_ids(self, record_ids: np.ndarray, party: str) -> None:
        if record_ids.size and (record_ids.min() < 0 or record_ids.max() >= len(self.records)):
            raise ProtocolError(f"unknown record id at party {party!r}")


@dataclass(eq=False)
class PassiveState:
    """Everything a passive party knows and holds (see the module docstring)."""
    name: str
    id_col: str = "id"
    source: str | None = None
    n_jobs: int | None = None                  # worker processes for the ciphertext kernels (None: VFL_N_JOBS)
    # local policy, never set by the active party
    allowed_align: tuple = ALIGNMENTS
    allowed_prediction: tuple = PREDICTIONS
    dp_unsafe_noise_seed: object = None        # NOT PRIVATE test seed of the DP noise (None: cryptographic)
    dp_max_epsilon_per_feature: float | None = None
    dp_ledger_path: str | None = None          # the lifetime privacy ledger file (parties.dp_ledger; None: none)
    dp_lifetime_epsilon: float | None = None   # the most epsilon the dataset may spend, over all trainings
    min_node_rows: int = 1                     # the least min_node_rows a TrainSetup may agree (federation)
    require_active_only_rounds: int = 0        # the fewest active-only first rounds a TrainSetup may agree
    categorical_ordered: bool = False          # strict: categorical features as ordered bins (shuffled too)
    dp_model_min_node_rows: int | None = None  # ... for a training labelled a DP model (None: min_node_rows)
    trainer: str | None = None                 # who trained the model (bound into the model file, issue 22)
    screen_allowed: bool = False               # screening granted to the caller (issue 33; default: nobody)
    screen_epsilon: float | None = None        # DP noise on the screening counts it returns (None: exact)
    full_features: tuple | None = None         # --min-iv: (X, names, dp_bins) before a FeatureSelect
    select_open: bool = False                  # a FeatureSelect may come (after an alignment, before a setup)
    last_screening: object = None              # the session of an in-process screening beside a model
    warm_bases: dict = field(default_factory=dict)   # completed models a warm start may continue (passive_warm)
    max_depth: int | None = None               # the model's max_depth (agreed at setup): a row's route budget
    drift_policy: str = "positions"            # drift requests: PSI by position, by name, or "decline"
    drift_min_rows: int = 0                    # raises the fewest rows a drift run is answered over
    limits: object = None                      # parties.passive_limits.Limits: own caps (None: a library party)
    reveal_budget_path: str | None = None      # the lifetime reveal budget file (parties.reveal_budget; None: none)
    # own data
    ids: np.ndarray | None = None
    X: np.ndarray | None = None                # or a datasets.pieces.PieceTable: read where needed
    feature_names: list = field(default_factory=list)
    categories: dict = field(default_factory=dict)     # {categorical feature: its vocabulary}
    monotone: dict = field(default_factory=dict)       # {feature: +1 | -1}, own constraints
    dp_bins: dict = field(default_factory=dict)        # --dp-model: own public bounds/edges {feature: entry}
    pred_ids: np.ndarray | None = None         # new rows to predict on (else the training rows)
    pred_X: np.ndarray | None = None
    val_ids: np.ndarray | None = None          # validation rows
    val_X: np.ndarray | None = None
    # the model
    model_id: str | None = None
    salt: bytes | None = None
    completed: bool = False
    table: LookupTable = field(default_factory=LookupTable)
    dp_ledger: list = field(default_factory=list)     # every DP release, oldest first
    dp_training_ids: np.ndarray | None = None  # mode dp: digests of the released training ids (never routed)
    drift_reference: dict | None = None        # the training rows' bin counts per feature (vfl.core.drift)
    drift_withheld: str | None = None          # why a model keeps no drift counts (a DP training)
    # sessions
    train: TrainingSession = field(default_factory=TrainingSession)
    sessions: dict = field(default_factory=dict)      # session id -> rows (prediction, validation)
    psi_pending: dict = field(default_factory=dict)   # session id -> {purpose, perm, X}
    route_counts: dict = field(default_factory=dict)  # prediction session id -> (rows, trees) routes answered
    drift_runs: OrderedDict = field(default_factory=OrderedDict)  # drift id -> (counts, sessions counted)
    eval_session: str | None = None                   # the validation session of the training under way
    session_owner: dict = field(default_factory=dict)  # prediction session id -> client (the server sets it)
    session_ids: dict = field(default_factory=dict)    # prediction session id -> its rows' ids
    training_rows: np.ndarray | None = None    # digests of the rows a model was trained on (prediction refuses them)
    fingerprint: str | None = None             # the dataset's fingerprint (parties.dp_ledger), once computed
    # explanations of this party's own features (opt-in, parties.passive_explain): its own policy
    explain_features: bool = False                    # its federation entry says explain_features = true
    explain_dir: str | None = None                    # where it writes them (None: memory only)
    feature_explanations: list = field(default_factory=list)   # tables of the last sessions, oldest first
    psi_pending_cap: int = MAX_PSI_PENDING             # pending PSI exchanges kept (a server raises it: it
    #                                                    bounds its sessions itself and never evicts one in use)
    executor: Executor | None = None
    user_executor: Executor | None = None             # given by the caller (e.g. Dask): used, never closed

    # -- checks -------------------------------------------------------------
    def need(self, what: str, value):
        if value is None:
            raise ProtocolError(f"party {self.name!r} received a request before {what}")
        return value

    def check_allowed(self, method: str, allowed, what: str) -> None:
        method = str(method)        # a vocabulary enum member prints as its value
        if method not in allowed:
            raise ProtocolError(f"party {self.name!r} does not allow {what} by {method!r} "
                                f"(it allows {list(allowed)})")

    def check_model(self, model_id: str, what: str = "holds no model") -> None:
        if model_id != self.model_id:
            raise ProtocolError(f"party {self.name!r} {what} {model_id!r}")

    # -- training -----------------------------------------------------------
    def reset_training(self) -> None:
        """Forget the training session (a new alignment starts one)."""
        self.close_executor()
        self.train = TrainingSession()
        self.completed = False

    def aligned_rows(self) -> np.ndarray:
        return self.need("alignment", self.train.rows)

    def get_executor(self, work: int | None = None) -> Executor | None:
        """This party's executor: the caller's (``executor=``, e.g. Dask), else its own worker
        processes (closed at TrainEnd) when ``work`` (additions of one histogram over all rows) is
        worth them (``work < 0``: never, e.g. mode plain), else the calling process
        (:class:`crypto.executor.InlineExecutor`)."""
        if self.user_executor is not None:
            return self.user_executor
        if self.executor is None or self.executor.closed:
            jobs = self.train.settings.n_jobs
            if work is not None and work >= 0 and resolve_workers(jobs) > 1 and work >= parallel.POLICY.histogram:
                self.executor = LocalExecutor(jobs, name=f"passive:{self.name}")
            else:
                self.executor = InlineExecutor(name=f"passive:{self.name}")
        return self.executor

    def close_executor(self) -> None:
        self.train.end_intake()
        randomizer, self.train.randomizer = self.train.randomizer, None
        if randomizer is not None:
            randomizer.close()
        shards, self.train.shards = self.train.shards, None
        self.train.grads = None
        self.train.reader = None
        if shards is not None and not shards.executor.closed:
            try:
                shards.drop()
            except Exception:        # a lost worker: its slots are gone anyway
                pass
        executor, self.executor = self.executor, None
        if executor is not None:
            executor.close()

    # -- prediction ---------------------------------------------------------
    def prediction_data(self):
        """``(ids, X)`` prediction queries are answered from: new data if loaded, else the training rows."""
        ids = self.pred_ids if self.pred_ids is not None else self.ids
        X = self.pred_X if self.pred_X is not None else self.X
        if ids is None:
            raise InputError(f"party {self.name!r} has no data to predict on")
        return ids, X

    def validation_data(self):
        if self.val_ids is None:
            raise InputError(f"party {self.name!r} has no validation data (load_validation_data) but the "
                             "active party uses a validation set")
        return self.val_ids, self.val_X

    def session_rows(self, session_id: str) -> np.ndarray:
        X = self.sessions.get(session_id)
        if X is None:
            raise ProtocolError(f"unknown prediction session {session_id!r}")
        return X

    def has_session(self, session_id: str) -> bool:
        return session_id in self.sessions or session_id in self.psi_pending

    def drop_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        self.route_counts.pop(session_id, None)
        self.session_owner.pop(session_id, None)
        self.session_ids.pop(session_id, None)
        self.psi_pending.pop(session_id, None)
        self.session_ids.pop(session_id, None)


def unsafe_seed(s: PassiveState, what: str):
    """The NOT PRIVATE test seed of one of this party's noise draws (None: cryptographic noise)."""
    seed = s.dp_unsafe_noise_seed
    if seed is None:
        return None
    return [int(x) for x in np.atleast_1d(np.asarray(seed, dtype=object))] + [sum(map(ord, what)), len(s.dp_ledger)]
