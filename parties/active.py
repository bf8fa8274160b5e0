"""The active party: holds the labels and the private key, and drives training.

Passive parties appear to the boosting loop as :class:`parties.remote.RemoteSource`
histogram sources; the transport underneath (in memory or network) is
invisible here. One training (:meth:`ActiveParty.fit`) reads as the protocol:
align the ids, set up every passive party (bins, key), then boost, with the
round observers (:mod:`vfl.core.rounds`) in this order: the gradient channel
(encrypts each round once), the round's bytes, metrics and early stopping
(:mod:`parties.monitor`), checkpoints (:mod:`parties.checkpoint`), and the
caller's own observers and ``on_round`` callback.
"""
from __future__ import annotations

import dataclasses
import logging
import secrets

import numpy as np
import pandas as pd

from crypto.executor import Executor
from crypto.parallel import check_n_jobs
from datasets.errors import InputError
from datasets.frames import party_data
from datasets.loaders import DeferredColumns
from parties.channel import GradientChannel
from parties.checkpoint import CheckpointTracker
from parties.dp import booster_class, dp_only_binning, dp_sources
from parties.explain_features import chosen_parties, send_feature_splits
from parties.monitor import TrainingMonitor
from parties.psi_align import align_predict, align_train
from parties.remote import RemoteSource, end_prediction, leaf_mask_fetcher, source_map
from parties.screen import restore_own_features, select_by_iv
from parties.settings import Settings
from parties.warm_start import WarmStart
from protocols import alignment
from protocols import messages as m
from protocols.transport import Transport
from vfl.core import drift
from vfl.core.binning import feature_matrix
from vfl.core.dp_bins_file import public_columns
from vfl.core.dp_model import plan_dp_model
from vfl.core.dp_noise import NOT_PRIVATE
from vfl.core.explain import Explanation, explain_one_round
from vfl.core.leafmask import DEFAULT_PREDICTION, PREDICTIONS
from vfl.core.model import BoostedModel
from vfl.core.objectives import check_sample_weight, get_objective
from vfl.core.params import ALIGNMENTS, Alignment, Mode, Prediction, TrainParams
from vfl.core.rounds import CallbackObserver, RoundObserver, RoundRecord
from vfl.core.sources import HistogramSource, LocalSource

log = logging.getLogger("vfl.active")


class RoundBytes(RoundObserver):
    """Completes each round's timing record: the bytes of all frames of the round (both
    directions) and zero seconds for the crypto stages that did not run."""

    def __init__(self, transport: Transport):
        self.transport = transport
        self.last = transport.total_bytes()

    def round_finished(self, record: RoundRecord) -> None:
        for stage in ("encrypt", "histogram", "compress", "decrypt"):
            record.timing.add(stage, 0.0)
        total = self.transport.total_bytes()
        record.timing.bytes_sent = int(total - self.last)
        self.last = total


class WhileWaiting(RoundObserver):
    """Another observer whose ``round_finished`` waits for the passive parties (the validation's
    leaf masks between rounds): the executor's workers make obfuscators meanwhile
    (:meth:`parties.channel.GradientChannel.waiting`)."""

    def __init__(self, inner: RoundObserver, channel: GradientChannel):
        self.inner, self.channel = inner, channel

    def round_started(self, gradients) -> None:
        self.inner.round_started(gradients)

    def round_finished(self, record: RoundRecord) -> bool | None:
        with self.channel.waiting():
            return self.inner.round_finished(record)


