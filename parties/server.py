"""A passive party as a long-running service (``vfl party passive``).

It serves one training session at a time and, afterwards, prediction requests
for every model it holds. Its lookup tables (thresholds) live in its own model
directory, one file per model, ``<model_id>.json``; the file is rewritten
(atomically) after every split, so an interrupted training can be resumed
with the records the active party's checkpoint refers to. A model is served
for prediction only once the active party declared it complete.

Messages are dispatched to :class:`parties.passive.PassiveParty` objects: a
fresh one per training session (created by the session's first message) and
one per finished model.

Concurrency and limits: every request names its client (the caller's
certificate names under TLS, else its token or claimed party name and host;
see :class:`protocols.grpc_server.PartyServer` and :func:`client_identity`). A
training session belongs to the client that opened it, by identity, not by
connection: a restarted process of that client takes it over at once, others are
refused until it ends or stays idle for :attr:`PassiveServer.TRAINING_IDLE_SECONDS`.
A refused request changes no session, and ``TrainEnd`` closes the session whatever
happens (a file that cannot be written). The session has its own lock; each
prediction session has its own lock, so predictions run concurrently with each
other and with a training. Prediction sessions are limited per client and in
all; a session in use (a request in flight, or used within
:attr:`PassiveServer.SESSION_IDLE_SECONDS`) is never evicted: at a limit a new
session is refused with "busy, retry" (:class:`protocols.transport.BusyError`,
which the caller's transport retries with backoff).
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from datasets.errors import InputError, ProtocolError, VFLError
from parties.checkpoint import data_digest
from parties.passive import PASSIVE_FORMAT, PassiveParty, check_model_dict, record_from_json
from parties.prediction_limits import load_training_rows, rows_path, save_training_rows
from protocols import messages as m
from protocols.transport import BusyError, frame_handler
from vfl.core.files import check_writable_dir, write_json_atomic

log = logging.getLogger("vfl.passive")


#: what a request of a training session taken over by a newer session of the same client is told
TAKEN_OVER = "was taken over by a newer session"


def session_tag(who) -> str | None:
    """The tag of the caller's process (:attr:`protocols.grpc_server.Caller.session`, one per
    transport), or None (in-memory callers, older clients): two processes of one identity differ."""
    return getattr(who, "session", None)


def client_identity(who, client: str | None = None) -> str:
    """The identity a request is charged to (training-session ownership, per-client limits): the
    ``client`` given, else the transport's :attr:`protocols.grpc_server.Caller.client` (the
    certificate names under TLS, else the token holder's claimed party name and host), else
    ``who`` itself (in-memory callers). Never the caller's description, which holds the source
    port: a restarted process of the same party is the same client."""
    if client is not None:
        return str(client)
    ident = getattr(who, "client", None)
    return str(ident) if ident else str(who)


_MODEL_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _check_model_id(model_id: str) -> str:
    if not isinstance(model_id, str) or not _MODEL_ID_RE.match(model_id):
        raise ProtocolError(f"model id {model_id!r} is not acceptable (letters, digits, '_' and '-' only)")
    return model_id


@dataclass(eq=False)
class _PredictionSession:
    """A prediction session: its model's party, its owner, its own lock, how busy it is."""
    session_id: str
    model_id: str
    party: PassiveParty
    client: str
    last_used: float
    in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def idle_for(self, now: float) -> float:
        return 0.0 if self.in_flight else now - self.last_used


