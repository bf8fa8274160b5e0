"""The passive party: holds feature columns, never sees a label or a plaintext gradient.

It is a message dispatcher: every request from the active party arrives as a
typed message (already deserialized from bytes by the transport) and is
answered by the handler :data:`HANDLERS` lists for its type, a function
``(state, request) -> reply`` of one handler group over the party's
:class:`~parties.passive_state.PassiveState`:

* alignment (:mod:`parties.passive_align`): salted id hashes and PSI;
* training (:mod:`parties.passive_train`): setup, key, gradients, end; a level's candidates and splits
  (:mod:`parties.passive_splits`);
* prediction (:mod:`parties.passive_predict`): sessions, routing, leaf masks, split gains;
* DP mode (:mod:`parties.dp`): the one noisy release and split registration;
* screening (:mod:`parties.passive_screen`): per-bin event and row counts for WOE/IV, when granted.

Its thresholds live in its own lookup table, saved to its own model file; the
active party only ever learns ``(party, record_id)``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from crypto.executor import Executor
from crypto.parallel import check_n_jobs
from datasets.errors import InputError, ProtocolError
from datasets.frames import party_data
from datasets.loaders import read_party_table
from datasets.pieces import PieceTable, open_piece_table
from parties import (
    dp,
    passive_align,
    passive_explain,
    passive_predict,
    passive_screen,
    passive_splits,
    passive_train,
    passive_warm,
)
from parties import drift as drift_exchange
from parties.passive_state import LookupTable, PassiveState
from protocols import messages as m
from protocols.serialization import check_message
from vfl.core.dp_bins_file import check_dp_bins, public_columns
from vfl.core.drift import check_reference
from vfl.core.files import write_json_atomic
from vfl.core.model import content_hash, read_model_json
from vfl.core.params import check_monotone
from vfl.core.tree import damaged, need_bool, need_dict, need_float, need_int, need_key, need_list, need_str

PASSIVE_FORMAT = "vfl-boost-passive-model"
#: the fields of a lookup-table record that decide predictions (what the model hash covers)
RECORD_CORE = ("record_id", "feature_idx", "feature", "threshold", "default_left")


def model_hash(d: dict) -> str:
    """sha256 of the canonical bytes of what a passive model decides predictions with: party,
    model id, id salt, features and each record's feature, threshold and default side (not the
    split gains shared later, the completion flag or the data fingerprint). Recorded in the
    party's file and, at training end, by the active party, which sends it with every
    prediction request: a modified lookup table is refused instead of changing predictions."""
    core = {"party": d["party"], "model_id": d["model_id"], "salt": d["salt"], "features": d["features"],
            "records": [{k: r[k] for k in RECORD_CORE} for r in d["records"]]}
    if d.get("trainer") is not None:        # who trained it (issue 22): bound, an edit is refused
        core["trainer"] = d["trainer"]
    return content_hash(core, exclude=())

#: every request a passive party answers, and its handler ``(state, request) -> reply``
HANDLERS = {
    m.AlignRequest: passive_align.align_request,
    m.AlignResult: passive_align.align_result,
    m.PsiRequest: passive_align.psi_request,
    m.PsiResult: passive_align.psi_result,
    m.TrainSetup: passive_train.setup,
    m.PublicKey: passive_train.public_key,
    m.Gradients: passive_train.gradients,
    m.GradientsStart: passive_train.gradients_start,
    m.GradientShard: passive_train.gradient_shard,
    m.HistogramRequest: passive_splits.histogram_request,
    m.SplitRequest: passive_splits.split_request,
    m.CandidatePick: passive_splits.candidate_pick,
    m.TrainEnd: passive_train.train_end,
    m.TrainContinue: passive_warm.continue_model,
    m.PredictStart: passive_predict.predict_start,
    m.EvalStart: passive_predict.eval_start,
    m.RouteRequest: passive_predict.route,
    m.PredictEnd: passive_predict.predict_end,
    m.LeafMaskRequest: passive_predict.leaf_mask,
    m.SplitGains: passive_predict.split_gains,
    m.FeatureSplitRequest: passive_explain.feature_split,
    m.DPReleaseRequest: dp.release,
    m.DPSplitRegister: dp.register_splits,
    m.DriftRequest: drift_exchange.drift_request,
    m.ScreenSetup: passive_screen.setup,
    m.ScreenRequest: passive_screen.request,
    m.ScreenDPRequest: passive_screen.dp_release,
    m.ScreenMerge: passive_screen.merge,
    m.ScreenEnd: passive_screen.end,
    m.FeatureSelect: passive_screen.select_features,
}


def check_model_dict(d, source: str = "passive model") -> list[dict]:
    """Schema and invariants of a passive model file (an InputError naming ``source`` and the
    field): party, model id, salt, features, and records numbered 0, 1, ... whose feature
    index and name match the features, with a threshold and a default side; the recorded
    ``model_hash``. Returns the records with float thresholds."""
    if not isinstance(d, dict) or d.get("format") != PASSIVE_FORMAT or d.get("role") != "passive":
        raise InputError(f"{source} is not a passive-party model file of this toolkit")
    if d.get("version", 1) != 1:
        raise InputError(f"{source}: passive model format version {d.get('version')!r} is not supported")
    g = lambda k: need_key(d, k, source, "")          # noqa: E731
    need_str(g("party"), source, "party")
    need_str(g("model_id"), source, "model_id")
    salt = need_str(g("salt"), source, "salt")
    try:
        bytes.fromhex(salt)
    except ValueError:
        raise damaged(source, "salt", "expected hex digits") from None
    need_str(d.get("id_col", "id"), source, "id_col")
    need_bool(d.get("completed", True), source, "completed")
    feats = need_list(g("features"), source, "features")
    feats = [need_str(f, source, f"features[{i}]") for i, f in enumerate(feats)]
    records = []
    for i, r in enumerate(need_list(g("records"), source, "records")):
        w = f"records[{i}]"
        r = need_dict(r, source, w)
        need_int(need_key(r, "record_id", source, w), source, f"{w}.record_id", i, i + 1)
        fi = need_int(need_key(r, "feature_idx", source, w), source, f"{w}.feature_idx", 0, len(feats))
        if need_str(need_key(r, "feature", source, w), source, f"{w}.feature") != feats[fi]:
            raise damaged(source, f"{w}.feature", f"{r['feature']!r} is not feature {fi} ({feats[fi]!r})")
        cats = r.get("categories")
        if cats is not None:        # a categorical split: the category codes going left, no threshold
            cats = need_list(cats, source, f"{w}.categories")
            for j, c in enumerate(cats):
                need_int(c, source, f"{w}.categories[{j}]", 0)
            if r.get("threshold") is not None:
                raise damaged(source, f"{w}.threshold", "a categorical split has no threshold")
            thr = None
        else:
            thr = need_float(need_key(r, "threshold", source, w), source, f"{w}.threshold", finite=False)
        need_bool(need_key(r, "default_left", source, w), source, f"{w}.default_left")
        for k in ("round", "tree", "node_id"):      # -1: a dp-mode record (registered, not asked)
            need_int(need_key(r, k, source, w), source, f"{w}.{k}", -1)
        if "gain" in r:
            need_float(r["gain"], source, f"{w}.gain", finite=False, allow_nan=True)
        records.append({**r, "threshold": thr})
    if d.get("dp_release") is not None:
        need_dict(d["dp_release"], source, "dp_release")
    if "model_hash" in d and model_hash(d) != d["model_hash"]:
        raise InputError(f"{source} was modified after it was written: its content does not match its "
                         "recorded model_hash (an edited or damaged file; restore it or train again)")
    return records


def _jf(x: float):
    x = float(x)
    return x if np.isfinite(x) else repr(x)


def record_to_json(r: dict) -> dict:
    """A lookup-table record as the model file holds it (a categorical one has no threshold)."""
    return {**r, "threshold": None if r.get("threshold") is None else _jf(r["threshold"])}


def record_from_json(r: dict) -> dict:
    """A record of a model file: the threshold as a float, or for a categorical split its codes."""
    if r.get("categories") is not None:
        if not isinstance(r["categories"], list) or not all(isinstance(c, int) for c in r["categories"]):
            raise InputError(f"passive model file: record {r.get('record_id')} has malformed categories")
        return {**r, "threshold": None}
    return {**r, "threshold": float(r["threshold"])}


def _state_attr(name: str, doc: str) -> property:
    """A public attribute of the party kept on its state."""
    return property(lambda self: getattr(self._state, name), lambda self, v: setattr(self._state, name, v),
                    doc=doc)


class PassiveParty:
    """A passive party: ``frame`` has the id column and this party's feature columns.

    ``categorical``: feature columns to treat as categories (text and pandas ``category``
    columns always are); ``monotone``: ``{feature: +1 | -1}``, this party's own monotone
    constraints (the active party learns only "feature at position j is increasing")."""

    name = property(lambda self: self._state.name, doc="the party's name")
    id_col = _state_attr("id_col", "name of the id column")
    source = _state_attr("source", "where the data came from (for messages)")
    n_jobs = _state_attr("n_jobs", "worker processes for the ciphertext kernels (None: VFL_N_JOBS)")
    feature_names = _state_attr("feature_names", "this party's feature columns, in order")
    model_id = _state_attr("model_id", "the model trained (or being trained)")
    salt = _state_attr("salt", "the id-hashing salt of the model")
    completed = _state_attr("completed", "whether the active party declared the training complete")
    # What this party accepts from the active party; set on an instance to restrict
    # (e.g. ``party.allowed_align = ("psi",)`` refuses hashed ids, also for prediction).
    allowed_align = _state_attr("allowed_align", "alignment methods accepted")
    allowed_prediction = _state_attr("allowed_prediction", "prediction protocols accepted")
    # DP mode: a NOT PRIVATE test seed of the noise (None: cryptographic noise, what every release
    # must use) and this party's cap on a release's epsilon per feature (None: none)
    dp_unsafe_noise_seed = _state_attr("dp_unsafe_noise_seed", "NOT PRIVATE test seed of the DP noise (None: secure)")
    dp_max_epsilon_per_feature = _state_attr("dp_max_epsilon_per_feature", "cap on a DP release's epsilon")
    # the lifetime privacy ledger (parties.dp_ledger): its file and the dataset's lifetime epsilon
    dp_ledger_path = _state_attr("dp_ledger_path", "lifetime privacy ledger file (None: none)")
    dp_lifetime_epsilon = _state_attr("dp_lifetime_epsilon", "the most epsilon the dataset may ever spend")
    min_node_rows = _state_attr("min_node_rows", "the least min_node_rows a training setup may agree")
    require_active_only_rounds = _state_attr("require_active_only_rounds",
                                             "the fewest first rounds on the active party's features only a "
                                             "training setup may agree")
    categorical_ordered = _state_attr("categorical_ordered", "categorical features as ordered bins: shuffled "
                                                             "candidates, no per-category sums (strict)")
    dp_model_min_node_rows = _state_attr("dp_model_min_node_rows", "the least min_node_rows of a DP model's training")
    limits = _state_attr("limits", "own limits (parties.passive_limits.Limits; None: none, a library party)")
    training_rows = _state_attr("training_rows", "digests of the ids the model was trained on (refused in prediction)")
    reveal_budget_path = _state_attr("reveal_budget_path", "lifetime reveal budget file (parties.reveal_budget)")
    trainer = _state_attr("trainer", "the identity of the client that trained the model (None: not recorded)")
    drift_policy = _state_attr("drift_policy", "drift requests: 'positions' (default), 'names' or 'decline'")
    drift_min_rows = _state_attr("drift_min_rows", "raises the fewest rows a drift run is answered over")
    # screening (issue 33): whether this party grants it (default: nobody) and the DP noise on its counts
    screen_allowed = _state_attr("screen_allowed", "whether this party answers a screening (default False)")
    screen_epsilon = _state_attr("screen_epsilon", "DP epsilon of the noise on the screening counts (None: exact)")
    psi_pending_cap = _state_attr("psi_pending_cap", "pending PSI exchanges kept (older ones are forgotten)")
    explain_features = _state_attr("explain_features", "whether this party splits its explanations among its own "
                                                       "features (opt-in; parties.passive_explain)")
    explain_dir = _state_attr("explain_dir", "where it writes its own features' explanations (None: memory only)")

    def __init__(self, name: str, frame: pd.DataFrame | None = None, id_col: str = "id",
                 source: str | None = None, n_jobs: int | None = None, executor: Executor | None = None,
                 categorical=None, monotone: dict | None = None, dp_bins: dict | None = None,
                 categorical_ordered: bool = False):
        """``categorical_ordered``: treat categorical features as ordered bins (shuffled candidates like
        any feature; the active party then gets no per-category sums), see :mod:`parties.passive_splits`."""
        self._state = PassiveState(str(name), id_col, source, check_n_jobs(n_jobs))
        self._state.categorical_ordered = bool(categorical_ordered)
        self.executor = executor
        if isinstance(frame, PieceTable):       # a Parquet table read piece by piece where needed
            if categorical:
                raise InputError(f"party {self.name!r}: categorical columns need the table read whole "
                                 "(read_party_table)")
            s = self._state
            s.ids, s.X, s.feature_names, s.categories = frame.ids, frame, list(frame.feature_names), {}
            s.source = s.source or frame.path
        elif frame is not None:
            s = self._state
            d = party_data(frame, s.name, id_col, None, source, require_features=True, categorical=categorical)
            s.ids, s.X, s.feature_names, s.categories = d.ids, d.X, d.feature_names, dict(d.categories or {})
        elif categorical:
            raise InputError(f"party {self.name!r}: categorical columns need the party's data")
        self.set_monotone(monotone)
        self.set_dp_bins(dp_bins)

    def set_dp_bins(self, dp_bins: dict | None) -> None:
        """This party's public bounds or bin edges per feature for a DP released model (``--dp-model``)
        and mode dp (:func:`vfl.core.dp_bins_file.check_dp_bins`): those features spend no budget on their
        edges; in mode dp ``"missing": false`` drops a feature's missing slot. Not used by other
        trainings (exact quantile bins)."""
        s = self._state
        where = f"party {s.name!r}" + (f" (file {s.source})" if s.source else "")
        spec = check_dp_bins(dp_bins, f"{where}: dp_bins")
        public_columns(spec, s.feature_names, s.name, " (its public bins name only its own features)")
        bad = [c for c in spec if c in s.categories]
        if bad:
            raise InputError(f"{where}: dp_bins on {bad[0]!r}, a categorical feature (public bins are for "
                             "numeric features)")
        s.dp_bins = spec

    @classmethod
    def from_file(cls, name: str, path, id_col: str = "id", **kwargs) -> "PassiveParty":
        """A party over its table file: a Parquet file or directory with numeric features is kept
        as a :class:`datasets.pieces.PieceTable` (ids and the piece plan in this process; the
        training rows are read, binned and split on by the workers holding them, prediction rows
        read per request), anything else is read whole (:func:`datasets.loaders.read_party_table`)."""
        from_path = open_piece_table(path, str(name), id_col, kwargs.get("categorical"))
        if from_path is None:
            from_path = read_party_table(path, str(name), id_col, categorical=kwargs.get("categorical")).frame
        return cls(name, from_path, id_col, source=str(path), **kwargs)

    def set_monotone(self, monotone: dict | None) -> None:
        """This party's monotone constraints ``{feature: +1 | -1}`` (checked against its features)."""
        s = self._state
        where = f"party {s.name!r}" + (f" (file {s.source})" if s.source else "")
        monotone = check_monotone(monotone, f"{where}: monotone constraints") or {}
        for f in monotone:
            if f not in s.feature_names:
                raise InputError(f"{where}: monotone constraint on {f!r}, which is not one of its feature "
                                 f"columns {s.feature_names[:10]}")
            if f in s.categories:
                raise InputError(f"{where}: monotone constraint on {f!r}: a categorical feature cannot be "
                                 "constrained")
        s.monotone = monotone

    @property
    def categories(self) -> dict:
        """``{categorical feature: its categories}`` (category code i is ``categories[f][i]``)."""
        return self._state.categories

    @property
    def monotone(self) -> dict:
        return dict(self._state.monotone)

    # -- the dispatcher -----------------------------------------------------
    @staticmethod
    def accepts(message_type: type) -> bool:
        """Whether a passive party answers requests of this type."""
        return message_type in HANDLERS

    def handle(self, request):
        """Answer one message from the active party."""
        handler = HANDLERS.get(type(request))
        if handler is None:
            raise ProtocolError(f"party {self.name!r} does not accept {type(request).__name__}")
        check_message(request)      # what the decoder checks, also for a message handed over in memory
        dp.guard(self._state, request)
        if isinstance(request, m.AlignRequest) or (isinstance(request, m.PsiRequest)
                                                   and request.purpose == m.PsiPurpose.TRAIN):
            passive_screen.restore_features(self._state)     # a new session: every feature (--min-iv)
        elif isinstance(request, (m.TrainSetup, m.ScreenSetup)):
            passive_screen.close_selection(self._state)
        if isinstance(request, (m.PredictStart, m.PsiRequest)) and request.model_hash:
            self.check_model_hash(request.model_hash)
        randomizer = self._state.train.randomizer
        if randomizer is None:
            reply = handler(self._state, request)
        else:       # its reply obfuscators are made while this party waits, not while it serves
            with randomizer.busy():
                reply = handler(self._state, request)
        if isinstance(request, m.TrainEnd) and self.completed and isinstance(reply, m.Ack):
            drift_exchange.fit_training_reference(self._state)      # its training rows' bin counts, kept
            reply.info["model_hash"] = self.model_hash()
        return reply

    def trained_ids(self):
        """The ids of the rows the training aligned (None before alignment)."""
        s = self._state
        return None if s.ids is None or s.train.rows is None else np.asarray(s.ids)[s.train.rows]

    def own_session(self, session_id: str, client: str) -> None:
        """Prediction session ``session_id`` belongs to ``client``: its decisions are charged to it."""
        self._state.session_owner[session_id] = client

    @property
    def training_refused(self) -> str | None:
        """The rule a training request broke (the training is then over), or None."""
        proto = self._state.train.protocol
        return None if proto is None else proto.refused

    def model_hash(self) -> str:
        """The hash of this party's model (:func:`model_hash`), recomputed when the table changes."""
        s = self._state
        key = (s.model_id, id(s.table.records), len(s.table.records))
        if getattr(self, "_hash_key", None) != key:
            self._hash, self._hash_key = model_hash(self.model_dict()), key
        return self._hash

    def check_model_hash(self, expected: str) -> None:
        """Refuse to predict with a model that is not the one the active party trained with."""
        if self.model_id is not None and self.model_hash() != expected:
            raise InputError(f"party {self.name!r}: its model {self.model_id!r} is not the one the active party "
                             "trained with (the content hash recorded at training end differs): its lookup table "
                             "file was modified or replaced; restore it or train again")

    def isolated_screening(self):
        """A context in which an in-process screening runs beside this party's trained model (its
        training session, salt and features are restored afterwards; ``Federation.screen``)."""
        return passive_screen.isolated(self._state)

    def screen_bins(self) -> dict[str, list[str]]:
        """This party's own view of its last screening: per feature the value range of every bin the
        active party reported (its pooled groups in this party's edges, missing last); never sent."""
        return passive_screen.local_bins(self._state)

    # -- public accessors ---------------------------------------------------
    @property
    def records(self) -> list[dict]:
        """The lookup table: one dict per split record (``record_id`` is its index)."""
        return self._state.table.records

    @records.setter
    def records(self, records: list[dict]) -> None:
        self._state.table = LookupTable(records)

    @property
    def n_aligned(self) -> int:
        """Number of training rows after alignment."""
        return int(len(self._state.aligned_rows()))

    def training_data_digest(self) -> str | None:
        """Fingerprint of the aligned training rows made by the workers that read them (a Parquet
        table read piece by piece); None when the rows are in this process (use
        ``aligned_features``)."""
        return self._state.train.data_digest

    def aligned_features(self) -> np.ndarray:
        """This party's feature matrix of the aligned training rows, in the aligned order."""
        s = self._state
        return s.X[s.aligned_rows()]

    @property
    def eval_session(self) -> str | None:
        """The id of the validation session of the training under way (None: none)."""
        return self._state.eval_session

    def has_session(self, session_id: str) -> bool:
        """Whether a prediction (or PSI) session of this id is open."""
        return self._state.has_session(session_id)

    def drop_session(self, session_id: str) -> None:
        """Forget a prediction session (its rows and any pending PSI state)."""
        self._state.drop_session(session_id)

    @property
    def executor(self) -> Executor | None:
        """The caller's executor for the ciphertext kernels and the row shards (e.g. a
        :class:`crypto.dask_executor.DaskExecutor`; used, never closed by the party); None: the
        party's own worker processes (``n_jobs``)."""
        return self._state.user_executor

    @executor.setter
    def executor(self, executor: Executor | None) -> None:
        if executor is not None and not isinstance(executor, Executor):
            raise InputError(f"executor must be a crypto.executor.Executor (e.g. DaskExecutor), got "
                             f"{type(executor).__name__}")
        self._state.user_executor = executor

    def close_executor(self) -> None:
        """Stop this party's worker processes (also done at TrainEnd and by garbage collection)."""
        self._state.close_executor()

    # -- local data ---------------------------------------------------------
    def load_prediction_data(self, frame: pd.DataFrame, source: str | None = None) -> None:
        """Rows this party can answer prediction queries about (its features of new samples)."""
        passive_predict.load_prediction_data(self._state, frame, source)

    # -- online scoring (parties/passive_online.py) ---------------------------
    def serve_index(self):
        """The id index of online scoring (:func:`passive_predict.serve_index`)."""
        return passive_predict.serve_index(self._state)

    @staticmethod
    def serve_rows(index, hashes):
        """Table rows of hashed ids in an index of :meth:`serve_index` (-1: unknown)."""
        sorted_hashes, rows, _ = index
        return passive_predict.serve_rows(sorted_hashes, rows, hashes)

    def serve_plan(self, request):
        """A scoring channel's checked skeleton (:func:`passive_predict.serve_plan`)."""
        check_message(request)
        if request.model_hash:
            self.check_model_hash(request.model_hash)
        return passive_predict.serve_plan(self._state, request)

    def serve_defaults(self, plan):
        """The default side of each of the channel's own nodes, in node order."""
        return self._state.table.default_left(plan[2]).tolist()

    def serve_charge(self, client, plan, rows):
        """The prediction limits of an online answer (:func:`passive_predict.serve_charge`)."""
        passive_predict.serve_charge(self._state, client, plan, rows)

    def serve_decisions(self, plan, X_rows):
        return passive_predict.serve_decisions(self._state, plan, X_rows)

    def clear_prediction_data(self) -> None:
        """Answer prediction queries about the training rows again."""
        self._state.pred_ids = self._state.pred_X = None

    def load_validation_data(self, frame: pd.DataFrame, source: str | None = None) -> None:
        """This party's features of the validation rows (used during training for metrics and
        early stopping; aligned by hashed id like the training set)."""
        passive_predict.load_validation_data(self._state, frame, source)

    # -- DP ledger and feature importance -----------------------------------
    @property
    def dp_releases(self) -> list[dict]:
        """Every release this party made (its privacy ledger), oldest first."""
        return self._state.dp_ledger

    def dp_release_info(self) -> dict | None:
        """The release of the current model, if it was trained in mode dp."""
        return dp.release_info(self._state)

    def feature_explanation(self) -> pd.DataFrame | None:
        """This party's own features' attributions of the rows explained with
        ``passive_features`` (opt-in: :attr:`explain_features`), the sessions kept, in order: ``id``
        (``target`` for a multiclass model), one column per own feature; they add up to this
        party's grouped attribution, which the active party sees. None: none yet."""
        kept = self._state.feature_explanations
        return pd.concat(kept, ignore_index=True) if kept else None

    def knows_split_gains(self) -> bool:
        """Whether the active party has shared the gain of every split of this party's records."""
        return all("gain" in r for r in self.records)

    def feature_importance(self, kind: str = "split", n_rounds: int | None = None) -> dict[str, float]:
        """This party's own features by name, from its own records: ``split`` (number of splits)
        or ``gain`` (total gain; needs the gains shared by the active party, see
        ``Federation.share_split_gains``). Unused features get 0. ``n_rounds``: count only the
        first rounds (e.g. up to the best iteration)."""
        if kind not in ("split", "gain"):
            raise InputError(f"importance kind must be 'split' or 'gain', got {kind!r}")
        if self.model_id is None:
            raise InputError(f"party {self.name!r} has no trained model")
        out = {f: 0.0 for f in self.feature_names}
        for r in self.records:
            if n_rounds is not None and r["round"] >= n_rounds:
                continue
            if kind == "gain":
                if "gain" not in r:
                    raise InputError(f"party {self.name!r} does not know the gains of its splits: the active "
                                     "party has not shared them (Federation.share_split_gains)")
                out[r["feature"]] += r["gain"]
            else:
                out[r["feature"]] += 1.0
        return out

    # -- persistence --------------------------------------------------------
    def model_dict(self) -> dict:
        if self.model_id is None:
            raise InputError(f"party {self.name!r} has no trained model to save")
        release = self.dp_release_info()
        return {"format": PASSIVE_FORMAT, "version": 1, "role": "passive", "party": self.name,
                "model_id": self.model_id, "salt": self.salt.hex(), "id_col": self.id_col,
                "features": list(self.feature_names), "completed": self.completed,
                **({"categories": {f: list(v) for f, v in self.categories.items()}} if self.categories else {}),
                **({"monotone": self.monotone} if self.monotone else {}),
                "records": [record_to_json(r) for r in self.records],
                **({"dp_release": release} if release else {}),
                **({"dp_training_ids": self._state.dp_training_ids.tolist()}
                   if self._state.dp_training_ids is not None else {}),
                **({"trainer": self.trainer} if self.trainer is not None else {}),
                **({"max_depth": self._state.max_depth} if self._state.max_depth is not None else {}),
                **({"drift_reference": self._state.drift_reference}
                   if self._state.drift_reference is not None else {}),
                **({"drift_withheld": self._state.drift_withheld} if self._state.drift_withheld else {})}

    def file_dict(self) -> dict:
        """What the model file holds: :meth:`model_dict` and its ``model_hash``."""
        d = self.model_dict()
        d["model_hash"] = model_hash(d)
        return d

    def save_model(self, path) -> None:
        write_json_atomic(path, self.file_dict(), indent=1)

    @classmethod
    def from_model_dict(cls, d: dict, source: str = "passive model") -> "PassiveParty":
        records = check_model_dict(d, source)
        p = cls(d["party"], None, d.get("id_col", "id"))
        p.feature_names = list(d["features"])
        p.model_id = d["model_id"]
        p.salt = bytes.fromhex(d["salt"])
        p.completed = bool(d.get("completed", True))
        trainer = d.get("trainer")
        if trainer is not None and not isinstance(trainer, str):
            raise damaged(source, "trainer", "must be the identity of the party that trained the model")
        p.trainer = trainer
        depth = d.get("max_depth")
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
            raise damaged(source, "max_depth", "must be a positive integer")
        p._state.max_depth = depth
        cats = d.get("categories") or {}
        if not isinstance(cats, dict) or not all(isinstance(v, list) for v in cats.values()):
            raise damaged(source, "categories", "must map feature names to lists of categories")
        p._state.categories = {str(f): list(v) for f, v in cats.items()}
        try:
            p.set_monotone(d.get("monotone"))
        except InputError as exc:
            raise damaged(source, "monotone", str(exc)) from None
        p.records = records
        if d.get("dp_release"):
            p.dp_releases.append(dict(d["dp_release"]))
        ids = d.get("dp_training_ids")
        if ids is not None:
            if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
                raise damaged(source, "dp_training_ids", "must list id digests (strings)")
            p._state.dp_training_ids = np.array(sorted(ids))
        if d.get("drift_reference") is not None:        # absent in files written before issue 34
            p._state.drift_reference = check_reference(d["drift_reference"], source)
        if d.get("drift_withheld") is not None:
            p._state.drift_withheld = need_str(d["drift_withheld"], source, "drift_withheld")
        return p

    def allow_warm_start(self, d: dict | None = None, source: str = "passive model") -> str:
        """Let a warm start continue a completed model of this party (``TrainContinue``): ``d`` its
        model dict (its own file's content, checked), default the model this party holds now (its
        last completed training). Returns the model id. Only this party's own calls register one:
        the requester names a base, never sends it."""
        if d is None:
            d = self.model_dict()
            records = [dict(r) for r in self.records]
        else:
            records = check_model_dict(d, source)
            if d["party"] != self.name:
                raise InputError(f"{source} is a model of party {d['party']!r}, not of {self.name!r}")
        entry = passive_warm.base_entry(self.name, d["salt"], d["features"], records, d.get("trainer"),
                                        bool(d.get("completed", True)), d["model_id"])
        self._state.warm_bases[d["model_id"]] = entry
        return d["model_id"]

    def predicting_with(self, d: dict, source: str = "passive model") -> "PassiveParty":
        """A party holding the completed model ``d`` that answers prediction queries about this
        party's own training rows (a warm start in one process scores its training rows with the
        base model this way)."""
        other = type(self).from_model_dict(d, source)
        if other.name != self.name or list(other.feature_names) != list(self.feature_names):
            raise InputError(f"{source}: a model of party {other.name!r} with features {other.feature_names[:10]}, "
                             f"not of party {self.name!r} with {self.feature_names[:10]}")
        other._state.ids, other._state.X = self._state.ids, self._state.X
        other._state.categories = dict(self._state.categories)
        other.id_col = self.id_col
        return other

    @classmethod
    def load_model(cls, path) -> "PassiveParty":
        return cls.from_model_dict(read_model_json(path, "passive model file"), str(path))