class ActiveParty:
    """The label holder. ``frame`` has the id column, the label column and zero or more features.

    ``categorical``: feature columns to treat as categories (text and pandas ``category``
    columns always are); ``weight_col``: a column of sample weights (not a feature)."""

    #: send pre-shifted gradient copies so passive parties skip compression squarings:
    #: "auto" (cost model per round), True or False
    preshift: str | bool = "auto"
    #: Mbit/s of every link to a passive party, for the pre-shift cost model (None: measured on
    #: the gradient messages; the in-memory Federation sets the link it models)
    link_mbps: float | None = None

    def __init__(self, name: str, frame: pd.DataFrame, id_col: str = "id", label_col: str = "y",
                 source: str | None = None, n_jobs: int | None = None, executor: Executor | None = None,
                 categorical=None, weight_col: str | None = None, low_memory: bool = False,
                 features: DeferredColumns | None = None):
        """``low_memory``: a driver that trains once (``vfl party active``): ``frame`` is handed over
        and emptied column by column as it is read, and :meth:`fit` drops the raw feature matrix
        and the labels once they are binned and checked. Such a party trains once and predicts on
        new rows only.
        ``features``: the feature columns of a Parquet table, read by :meth:`fit` after the
        alignment (``frame`` then holds the id, label and weight columns only; see
        :func:`datasets.loaders.read_party_table_deferred`)."""
        self.name = str(name)
        self.low_memory = bool(low_memory)
        self.n_jobs = check_n_jobs(n_jobs)   # worker processes for encryption/decryption (None: VFL_N_JOBS)
        self.settings: Settings | None = None    # the last training's (read once when fit starts)
        if executor is not None and not isinstance(executor, Executor):
            raise InputError(f"executor must be a crypto.executor.Executor (e.g. DaskExecutor), got "
                             f"{type(executor).__name__}")
        self.executor = executor      # the caller's executor (e.g. a Dask cluster): used, never closed
        self.id_col, self.label_col, self.source = id_col, label_col, source
        self.sample_weight: np.ndarray | None = None
        self.weight_col = weight_col
        if weight_col is not None:
            frame = self._take_weights(frame, weight_col)
        d = party_data(frame, self.name, id_col, label_col, source, require_features=False,
                       allow_text_label=True, categorical=categorical, consume=self.low_memory)
        self.ids, self.X, self.feature_names, self.y_raw = d.ids, d.X, d.feature_names, d.y
        self.categories: dict = dict(d.categories or {})      # {categorical feature: vocabulary}
        self._deferred = features
        if features is not None:
            if self.feature_names:
                raise InputError(f"party {self.name!r}: give the feature columns either in the frame or as "
                                 f"deferred columns, not both (the frame has {self.feature_names[:5]})")
            self.X, self.feature_names = None, list(features.feature_names)
        self.model: BoostedModel | None = None
        self.alignment_report: dict = {}
        self.timings: list[dict] = []
        self.channel: GradientChannel | None = None
        self.label_mapping: dict | None = None     # multiclass: {original label: class index}

    def _take_weights(self, frame, weight_col: str):
        """Read the weight column (checked) and return the frame without it."""
        where = f"party {self.name!r}" + (f" (file {self.source})" if self.source else "")
        if not isinstance(frame, pd.DataFrame) or weight_col not in frame.columns:
            cols = list(frame.columns) if isinstance(frame, pd.DataFrame) else []
            raise InputError(f"{where}: weight column {weight_col!r} not found; columns are {cols[:10]}")
        if weight_col in (self.id_col, self.label_col):
            raise InputError(f"{where}: the weight column {weight_col!r} is the id or the label column")
        if self.low_memory:             # the handed-over frame itself loses the column
            col = frame.pop(weight_col)
        else:
            col, frame = frame[weight_col], frame.drop(columns=weight_col)
        if not (pd.api.types.is_numeric_dtype(col.dtype) or pd.api.types.is_bool_dtype(col.dtype)):
            raise InputError(f"{where}: weight column {weight_col!r} is not numeric (dtype {col.dtype})")
        self.sample_weight = check_sample_weight(col.to_numpy(dtype=np.float64, na_value=np.nan), len(frame),
                                                 self.name, weight_col)
        return frame

    def _feature_settings(self, params: TrainParams) -> tuple[np.ndarray, np.ndarray]:
        """``(categorical, monotone)`` per own feature; constraints checked against the features."""
        categorical = np.array([f in self.categories for f in self.feature_names], dtype=bool)
        monotone = np.zeros(len(self.feature_names), dtype=np.int8)
        for f, c in (params.monotone_constraints or {}).items():
            if f not in self.feature_names:
                raise InputError(f"monotone constraint on {f!r}: not a feature column of the active party "
                                 f"{self.name!r} (its features are {self.feature_names[:10]}); a passive "
                                 "party declares constraints on its own features")
            if f in self.categories:
                raise InputError(f"monotone constraint on {f!r}: a categorical feature cannot be constrained")
            monotone[self.feature_names.index(f)] = c
        return categorical, monotone

    # -- training -----------------------------------------------------------
    def align(self, transport: Transport, passives: list[str], salt: bytes, session_id: str):
        hashes = {self.name: alignment.hash_ids(self.ids, salt)}
        replies = transport.call_many({p: m.AlignRequest(session_id, salt) for p in passives})
        hashes |= {p: r.hashes for p, r in replies.items()}
        replies = None
        # intersect checks that every party's ids are unique, ours included; our rows come from its sort;
        # it takes each party's hashes out of the dict once sorted (never a party's hashes and their sort)
        common, rows = alignment.intersect(hashes, rows_of=self.name, consume=True)
        acks = transport.call_many({p: m.AlignResult(common) for p in passives})
        self.alignment_report = {self.name: {"n_rows": int(len(self.ids)), "n_kept": int(len(rows))},
                                 **{p: {"n_rows": a.n_rows, "n_kept": a.n_kept} for p, a in acks.items()}}
        return rows

    def align_psi(self, transport: Transport, passives: list[str], salt: bytes, session_id: str):
        """ECDH-PSI alignment (``TrainParams.align == "psi"``): own rows of the intersection,
        in the same canonical order as :meth:`align` with the same salt."""
        rows, self.alignment_report = align_train(transport, passives, self.name, self.ids, salt, session_id)
        return rows

    def fit(self, transport: Transport, passives: list[str], params: TrainParams | None = None,
            on_round=None, checkpoint=None, resume=None,
            validation: pd.DataFrame | None = None,
            observers: list[RoundObserver] | None = None, sample_weight=None, warm_start=None,
            warm_transport: Transport | None = None) -> BoostedModel:
        """Train with the passive parties ``passives`` (their names) behind ``transport``.

        ``on_round(round_idx, info)`` (optional) is called after every round with
        :meth:`vfl.core.rounds.RoundRecord.info`; a true result stops training. ``observers``
        (optional) receive the typed rounds (:class:`vfl.core.rounds.RoundObserver`), after this
        party's own.
        ``checkpoint(ck)`` (optional) receives a :class:`parties.checkpoint.Checkpoint` after every
        round; ``resume`` (such a checkpoint) continues that training with the same salt and model
        id, after checks that the data and parameters are the same.
        ``validation``: this party's frame of validation rows (id, label, features); the passive
        parties must have loaded theirs (``load_validation_data``). Gives per-round metrics (``model.history``)
        and early stopping (:mod:`parties.monitor`).
        ``sample_weight``: one weight per row of this party's frame (default: the ``weight_col``
        given at construction, else none).
        ``warm_start``: a completed :class:`BoostedModel` of these parties to continue with more
        rounds (:mod:`parties.warm_start`; ``params.n_estimators`` is the new total): a new model
        starting from its trees; ``warm_transport`` (default ``transport``) reaches the passive
        parties holding that model, to score the training rows with it.
        """
        params = params or TrainParams()
        passives = list(passives)
        if self.y_raw is None:
            raise InputError(f"party {self.name!r} holds no training data (a low_memory party trains once, "
                             "a party made from a model never)")
        if len(set(passives)) != len(passives) or self.name in passives:
            raise InputError(f"party names must be unique, got active {self.name!r} and passive {passives}")
        objective = get_objective(params.objective, huber_slope=params.huber_slope)
        if params.early_stopping_rounds is not None and validation is None:
            raise InputError("early_stopping_rounds needs a validation set")
        weights = self.sample_weight if sample_weight is None else \
            check_sample_weight(sample_weight, len(self.ids), self.name)
        restore_own_features(self)             # a training after one with min_iv: every own feature again
        selection = None
        if params.min_iv is not None:          # screen first, then train on the features at or above the cut
            if resume is not None:
                raise InputError("min_iv cannot be combined with resume (the checkpoint holds its own features)")
            passives, selection = select_by_iv(self, transport, passives, params)
        self._feature_settings(params)         # bad constraints fail before any message
        val = self._validation_data(validation) if validation is not None else None
        if not passives and not self.feature_names:
            raise InputError(f"party {self.name!r} has no feature columns and there is no passive party")
        if warm_start is not None and resume is not None:
            raise InputError("give either a checkpoint to resume or a model to warm-start from, not both")
        warm = None if warm_start is None else \
            WarmStart(warm_start, self.name, passives, params, self.feature_names, self.categories)
        self.settings = Settings.from_environ().for_party(self.n_jobs)    # once per training
        salt, model_id = alignment.new_salt(), secrets.token_hex(8)
        if resume is not None:
            salt, model_id = bytes.fromhex(resume.salt), resume.model_id
        if warm is not None:        # a new model under the saved model's salt
            salt = warm.salt
        try:    # the passive parties opened a session at the alignment: a failure before the training
                # loop (which ends with TrainEnd whatever happens) releases it at once
            rows = self._align(transport, passives, params, salt)
            if selection:                       # min_iv: each passive party trains on the positions it keeps
                transport.call_many({p: m.FeatureSelect(np.asarray(selection[p], dtype=np.int64)) for p in passives})
            self._read_deferred()
            drift_features = self._drift_features(rows)      # before a low_memory party lets go of its rows
            y = objective.check_labels(self.y_raw[rows], self.name, self.label_col, ids=self.ids[rows])
            if self.low_memory:
                self.y_raw = None         # the aligned labels are all the training needs
            # a warm start: the saved model's scores of the training rows (its prediction, before any round)
            warm_raw = None if warm is None else self._predict_arrays(
                warm_transport or transport, warm.model, self.ids[rows],
                feature_matrix(self.X, rows) if self.feature_names else np.zeros((len(rows), 0)),
                n_rounds=warm.n_rounds)
            tracker = None
            if checkpoint is not None or resume is not None:
                tracker = CheckpointTracker(self.name, passives, params, salt, model_id, self.ids[rows], self.X, y,
                                            self.feature_names, resume, checkpoint, rows=rows)
            self.dp_plan = plan_dp_model(params, objective.n_targets, len(passives) + bool(self.feature_names))
            self._dp_public = self._public_bins(params)
            if resume is not None and self.dp_plan.private:
                raise InputError("a --dp-model training cannot be resumed: new DP bin edges would spend budget "
                                 "again and disagree with the finished rounds")
            # the key first: the workers then make obfuscators while the passive parties bin their features
            self.channel = GradientChannel(params.mode, params.key_bits, params.encryption, self.settings,
                                           len(rows), executor=self.executor, name=self.name, scheme=params.scheme)
            booster_params = params
            try:
                with self.channel.waiting():
                    binning = dp_only_binning(params) if params.mode == Mode.DP else self.dp_plan.binning_setup()
                    # what each passive party will hold our requests to (parties.passive_checks); a DP released
                    # model grows every node whatever its rows (stopping on counts would leak): no row floor
                    floor = 1 if params.dp_model is not None else params.min_node_rows
                    self._check_active_only(params, passives)
                    infos = transport.call_many({p: m.TrainSetup(params.mode, params.max_bin, model_id,
                                                                 binning, params.max_cat, params.scheme,
                                                                 n_rounds=params.n_estimators,
                                                                 max_depth=params.max_depth, min_node_rows=floor,
                                                                 active_only_rounds=params.active_only_rounds)
                                                 for p in passives})
                    # the passive parties answer shuffled split candidates unless a DP released model keeps
                    # per-bin sums (parties.passive_splits)
                    self._shuffled = params.mode != Mode.DP and binning is None
                    self.channel.candidates = self._shuffled
                    self.channel.active_only_rounds = params.active_only_rounds
                    if warm is not None:
                        transport.call_many({p: m.TrainContinue(warm.model.model_id, warm.n_rounds,
                                                                warm.records.get(p, 0)) for p in passives})
                    if resume is not None:
                        acks = transport.call_many({p: m.TrainResume(model_id, resume.n_rounds,
                                                                     resume.records.get(p, 0)) for p in passives})
                        if any(isinstance(getattr(a, "info", None), dict) and a.info.get("completed")
                               for a in acks.values()):
                            # the passive parties were told the training finished (our final write then failed):
                            # the checkpoint holds every round; only the last step (TrainEnd, the model file) is left
                            booster_params = dataclasses.replace(params, n_estimators=resume.n_rounds)
            except BaseException:
                self.channel.close()
                raise
        except BaseException:
            self._release_session(transport, passives, model_id)
            raise
        booster, completed, ends = None, False, {}
        try:   # from here on, workers and passive parties are released whatever happens
            self._plan_channel(transport, passives, infos, params)
            sources = self._sources(transport, passives, infos, params, model_id,
                                    objective.gradients(y, np.tile(objective.base_score(y), (len(y), 1)))
                                    if params.mode == Mode.DP and params.dp_select else None, rows)
            if self.low_memory:       # binned, aligned, digested: the sources hold what training reads
                self.X = self.ids = None
            if self.dp_plan.private:    # what each party's bin edges spent (public bins: nothing)
                self.dp_plan.record_binning(
                    ({self.name: sources[0].binner.report()} if self.feature_names else {})
                    | {p: infos[p].dp_binning for p in passives})
            monitor = TrainingMonitor(objective, params, y)
            # between rounds, validation asks the passive parties for leaf masks: a wait like any other
            round_observers = [self.channel, RoundBytes(transport),
                               monitor if val is None else WhileWaiting(monitor, self.channel)]
            round_observers += [tracker] if tracker is not None else []
            round_observers += list(observers or [])
            round_observers += [CallbackObserver(on_round)] if on_round is not None else []
            booster = booster_class(sources)(sources, objective, booster_params, round_observers,
                                             map_sources=source_map(transport, sources), dp=self.dp_plan)
            if val is not None:
                with self.channel.waiting():
                    monitor.start_validation(transport, passives, model_id, salt, self.name, self.feature_names, *val)
            if resume is not None:
                monitor.restore(resume.rounds, resume.history)
            kwargs = tracker.booster_kwargs() if tracker is not None else {}
            if warm is not None:
                kwargs = warm.booster_kwargs(warm_raw, kwargs.get("rounds"))
                if tracker is not None:         # a resume of this training keeps the saved model's base score
                    tracker.template.base_score = warm.base_score()
                monitor.restore(kwargs["rounds"], warm.model.history)
            w = None if weights is None else weights[rows]
            if w is not None and not w.sum() > 0:
                raise InputError(f"sample weights of party {self.name!r} are all zero on the aligned rows")
            base, rounds, train_raw = booster.fit(y, row_keys=rows, sample_weight=w, **kwargs)
            if warm is not None:
                base = warm.base_score()
            elif resume is not None and resume.base_score is not None:     # a warm-started training resumed
                base = list(resume.base_score)
            completed = True
        finally:
            self.channel.close()
            try:
                ends = transport.call_many({p: m.TrainEnd(model_id, completed) for p in passives})
            except Exception:
                if completed:
                    raise
        self.timings = [t.as_dict() for t in booster.timings]
        self.model = BoostedModel(objective.name, objective.n_targets, [float(b) for b in base],
                                  params.learning_rate, self.name, self.feature_names, passives, model_id, salt.hex(),
                                  rounds, params.to_dict() | ({"privacy": NOT_PRIVATE + ": dp_unsafe_noise_seed seeded "
                                                                          "the DP noise"}
                                                              if params.dp_unsafe_noise_seed is not None else {}),
                                  settings=self.settings.to_dict())
        # each passive party's model hash at training end: checked by the party at every prediction
        self.model.party_hashes = {p: r.info["model_hash"] for p, r in (ends or {}).items()
                                   if isinstance(getattr(r, "info", None), dict)
                                   and isinstance(r.info.get("model_hash"), str)}
        self.model.categories = {f: list(v) for f, v in self.categories.items()}
        monitor.finish(self.model)
        if warm is not None:        # where the model came from (kept in its file)
            self.model.history["warm_start"] = {"model_id": warm.model.model_id, "n_rounds": warm.n_rounds}
        if params.dp_model is not None:
            self.model.dp_model = self.dp_plan.to_dict()
            if self.dp_plan.private:    # metrics on the training rows are not part of the DP release
                self.model.history.pop("train", None)
        self.model.classes = getattr(objective, "classes", None)
        self.label_mapping = dict(objective.mapping) if getattr(objective, "classes", None) else None
        self.model.drift = self._drift_reference(drift_features, objective, train_raw)
        return self.model

    def _drift_features(self, rows):
        """The bin counts of this party's features on the aligned training rows (None: no features,
        or a low_memory party, whose columns are never in memory whole)."""
        if not self.feature_names or not isinstance(self.X, np.ndarray):
            return None
        return drift.fit_reference(self.X[rows], self.feature_names, self.categories)

    def _drift_reference(self, features, objective, train_raw) -> dict:
        """What the model file keeps for drift: the features' and the score's training counts; a DP
        released model keeps none (they are not part of its private release)."""
        if self.dp_plan is not None and self.dp_plan.private:
            return {"withheld": "a DP released model keeps no training counts (they would not be private)"}
        out = {}
        if features is not None:
            out["features"] = features
        elif self.feature_names:
            out["withheld_features"] = "a low_memory party keeps no training counts of its features"
        if train_raw is not None:
            output = objective.transform(np.asarray(train_raw))
            cols, names = drift.score_columns(objective.name, output, getattr(objective, "classes", None))
            out["score"] = drift.fit_reference(cols, names)
        return out

    @staticmethod
    def _release_session(transport: Transport, passives: list[str], model_id: str) -> None:
        """Best effort after a failure before the training loop: tell every passive party the training
        ended unfinished (``TrainEnd``), so its training session is not left locked. A passive party
        that cannot be reached is skipped (the same client's next run takes the session over anyway)."""
        for p in passives:
            try:
                transport.call(p, m.TrainEnd(model_id, False))
            except Exception as exc:        # noqa: BLE001  (the original error is what matters)
                log.info("could not release the training session of party %r: %s", p, exc)

    def _read_deferred(self) -> None:
        """Check the deferred feature columns' ids: the same rows in the same order as the frame's,
        or the file changed under us. A ``low_memory`` party keeps the columns as a reader: binned
        (and fingerprinted) one column at a time, its features are never in memory whole. Any
        other party reads them into its matrix (it keeps its data)."""
        if self._deferred is None:
            return
        cols = self._deferred
        ids = cols.read_ids()
        if len(ids) != len(self.ids) or not np.array_equal(ids, self.ids):
            raise InputError(f"party {self.name!r}: the ids of {cols.source!r} changed between reading its labels "
                             "and its features; was the file replaced during training?")
        ids = None
        self.X = cols if self.low_memory else feature_matrix(cols)
        self._deferred = None

    def _public_bins(self, params: TrainParams) -> dict:
        """``{own feature index: entry}`` of ``params.dp_bins`` (public bounds/edges, --dp-bins)."""
        spec = params.dp_bins or {}
        bad = [c for c in spec if c in self.categories]
        if bad:
            raise InputError(f"dp_bins on {bad[0]!r}, a categorical feature of party {self.name!r} (public bins "
                             "are for numeric features)")
        return public_columns(spec, self.feature_names, self.name,
                              " (each passive party gives its own: PassiveParty(dp_bins=...), "
                              "vfl party passive --dp-bins)")

    def _align(self, transport: Transport, passives: list[str], params: TrainParams, salt: bytes) -> np.ndarray:
        """Own rows of the ids every party holds, in the canonical (salted hash) order."""
        session_id = secrets.token_hex(8)
        if params.align == Alignment.PSI:
            return self.align_psi(transport, passives, salt, session_id)
        return self.align(transport, passives, salt, session_id)

    def _plan_channel(self, transport: Transport, passives: list[str], infos: dict, params: TrainParams) -> None:
        """Tell the gradient channel what its pre-shift decision needs, and send the public key."""
        caps = [getattr(transport, "max_frame_bytes", None)] + \
            [info.get("max_frame_bytes") for info in getattr(transport, "peer_info", {}).values()]
        caps = [c for c in caps if isinstance(c, int) and c > 0]
        self.channel.plan(sum(int(np.sum(infos[p].n_bins)) for p in passives), params.max_depth, self.preshift,
                          min(caps) if caps else None, passives=passives, link_mbps=self.link_mbps)
        if params.mode == Mode.HE:
            with self.channel.waiting():
                # the key with (Paillier) its n-th-root proof: the passive parties re-randomise their replies
                # with their own r^n and require the proof first (issue 31)
                key = self.channel.public_key_message()
                transport.call_many({p: key for p in passives})

    def _sources(self, transport: Transport, passives: list[str], infos: dict, params: TrainParams,
                 model_id: str, root_gradients=None, own_rows=None) -> list[HistogramSource]:
        """This party's own features first (its rows ``own_rows`` of ``self.X``, binned without a
        copy of them), then every passive party's: remote (``he``/``plain``) or its one noisy
        release (``dp``, then trained locally)."""
        sources: list[HistogramSource] = []
        if self.feature_names:
            categorical, monotone = self._feature_settings(params)
            n_categories = {j: len(self.categories[f]) for j, f in enumerate(self.feature_names)
                            if f in self.categories}
            sources.append(LocalSource(self.name, self.X, self.feature_names, params.max_bin, categorical, monotone,
                                       params.max_cat, n_categories,
                                       binner=self.dp_plan.binner(params.max_bin, self._dp_public, self.name)
                                       if self.dp_plan.private else None, rows=own_rows))
        self.dp_report = {}
        if params.mode == Mode.DP:
            dp, self.dp_report = dp_sources(transport, passives, infos, params, model_id, len(own_rows), root_gradients,
                                            own_rows)
            if params.dp_unsafe_noise_seed is not None:
                self.dp_report["privacy"] = (f"{NOT_PRIVATE}: the DP noise was seeded (dp_unsafe_noise_seed="
                                             f"{params.dp_unsafe_noise_seed}); no epsilon holds")
            return sources + dp
        for p in passives:
            nb = infos[p].n_bins
            sources.append(RemoteSource(transport, p, np.concatenate([[0], np.cumsum(nb)]), self.channel,
                                        infos[p].categorical, infos[p].monotone,
                                        shuffled=getattr(self, "_shuffled", False)))
        return sources

    def _check_active_only(self, params: TrainParams, passives: list[str]) -> None:
        """``active_only_rounds`` needs own features (and is moot without passive parties)."""
        if params.active_only_rounds and passives and not self.feature_names:
            raise InputError(f"active_only_rounds={params.active_only_rounds}: party {self.name!r} has no feature "
                             "columns of its own to grow the first rounds on")

    def _without_weights(self, frame):
        wc = getattr(self, "weight_col", None)
        if wc is not None and isinstance(frame, pd.DataFrame) and wc in frame.columns:
            return frame.drop(columns=wc)
        return frame

    def crypto_seconds(self) -> dict[str, float]:
        """Seconds this party spent packing/encrypting and decrypting, over the whole training."""
        sums = {stage: float(sum(t.get(stage, 0.0) for t in self.timings)) for stage in ("encrypt", "decrypt")}
        return {stage: s for stage, s in sums.items() if s > 0}

    def _validation_data(self, frame):
        try:
            d = party_data(self._without_weights(frame), self.name, self.id_col, self.label_col, None,
                           require_features=False, allow_text_label=True, categories=self.categories)
        except InputError as exc:
            raise InputError(f"validation set: {exc}") from None
        missing = [f for f in self.feature_names if f not in d.feature_names]
        if missing:
            raise InputError(f"validation set: party {self.name!r} lacks feature column(s) {missing}")
        X = d.X[:, [d.feature_names.index(f) for f in self.feature_names]] if self.feature_names \
            else np.zeros((len(d.ids), 0))
        return d.ids, X, d.y

    # -- prediction ---------------------------------------------------------
    def predict_raw(self, transport: Transport, frame: pd.DataFrame | None = None,
                    source: str | None = None, prediction: str | None = None,
                    align: str | None = None, drift_run=None, last: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Raw scores for the rows of ``frame`` (the active party's columns of new samples);
        returns ``(ids, raw)``. ``drift_run`` (a :class:`parties.drift.DriftRun`): count this batch
        into it, and ask every passive party to count its rows too (``last``: the run's last batch).

        ``prediction``: "one-round" (leaf masks, the default) or "node" (node-by-node
        routing); ``align``: how the passive parties find the rows, "hash" (salted hashes
        under the model's salt) or "psi" (a fresh PSI per batch); default: as in training."""
        return self._predict(transport, frame, source, prediction, align, None, drift_run, last)

    def explain(self, transport: Transport, frame: pd.DataFrame | None = None, source: str | None = None,
                align: str | None = None, passive_features=False) -> tuple[np.ndarray, Explanation]:
        """``(ids, explanation)`` of the rows of ``frame``: grouped TreeSHAP values
        (:mod:`vfl.core.explain`) from a one-round prediction session, the very same one
        :meth:`predict_raw` runs (same messages; the passive parties' prediction rules and limits
        apply); nothing else is asked of them.

        ``passive_features`` (True, or a list of passive parties; opt-in at each of them): then each
        such party also splits its grouped value among its own features and keeps them
        (:mod:`parties.explain_features`; ``explanation.feature_splits``: the rows each explained)."""
        model = self._need_model()
        chosen = chosen_parties(model, passive_features)
        align = model.params.get("align", "hash") if align is None else align
        if chosen and str(align) != Alignment.HASH:
            raise InputError("passive_features needs align 'hash' (PSI alignment gives a passive party no ids to "
                             "name its rows by)")
        rounds = {}

        def use(model, X, fetch_masks):
            one = rounds["one"] = model.one_round(X, fetch_masks)
            ex = explain_one_round(model, one)
            ex.active_values = np.asarray(X, dtype=np.float64)
            return ex
        ids, ex = self._predict(transport, frame, source, Prediction.ONE_ROUND, align, use)
        if chosen:
            ex.feature_splits = send_feature_splits(transport, model, rounds["one"], ids, chosen, align)
        return ids, ex

    def _predict(self, transport: Transport, frame, source, prediction, align, use, drift_run=None, last=True):
        """A prediction session; ``use(model, X, fetch_masks)`` (one-round only) replaces the scoring;
        ``drift_run``/``last`` as in :meth:`predict_raw`."""
        model = self.model
        if model is None:
            raise InputError(f"party {self.name!r} has no trained model")
        if frame is None:
            if self.X is None:
                raise InputError(f"party {self.name!r} keeps no training rows (low_memory, or made from a "
                                 "model): give the rows to predict")
            ids, X = self.ids, self.X
        else:
            d = party_data(self._without_weights(frame), self.name, self.id_col, None, source,
                           require_features=False, categories=model.categories)
            missing = [f for f in model.active_features if f not in d.feature_names]
            if missing:
                raise InputError(f"party {self.name!r}: prediction data lacks feature column(s) {missing}")
            ids, X = d.ids, d.X[:, [d.feature_names.index(f) for f in model.active_features]] \
                if model.active_features else np.zeros((len(d.ids), 0))
        return ids, self._predict_arrays(transport, model, ids, X, prediction, align, use=use, drift_run=drift_run,
                                         last=last)

    def _predict_arrays(self, transport: Transport, model: BoostedModel, ids, X, prediction: str | None = None,
                        align: str | None = None, n_rounds: int | None = None, use=None, drift_run=None,
                        last: bool = True):
        """Raw scores of ``model`` (its first ``n_rounds`` rounds; default its own) for the rows ``ids``
        with this party's features ``X`` (in ``model.active_features`` order); ``use`` (one-round
        only) replaces the scoring and its result is returned; ``drift_run``/``last`` as in
        :meth:`predict_raw`."""
        prediction = DEFAULT_PREDICTION if prediction is None else prediction
        align = model.params.get("align", "hash") if align is None else align
        if prediction not in PREDICTIONS:
            raise InputError(f"prediction must be one of {PREDICTIONS}, got {prediction!r}")
        if align not in ALIGNMENTS:
            raise InputError(f"align must be one of {ALIGNMENTS}, got {align!r}")
        if align == Alignment.PSI:
            session_id = secrets.token_hex(8)
            align_predict(transport, list(model.passives), self.name, ids, session_id, model.model_id,
                          model.party_hashes)
        else:
            salt = bytes.fromhex(model.salt)
            hashes = alignment.hash_ids(ids, salt)
            alignment.check_unique_hashes(hashes, self.name)
            session_id = secrets.token_hex(8)
            transport.call_many({p: m.PredictStart(model.model_id, session_id, hashes,
                                                   model.party_hashes.get(p, ""))
                                 for p in model.passives})

        open_at = set(model.passives)    # parties still holding the session's rows
        try:
            if drift_run is not None:        # before the leaf masks end the session
                drift_run.ask(transport, session_id, last)
                raw = self._predict_session(transport, model, X, session_id, prediction, open_at, use, n_rounds)
                drift_run.add(X, raw)
                return raw
            return self._predict_session(transport, model, X, session_id, prediction, open_at, use, n_rounds)
        finally:        # the passive parties free the session's rows (and its slot) at once
            end_prediction(transport, [p for p in model.passives if p in open_at], session_id)

    @staticmethod
    def _predict_session(transport, model, X, session_id, prediction, open_at, use=None, n_rounds=None):
        """Score the open session's rows ``X`` (the first ``n_rounds`` rounds): leaf masks (one round)
        or node-by-node routing; ``use(model, X, fetch_masks)`` (one-round only) replaces the scoring
        (explanations)."""
        if prediction == Prediction.ONE_ROUND:
            fetch = leaf_mask_fetcher(transport, session_id)

            def fetch_masks(owner, skeleton):      # a one-round session ends with its leaf masks
                masks = fetch(owner, skeleton)
                open_at.discard(owner)
                return masks

            if use is not None:
                return use(model, X, fetch_masks)
            return model.predict_raw_one_round(X, fetch_masks, n_rounds)

        def route(owner, record_ids, rows):
            return transport.call(owner, m.RouteRequest(session_id, record_ids, rows)).go_left

        return model.predict_raw(X, route, n_rounds)

    def predict_proba(self, transport, frame=None, source=None, prediction=None,
                      align=None) -> tuple[np.ndarray, np.ndarray]:
        ids, raw = self.predict_raw(transport, frame, source, prediction, align)
        return ids, get_objective(self.model.objective).transform(raw)

    def predict(self, transport, frame=None, source=None, prediction=None,
                align=None) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, predictions)``: original class labels (binary 0/1, multiclass as in training)
        or regression values."""
        ids, raw = self.predict_raw(transport, frame, source, prediction, align)
        return ids, self.model.output_to_prediction(raw)

    def share_split_gains(self, transport) -> dict[str, int]:
        """Tell every passive party the gain of each of its own splits (opt-in; see docs/learner.md)."""
        model = self._need_model()
        per_party: dict[str, tuple[list, list]] = {p: ([], []) for p in model.passives}
        for rnd in model.rounds:
            for tree in rnd:
                for node in tree.nodes:
                    if not node.is_leaf and node.owner in per_party:
                        per_party[node.owner][0].append(node.record_id)
                        per_party[node.owner][1].append(node.gain)
        transport.call_many({p: m.SplitGains(model.model_id, np.array(r, dtype=np.int64),
                                             np.array(g, dtype=np.float64))
                             for p, (r, g) in per_party.items()})
        return {p: len(r) for p, (r, _) in per_party.items()}

    def _need_model(self) -> BoostedModel:
        if self.model is None:
            raise InputError(f"party {self.name!r} has no trained model")
        return self.model

    def save_model(self, path) -> None:
        if self.model is None:
            raise InputError(f"party {self.name!r} has no trained model to save")
        self.model.save(path)

    @classmethod
    def from_model(cls, model: BoostedModel, id_col: str = "id") -> "ActiveParty":
        obj = cls.__new__(cls)
        obj.name, obj.id_col, obj.label_col, obj.source = model.active_party, id_col, None, None
        obj.ids = obj.X = obj.y_raw = None
        obj.low_memory = False
        obj.feature_names = list(model.active_features)
        obj.model = model
        obj.alignment_report, obj.timings, obj.channel = {}, [], None
        obj.label_mapping = {c: i for i, c in enumerate(model.classes)} if model.classes else None
        obj.n_jobs = None
        obj.settings = None
        obj.executor = None
        obj.categories = dict(model.categories)
        obj.sample_weight, obj.weight_col = None, None
        return obj