class PassiveServer:
    """Message handler of a passive party's server: training sessions, models, predictions.

    ``frame`` holds the party's id column and features; it is used to train
    (rows in the intersection) and to answer prediction queries (rows whose
    hashed ids the active party sends), so it should cover the rows to score.
    """

    #: message types that start a new training session (``PsiRequest`` too when its purpose is "train")
    SESSION_START = (m.AlignRequest,)
    #: message types that start a prediction session for a finished model (by ``model_id``)
    PREDICTION_START = (m.PredictStart,)
    #: prediction sessions open at once, in all and per client
    MAX_PREDICTION_SESSIONS = 256
    MAX_SESSIONS_PER_CLIENT = 32
    #: a prediction session unused this long (and no request in flight) may be evicted
    SESSION_IDLE_SECONDS = 120.0
    #: training sessions taken over whose process is told so at its next request
    TAKEN_OVER_KEPT = 64
    #: a training session unused this long may be taken over by another client
    TRAINING_IDLE_SECONDS = 600.0
    #: the retry hint of a "busy, retry" refusal, seconds
    BUSY_RETRY_AFTER = 0.1

    #: policy attributes copied onto every :class:`PassiveParty` the server creates or loads
    POLICY = ("allowed_align", "allowed_prediction", "dp_max_epsilon_per_feature", "dp_ledger_path",
              "dp_lifetime_epsilon", "min_node_rows", "drift_policy", "drift_min_rows", "screen_allowed",
              "screen_epsilon", "require_active_only_rounds", "categorical_ordered", "limits", "reveal_budget_path",
              "dp_model_min_node_rows", "explain_features", "explain_dir")

    def __init__(self, name: str, frame: pd.DataFrame, id_col: str = "id", model_dir=".",
                 source: str | None = None, policy: dict | None = None,
                 validation_frame: pd.DataFrame | None = None, validation_source: str | None = None,
                 executor=None, categorical=None, monotone: dict | None = None, dp_bins: dict | None = None,
                 access=None):
        """``categorical``/``monotone``/``dp_bins``: this party's categorical columns, monotone constraints
        and public bins (see :class:`PassiveParty`), used by every training it serves; ``executor``: its compute;
        ``access``: who may train and predict (:class:`parties.federation.Access`; None: no check)."""
        self.name, self.frame, self.id_col, self.source = str(name), frame, id_col, source
        self.access = access
        self.executor = executor        # the party's own compute (e.g. its Dask cluster) for every training
        self.categorical, self.monotone, self.dp_bins = categorical, monotone, dp_bins
        # this party's features of validation rows, for trainings that use a validation set
        self.validation_frame, self.validation_source = validation_frame, validation_source
        self.policy = dict(policy or {})
        unknown = set(self.policy) - set(self.POLICY)
        if unknown:
            raise InputError(f"unknown passive-party policy setting(s) {sorted(unknown)}; known: {self.POLICY}")
        probe = self._new_party()     # validates the data (and the column options) once
        self.feature_names = list(probe.feature_names)
        self.n_rows = int(len(frame))
        self.model_dir = Path(model_dir)
        if self.model_dir.exists() and not self.model_dir.is_dir():
            raise InputError(f"--model-dir {self.model_dir} is not a directory")
        check_writable_dir(self.model_dir, "--model-dir")     # refused up front, not at the first split
        self.models: dict[str, PassiveParty] = {}
        self.unfinished: set[str] = set()
        self.training: PassiveParty | None = None
        self.training_peer: str | None = None
        self.training_client: str | None = None
        #: the session tag of the process that opened the training (``Caller.session``, issue 36 item 7):
        #: a later training session of the same client takes over; the earlier process is told so
        self.training_tag: str | None = None
        #: tags of training sessions taken over -> (client, model id): their next request is told so,
        #: also after the newer session ended (the last TAKEN_OVER_KEPT of them)
        self._taken_over: dict[str, tuple[str, str | None]] = {}
        self._training_used = 0.0
        self._digest: str | None = None
        self._wrote = False         # the session wrote its model's file (a new model, or a resume accepted)
        self._reopening: str | None = None     # a finished model set up again: only TrainResume may follow
        self._sessions: dict[str, _PredictionSession] = {}
        # the table's version (1 at start, +1 at every reload) and, per model, the version its
        # prediction rows were loaded from: a stale model is loaded again at its next session
        self.table_version = 1
        self._prediction_ready: dict[str, int] = {}
        #: online scoring (``ServeOpen``/``ScoreRequest``): :class:`parties.passive_online.OnlineScoring`
        self.online = None
        self._lock = threading.Lock()             # the registry (sessions, models, training pointer): held briefly
        self._train_lock = threading.RLock()      # the training session's work
        self._model_locks: dict[str, threading.Lock] = {}
        #: requests this party refused (a rule, bad input, a peer's error): answered, not served
        self.refused_requests = 0
        self._refused_lock = threading.Lock()
        self._load_models()

    def _new_party(self) -> PassiveParty:
        return PassiveParty(self.name, self.frame, self.id_col, self.source, categorical=self.categorical,
                            monotone=self.monotone, dp_bins=self.dp_bins)

    def _configure(self, party: PassiveParty) -> PassiveParty:
        for k, v in self.policy.items():
            setattr(party, k, v)
        party.id_col = self.id_col
        party.psi_pending_cap = self.MAX_PREDICTION_SESSIONS + 1    # the server bounds its sessions itself
        if self.executor is not None:
            party.executor = self.executor
        return party

    # -- model files --------------------------------------------------------
    def model_path(self, model_id: str) -> Path:
        return self.model_dir / f"{_check_model_id(model_id)}.json"

    def _read_model_file(self, path: Path) -> dict | None:
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("%s: ignoring unreadable file %s: %s", self.name, path, exc)
            return None
        if not isinstance(d, dict) or d.get("format") != PASSIVE_FORMAT or d.get("role") != "passive":
            return None
        if d.get("party") != self.name:
            log.warning("%s: ignoring %s: it belongs to party %r", self.name, path, d.get("party"))
            return None
        return d

    def _load_models(self) -> None:
        for path in sorted(self.model_dir.glob("*.json")):
            d = self._read_model_file(path)
            if d is None:
                continue
            mid = d.get("model_id")
            if not d.get("completed", False):
                self.unfinished.add(mid)
                log.info("%s: model %s in %s is unfinished (%d records): it can be resumed, not used",
                         self.name, mid, path, len(d.get("records", [])))
                continue
            try:
                self.models[mid] = self._configure(PassiveParty.from_model_dict(d, str(path)))
                self.models[mid].training_rows = load_training_rows(rows_path(self.model_dir, mid))
            except (InputError, KeyError, TypeError, ValueError) as exc:
                log.warning("%s: ignoring model file %s: %s", self.name, path, exc)
                continue
        log.info("%s: %d model(s) ready for prediction in %s%s", self.name, len(self.models), self.model_dir,
                 (": " + ", ".join(sorted(self.models))) if self.models else "")

    def _persist(self) -> None:
        p = self.training
        d = p.file_dict()
        d["data_digest"] = self._digest
        write_json_atomic(self.model_path(p.model_id), d)
        self._wrote = True

    @staticmethod
    def _data_digest(p: PassiveParty) -> str:
        """Fingerprint of the training rows (in aligned order) and feature names: a resumed training
        must see exactly the same data. (No ids and no labels: the same value as the lookup tables
        written before hold, so their trainings still resume.)"""
        made = p.training_data_digest()        # a Parquet table read by the workers: their fingerprint
        return made if made is not None else data_digest((), p.aligned_features(), (), p.feature_names, layout="rows")

    # -- entry points -------------------------------------------------------
    def handle_frame(self, frame: bytes, who: str = "?", client: str | None = None) -> bytes:
        """Bytes in, bytes out (errors become an ErrorReply). ``who`` describes the caller for
        logs; ``client`` is its identity for session ownership and limits (default: ``who``)."""
        return frame_handler(lambda req: self.handle(req, who, client))(frame)

    def handle(self, request, who: str = "?", client: str | None = None):
        kind = type(request).__name__
        client = client_identity(who, client)
        try:
            return self._dispatch(kind, request, who, client)
        except BusyError as exc:
            log.info("%s: busy for %s from %s: %s", self.name, kind, who, exc)
            raise
        except VFLError as exc:
            with self._refused_lock:
                self.refused_requests += 1
            log.warning("%s: refused %s from %s: %s", self.name, kind, who, exc)
            raise

    def _dispatch(self, kind: str, request, who: str, client: str):
        purpose = request.purpose if isinstance(request, m.PsiRequest) else None
        if isinstance(request, self.SESSION_START) or purpose == m.PsiPurpose.TRAIN:
            return self._start_session(request, who, client)
        if isinstance(request, self.PREDICTION_START) or purpose == m.PsiPurpose.PREDICT:
            return self._on_predict_start(request, who, client)
        if isinstance(request, (m.ServeOpen, m.ScoreRequest)):
            if self.online is None:
                raise ProtocolError(f"party {self.name!r} does not serve online scoring")
            return self.online.handle(request, who, client)
        sid = getattr(request, "session_id", None)
        with self._lock:
            session = self._sessions.get(sid) if isinstance(sid, str) else None
            if session is not None:
                if session.client != client:
                    raise ProtocolError(f"party {self.name!r}: prediction session {sid!r} belongs to another "
                                        "client")
                session.in_flight += 1
        if session is not None:                         # any prediction-session message
            return self._in_session(session, request)
        if isinstance(request, m.PredictEnd):           # already over (e.g. a one-round session)
            return m.Ack({"known": False})
        if isinstance(request, (m.RouteRequest, m.LeafMaskRequest)):
            with self._train_lock:
                t = self.training
                if t is not None and sid is not None and sid == t.eval_session:
                    self._check_owner(kind, client, who)
                    return t.handle(request)      # the validation rows of the training under way
            raise ProtocolError(f"unknown or expired prediction session {request.session_id!r}")
        if not PassiveParty.accepts(type(request)) and not isinstance(request, m.TrainResume):
            raise ProtocolError(f"party {self.name!r} does not accept {kind}")
        with self._train_lock:
            p = self._need_training(kind, client, who)
            if isinstance(request, (m.ScreenSetup, m.ScreenEnd)):
                return self._on_screen(p, request, who, client)
            if isinstance(request, m.TrainSetup):
                try:
                    return self._on_setup(request, who)
                except ProtocolError as exc:      # a setup this party refuses (a rule) ends the session
                    log.warning("%s: training session of %s ends: its setup was refused (%s)", self.name, who, exc)
                    p.close_executor()
                    with self._lock:
                        self.training, self.training_peer, self.training_client, self._digest = None, None, None, None
                    raise
            if isinstance(request, m.TrainResume):
                return self._on_resume(request, who)
            if self._reopening is not None:     # a finished model was set up again, but not to be resumed
                mid, self._reopening = self._reopening, None
                with self._lock:
                    self.training, self.training_peer, self.training_client, self._digest = None, None, None, None
                raise ProtocolError(f"party {self.name!r} already holds a finished model {mid!r}")
            if isinstance(request, m.TrainContinue):
                return self._on_continue(p, request, who)
            try:
                return self._on_training_message(p, request, who)
            except ProtocolError:
                refused = p.training_refused
                if refused is not None and self.training is p:
                    log.warning("%s: training of model %s for %s ends: a refused request (%s)", self.name,
                                p.model_id, who, refused)
                    p.close_executor()
                    with self._lock:
                        self.training, self.training_peer, self.training_client, self._digest = None, None, None, None
                raise

    def _end_session(self, p: PassiveParty) -> None:
        p.close_executor()
        with self._lock:
            if self.training is p:
                self.training, self.training_peer, self.training_client, self._digest = None, None, None, None
                self._reopening = None

    def _on_screen(self, p: PassiveParty, request, who: str, client: str):
        """A screening session (issue 33): its setup needs the caller's grant (the federation entry's
        ``screen`` list, :meth:`parties.federation.Access.check_screen`); its end, or a refused setup,
        closes the session (no model file is written)."""
        if isinstance(request, m.ScreenEnd):
            try:
                return p.handle(request)
            finally:
                self._end_session(p)
                log.info("%s: screening %s for %s ended", self.name, request.model_id, who)
        try:
            if self.access is not None:
                self.access.check_screen(client)
                p.screen_allowed = True
            reply = p.handle(request)
        except VFLError as exc:
            log.warning("%s: screening session of %s ends: its setup was refused (%s)", self.name, who, exc)
            self._end_session(p)
            raise
        log.info("%s: screening %s for %s: %s mode, %d rows aligned, %d features, max_bin %d%s", self.name,
                 request.model_id, who, request.mode, p.n_aligned, len(p.feature_names), request.max_bin,
                 "" if p.screen_epsilon is None else f", DP noise epsilon {p.screen_epsilon}")
        return reply

    def _on_training_message(self, p: PassiveParty, request, who: str):
        if isinstance(request, m.TrainEnd):
            return self._on_train_end(p, request, who)
        reply = p.handle(request)
        if isinstance(request, m.Gradients):
            log.info("%s: round %d: %d %s gradient values from %s", self.name, request.round_idx,
                     len(request.values), "encrypted" if request.encrypted else "PLAINTEXT", who)
        elif isinstance(request, m.GradientsStart):
            log.info("%s: round %d: %s gradients of %d samples streamed from %s", self.name, request.round_idx,
                     "encrypted" if request.encrypted else "PLAINTEXT", request.n_samples, who)
        elif isinstance(request, (m.SplitRequest, m.CandidatePick, m.DPSplitRegister)):
            # a split answered (by (feature, bin), or by a shuffled candidate's position): the records are kept for
            # --resume (dp mode cannot resume: TrainEnd writes it)
            if isinstance(request, (m.SplitRequest, m.CandidatePick)):
                self._persist()
            log.debug("%s: %d split(s) for %s; %d records", self.name, len(request.node_ids if isinstance(
                      request, (m.SplitRequest, m.CandidatePick)) else request.feature_idx), who, len(p.records))
        elif isinstance(request, m.DPReleaseRequest):
            log.info("%s: model %s: noisy (DP) bucket release to %s, epsilon %s per feature", self.name,
                     request.model_id, who, request.epsilon_per_feature)
        return reply

    def _on_train_end(self, p: PassiveParty, request: m.TrainEnd, who: str):
        """The end of a training session, completed or not. The session is closed whatever happens
        (a file that cannot be written, a model id that does not match): its owner said it is over,
        and a session left open would lock the party until it is taken over."""
        mid = p.model_id
        try:
            if mid is None and not request.completed:      # the active party failed before TrainSetup
                log.warning("%s: training session from %s released before any model was set up", self.name, who)
                return m.Ack({"released": True})
            reply = p.handle(request)
            if not self._wrote and self.model_path(mid).exists():
                # a session that never took its model's file over (a resume refused, or not sent):
                # the file keeps the records a later --resume needs
                log.warning("%s: training session of model %s from %s ended before it resumed; %s is kept as "
                            "it was", self.name, mid, who, self.model_path(mid))
                return reply
            try:
                self._persist()
            except BaseException:
                with self._lock:
                    self.unfinished.add(mid)
                log.warning("%s: model %s: could not save the lookup table at the end of training; the session is "
                            "closed, the records of the last saved split are kept for a resume", self.name, mid)
                raise
            if p.completed:
                finished = self._configure(PassiveParty.from_model_dict(p.model_dict()))
                ids = p.trained_ids()     # the rows it was trained on: prediction refuses them (issue 31)
                if ids is not None:
                    finished.training_rows = save_training_rows(rows_path(self.model_dir, mid), ids)
                with self._lock:
                    self.models[mid] = finished
                    self.unfinished.discard(mid)
                log.info("%s: model %s completed by %s (%d records) and saved to %s", self.name, mid, who,
                         len(p.records), self.model_path(mid))
            else:
                with self._lock:
                    self.unfinished.add(mid)
                log.warning("%s: training of model %s stopped by %s before the end; %d records kept in %s "
                            "for a resume", self.name, mid, who, len(p.records), self.model_path(mid))
            return reply
        finally:
            p.close_executor()
            with self._lock:
                if self.training is p:
                    self.training, self.training_peer, self.training_client, self._digest = None, None, None, None
                    self._reopening = None

    # -- training -----------------------------------------------------------
    def _start_session(self, request, who, client):
        """Open a training session for ``client``: refused while another client's session is in use;
        the same client (a restarted process, e.g. ``--resume`` after a crash) takes its own session
        over at once. The request is validated and answered on a fresh party before anything
        changes hands: a refused request leaves the current session (or none) as it was."""
        trainer = self.access.check_train(client) if self.access is not None else None
        with self._train_lock:
            with self._lock:
                t = self.training
                if t is not None and self.training_client != client:
                    idle = time.monotonic() - self._training_used
                    if idle < self.TRAINING_IDLE_SECONDS:
                        raise ProtocolError(
                            f"party {self.name!r} is training model {t.model_id!r} for another client "
                            f"({self.training_peer}): the session belongs to another client (it can be taken "
                            f"over after {self.TRAINING_IDLE_SECONDS:g} s without a request)")
            party = self._configure(self._new_party())
            party.trainer = trainer         # bound into the model file: who may predict by default
            try:
                if self.validation_frame is not None:
                    party.load_validation_data(self.validation_frame, self.validation_source)
                reply = party.handle(request)
            except BaseException:
                party.close_executor()
                raise
            if t is not None:
                log.warning("%s: %s starts a new training session; the unfinished session of model %s (from %s) "
                            "is %s", self.name, who, t.model_id, self.training_peer,
                            "taken over" if self.training_client == client else "abandoned")
                t.close_executor()
            with self._lock:
                old_tag, new_tag = self.training_tag, session_tag(who)
                if t is not None and self.training_client == client and old_tag not in (None, new_tag):
                    self._taken_over[old_tag] = (client, t.model_id)
                    while len(self._taken_over) > self.TAKEN_OVER_KEPT:
                        self._taken_over.pop(next(iter(self._taken_over)))
                self.training, self.training_peer, self.training_client = party, who, client
                self.training_tag = new_tag
                self._digest, self._training_used, self._reopening = None, time.monotonic(), None
                self._wrote = False
            log.info("%s: training session %s opened by %s (%s alignment, %d rows)", self.name,
                     request.session_id, who, "PSI" if isinstance(request, m.PsiRequest) else "hash", self.n_rows)
            return reply

    def holds_session(self, client: str) -> bool:
        """Whether ``client`` holds a training, prediction or scoring session (channel) here (the transport caps the
        calls of callers holding none: :class:`protocols.grpc_server.PartyServer`)."""
        with self._lock:
            if self.training_client == client or any(x.client == client for x in self._sessions.values()):
                return True
        online = self.online
        return online is not None and online.has_channel(client)

    def _check_owner(self, kind: str, client: str, who=None) -> None:
        if self.training_client != client:
            raise ProtocolError(f"party {self.name!r}: {kind} for a training session that belongs to another "
                                "client")
        tag, mine = session_tag(who), self.training_tag
        if tag is not None and mine is not None and tag != mine:
            # the same identity (certificate) trains from another process: the newer session owns the
            # party; the older process is told so, instead of corrupting the newer session's state
            self._refuse_taken_over(client, tag)
        self._training_used = time.monotonic()

    def _refuse_taken_over(self, client: str, tag: str | None) -> None:
        """Refuse a request of a training session that a newer session of the same client took over
        (issue 36, item 7; nothing when ``tag`` names no such session)."""
        if tag is None or (tag not in self._taken_over and tag == self.training_tag):
            return
        was = self._taken_over.get(tag)
        if was is None and self.training is None:
            return
        model = f" of model {was[1]!r}" if was is not None and was[1] else ""
        raise ProtocolError(f"party {self.name!r}: this training session{model} {TAKEN_OVER} "
                            f"of the same client ({client}): another process is training with the same "
                            "certificate; this one ends")

    def _on_setup(self, req: m.TrainSetup, who):
        p = self.training
        _check_model_id(req.model_id)
        # a finished model may only be set up again to be resumed (its active party could not write
        # its own final file after TrainEnd): anything but TrainResume is then refused
        self._reopening = req.model_id if req.model_id in self.models else None
        reply = p.handle(req)
        self._digest = self._data_digest(p)     # the file is written at the first split (or TrainResume)
        log.info("%s: model %s: %s mode, %d rows aligned, %d features, max_bin %d (from %s)", self.name,
                 req.model_id, req.mode, p.n_aligned, len(p.feature_names), req.max_bin, who)
        return reply

    def _on_resume(self, req: m.TrainResume, who):
        p = self.training
        if p.model_id != req.model_id:
            raise ProtocolError(f"TrainResume for model {req.model_id!r} but the session set up {p.model_id!r}")
        path = self.model_path(req.model_id)
        d = self._read_model_file(path) if path.exists() else None
        if d is None:
            raise InputError(f"party {self.name!r} has no saved lookup table for model {req.model_id!r} in "
                             f"{self.model_dir}: cannot resume (was it started with another --model-dir?)")
        reopen = bool(d.get("completed"))
        if reopen and self._reopening != req.model_id:
            raise InputError(f"party {self.name!r}: model {req.model_id!r} is already complete")
        if d.get("salt") != p.salt.hex():
            raise InputError(f"party {self.name!r}: the resumed session's id salt differs from the one of "
                             f"model {req.model_id!r}")
        if d.get("data_digest") != self._digest:
            raise InputError(f"party {self.name!r}: its training data changed since model {req.model_id!r} "
                             "was started (different rows or values): cannot resume")
        if req.n_rounds < 0 or req.n_records < 0:
            raise ProtocolError("TrainResume with negative counts")
        kept = [r for r in check_model_dict(d, str(path)) if r["round"] < req.n_rounds]
        if len(kept) != req.n_records or [r["record_id"] for r in kept] != list(range(len(kept))):
            raise InputError(f"party {self.name!r} holds {len(kept)} records for the first {req.n_rounds} "
                             f"rounds of model {req.model_id!r} but the active party's checkpoint refers to "
                             f"{req.n_records}: the lookup table in {path} does not match the checkpoint")
        if reopen and len(kept) != len(d["records"]):
            raise InputError(f"party {self.name!r}: model {req.model_id!r} is complete with {len(d['records'])} "
                             f"records; the active party's checkpoint refers to {len(kept)}: cannot resume it")
        p.records = [record_from_json(r) for r in kept]
        if reopen:      # the active party completes the last step (it trains no further round)
            self._reopening = None
            self.models.pop(req.model_id, None)
            self._prediction_ready.pop(req.model_id, None)
            for sid in [k for k, v in self._sessions.items() if v.model_id == req.model_id]:
                self._sessions.pop(sid).drop_session(sid)
            self.unfinished.add(req.model_id)
            log.warning("%s: model %s reopened by %s to finish it again (its active party could not save its "
                        "own model file after the end of training)", self.name, req.model_id, who)
        self._persist()
        log.info("%s: model %s resumed by %s after %d rounds (%d records kept, %d dropped)", self.name,
                 req.model_id, who, req.n_rounds, len(kept), len(d["records"]) - len(kept))
        return m.Ack({"n_records": len(kept), **({"completed": True} if reopen else {})})

    def _on_continue(self, p: PassiveParty, req: m.TrainContinue, who):
        """A warm start (:mod:`parties.passive_warm`): the base is one of this party's completed
        models (its own file); the new model's file holds the base's records from now on."""
        with self._lock:
            base = self.models.get(req.base_model_id)
        if base is None:
            why = "is unfinished (resume its training instead)" if req.base_model_id in self.unfinished else \
                f"is not in {self.model_dir}"
            raise InputError(f"party {self.name!r}: model {req.base_model_id!r} {why}: nothing to continue")
        p.allow_warm_start(base.model_dict())
        reply = p.handle(req)
        self._persist()
        log.info("%s: model %s continues model %s for %s after %d rounds (%d records)", self.name, p.model_id,
                 req.base_model_id, who, req.n_rounds, req.n_records)
        return reply

    def _need_training(self, kind, client, who=None):
        tag = session_tag(who)
        if tag is not None and tag in self._taken_over:
            self._refuse_taken_over(client, tag)
        if self.training is None:
            raise ProtocolError(f"party {self.name!r} has no training session in progress for {kind} "
                                "(a session starts with alignment)")
        self._check_owner(kind, client, who)
        return self.training

    # -- prediction ---------------------------------------------------------
    def _model_lock(self, mid: str) -> threading.Lock:
        with self._lock:
            return self._model_locks.setdefault(mid, threading.Lock())

    def _on_predict_start(self, req, who, client):
        mid = req.model_id
        with self._lock:
            party = self.models.get(mid)
        if party is None:
            if mid in self.unfinished:
                raise InputError(f"party {self.name!r}: model {mid!r} is unfinished (its training was "
                                 "interrupted): resume the training before predicting")
            raise InputError(f"party {self.name!r} holds no model {mid!r} in {self.model_dir}")
        if self.access is not None:     # deny by default: the federation's list, else the model's trainer
            self.access.check_predict(client, party.trainer, mid)
        party, _ = self.prediction_party(mid)
        session = self._open_session(req.session_id, mid, party, client)
        try:
            reply = self._in_session(session, req)
        except BaseException:
            self._close_session(session)
            raise
        n = len(req.hashes) if hasattr(req, "hashes") else len(getattr(req, "blinded", ()))
        log.info("%s: prediction session %s for model %s from %s: %d rows (%s)", self.name, req.session_id, mid,
                 who, n, "PSI" if isinstance(req, m.PsiRequest) else "hashed ids")
        return reply

    def prediction_party(self, mid: str) -> tuple[PassiveParty, int]:
        """Model ``mid``'s party holding the prediction rows of the current table, and the table
        version they come from. After a reload (:meth:`reload_table`) a fresh party is made from the
        model and loaded with the new rows, then swapped in at once: sessions already open keep
        the party (and the rows) they started with; new ones see the new rows."""
        with self._model_lock(mid):
            with self._lock:
                party, version, frame, source = self.models.get(mid), self.table_version, self.frame, self.source
                ready = self._prediction_ready.get(mid)
            if party is None:
                raise InputError(f"party {self.name!r} holds no model {mid!r} in {self.model_dir}")
            if ready == version:
                return party, version
            if ready is not None:       # loaded from an older table: a fresh party for the new rows
                party = self._configure(PassiveParty.from_model_dict(party.model_dict()))
            party.load_prediction_data(frame, source)
            with self._lock:
                if mid in self.models:
                    self.models[mid] = party
                self._prediction_ready[mid] = version
            return party, version

    def reload_table(self, frame, source: str | None = None) -> int:
        """Use ``frame`` (the party's table read again) from now on: for new prediction sessions,
        online scoring and new training sessions; returns the new table version. The table is
        checked first (this party's columns, every finished model's features): a table that does
        not fit raises :class:`InputError` and the current one stays in use."""
        probe = PassiveParty(self.name, frame, self.id_col, source, categorical=self.categorical,
                             monotone=self.monotone, dp_bins=self.dp_bins)
        names = set(probe.feature_names)
        with self._lock:
            models = dict(self.models)
        for mid, party in models.items():
            lacking = [f for f in party.feature_names if f not in names]
            if lacking:
                raise InputError(f"party {self.name!r}: the new table {source or ''} lacks feature column(s) "
                                 f"{lacking} of model {mid!r}; the table in use is kept")
        with self._lock:
            self.frame, self.n_rows = frame, int(len(frame))
            self.source = source if source is not None else self.source
            self.table_version += 1
            version = self.table_version
        log.info("%s: table reloaded from %s: %d rows (version %d)", self.name, self.source, self.n_rows, version)
        return version

    def _open_session(self, sid: str, mid: str, party: PassiveParty, client: str) -> _PredictionSession:
        """Reserve a session slot (in use at once) or refuse with "busy, retry"; idle sessions
        beyond a limit are evicted, never one in use."""
        now = time.monotonic()
        with self._lock:
            if sid in self._sessions:
                raise ProtocolError(f"party {self.name!r}: prediction session {sid!r} is already open")
            mine = [x for x in self._sessions.values() if x.client == client]
            for limit, pool, what in ((self.MAX_SESSIONS_PER_CLIENT, mine, "of this client"),
                                      (self.MAX_PREDICTION_SESSIONS, list(self._sessions.values()), "in all")):
                if len(pool) < limit:
                    continue
                idle = [x for x in pool if x.idle_for(now) >= self.SESSION_IDLE_SECONDS]
                if not idle:
                    raise BusyError(f"party {self.name!r} is busy: {len(pool)} prediction sessions {what} are "
                                    "in use; retry", retry_after=self.BUSY_RETRY_AFTER)
                old = min(idle, key=lambda x: x.last_used)
                log.info("%s: prediction session %s (idle %.0f s) evicted", self.name, old.session_id,
                         old.idle_for(now))
                self._sessions.pop(old.session_id, None)
                old.party.drop_session(old.session_id)
            session = _PredictionSession(sid, mid, party, client, now, in_flight=1)
            self._sessions[sid] = session
            party.own_session(sid, client)     # its decisions are charged to this client
            return session

    def _in_session(self, session: _PredictionSession, request):
        """One request of a session, under the session's lock (``in_flight`` was counted)."""
        try:
            with session.lock:
                reply = session.party.handle(request)
        finally:
            with self._lock:
                session.in_flight -= 1
                session.last_used = time.monotonic()
                gone = isinstance(request, m.PredictEnd) or not session.party.has_session(session.session_id)
                if gone and self._sessions.get(session.session_id) is session and not session.in_flight:
                    del self._sessions[session.session_id]
        return reply

    def _close_session(self, session: _PredictionSession) -> None:
        with self._lock:
            if self._sessions.get(session.session_id) is session:
                del self._sessions[session.session_id]
        session.party.drop_session(session.session_id)

    def open_sessions(self, client: str | None = None) -> int:
        """Prediction sessions open (of ``client``, or in all)."""
        with self._lock:
            return sum(1 for x in self._sessions.values() if client is None or x.client == client)
