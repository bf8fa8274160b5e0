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
"""
from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from pathlib import Path

import pandas as pd

from datasets.errors import InputError, ProtocolError, VFLError
from parties.checkpoint import data_digest
from parties.passive import PASSIVE_FORMAT, PassiveParty, record_from_json
from protocols import messages as m
from protocols.transport import frame_handler
from vfl.files import write_json_atomic

log = logging.getLogger("vfl.passive")

_MODEL_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _check_model_id(model_id: str) -> str:
    if not isinstance(model_id, str) or not _MODEL_ID_RE.match(model_id):
        raise ProtocolError(f"model id {model_id!r} is not acceptable (letters, digits, '_' and '-' only)")
    return model_id


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
    #: prediction sessions kept at once (older ones are forgotten)
    MAX_PREDICTION_SESSIONS = 16

    #: policy attributes copied onto every :class:`PassiveParty` the server creates or loads
    POLICY = ("allowed_align", "allowed_prediction", "dp_max_epsilon_per_feature")

    def __init__(self, name: str, frame: pd.DataFrame, id_col: str = "id", model_dir=".",
                 source: str | None = None, policy: dict | None = None,
                 validation_frame: pd.DataFrame | None = None, validation_source: str | None = None,
                 categorical=None, monotone: dict | None = None):
        """``categorical``/``monotone``: this party's categorical columns and monotone constraints
        (see :class:`PassiveParty`), used by every training it serves."""
        self.name, self.frame, self.id_col, self.source = str(name), frame, id_col, source
        self.categorical, self.monotone = categorical, monotone
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
        self.model_dir.mkdir(parents=True, exist_ok=True)
        self.models: dict[str, PassiveParty] = {}
        self.unfinished: set[str] = set()
        self.training: PassiveParty | None = None
        self.training_peer: str | None = None
        self._digest: str | None = None
        self._sessions: OrderedDict[str, PassiveParty] = OrderedDict()
        self._prediction_ready: set[str] = set()
        self._lock = threading.Lock()
        self._load_models()

    def _new_party(self) -> PassiveParty:
        return PassiveParty(self.name, self.frame, self.id_col, self.source, categorical=self.categorical,
                            monotone=self.monotone)

    def _configure(self, party: PassiveParty) -> PassiveParty:
        for k, v in self.policy.items():
            setattr(party, k, v)
        party.id_col = self.id_col
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
                self.models[mid] = self._configure(PassiveParty.from_model_dict(d))
            except (InputError, KeyError, TypeError, ValueError) as exc:
                log.warning("%s: ignoring model file %s: %s", self.name, path, exc)
                continue
        log.info("%s: %d model(s) ready for prediction in %s%s", self.name, len(self.models), self.model_dir,
                 (": " + ", ".join(sorted(self.models))) if self.models else "")

    def _persist(self) -> None:
        p = self.training
        d = p.model_dict()
        d["data_digest"] = self._digest
        write_json_atomic(self.model_path(p.model_id), d)

    @staticmethod
    def _data_digest(p: PassiveParty) -> str:
        """Fingerprint of the training rows (in aligned order) and feature names: a resumed training
        must see exactly the same data. (No ids and no labels: the same value as the lookup tables
        written before hold, so their trainings still resume.)"""
        return data_digest((), p.aligned_features(), (), p.feature_names)

    # -- entry points -------------------------------------------------------
    def handle_frame(self, frame: bytes, who: str = "?") -> bytes:
        """Bytes in, bytes out (errors become an ErrorReply)."""
        return frame_handler(lambda req: self.handle(req, who))(frame)

    def handle(self, request, who: str = "?"):
        kind = type(request).__name__
        with self._lock:
            try:
                return self._dispatch(kind, request, who)
            except VFLError as exc:
                log.warning("%s: refused %s from %s: %s", self.name, kind, who, exc)
                raise

    def _dispatch(self, kind: str, request, who: str):
        purpose = request.purpose if isinstance(request, m.PsiRequest) else None
        if isinstance(request, self.SESSION_START) or purpose == m.PsiPurpose.TRAIN:
            return self._start_session(request, who)
        if isinstance(request, m.TrainSetup):
            return self._on_setup(request, who)
        if isinstance(request, m.TrainResume):
            return self._on_resume(request, who)
        if isinstance(request, self.PREDICTION_START) or purpose == m.PsiPurpose.PREDICT:
            return self._on_predict_start(request, who)
        sid = getattr(request, "session_id", None)
        if isinstance(sid, str) and sid in self._sessions:     # any prediction-session message
            return self._sessions[sid].handle(request)
        if isinstance(request, (m.RouteRequest, m.LeafMaskRequest)):
            if self.training is not None and sid is not None and sid == self.training.eval_session:
                return self.training.handle(request)      # the validation rows of the training under way
            raise ProtocolError(f"unknown or expired prediction session {request.session_id!r}")
        if not PassiveParty.accepts(type(request)):
            raise ProtocolError(f"party {self.name!r} does not accept {kind}")
        p = self._need_training(kind)
        reply = p.handle(request)
        if isinstance(request, m.Gradients):
            log.info("%s: round %d: %d %s gradient values from %s", self.name, request.round_idx,
                     len(request.values), "encrypted" if request.encrypted else "PLAINTEXT", who)
        elif isinstance(request, (m.SplitRequest, m.DPSplitRegister)):
            if isinstance(request, m.SplitRequest):    # kept for --resume (dp mode cannot resume: TrainEnd writes it)
                self._persist()
            log.debug("%s: %d split(s) for %s; %d records", self.name, len(request.node_ids if isinstance(
                      request, m.SplitRequest) else request.feature_idx), who, len(p.records))
        elif isinstance(request, m.DPReleaseRequest):
            log.info("%s: model %s: noisy (DP) bucket release to %s, epsilon %s per feature", self.name,
                     request.model_id, who, request.epsilon_per_feature)
        elif isinstance(request, m.TrainEnd):
            self._persist()
            mid = p.model_id
            if p.completed:
                self.models[mid] = self._configure(PassiveParty.from_model_dict(p.model_dict()))
                self.unfinished.discard(mid)
                log.info("%s: model %s completed by %s (%d records) and saved to %s", self.name, mid, who,
                         len(p.records), self.model_path(mid))
            else:
                self.unfinished.add(mid)
                log.warning("%s: training of model %s stopped by %s before the end; %d records kept in %s "
                            "for a resume", self.name, mid, who, len(p.records), self.model_path(mid))
            self.training, self.training_peer, self._digest = None, None, None
        return reply

    # -- training -----------------------------------------------------------
    def _start_session(self, request, who):
        if self.training is not None:
            log.warning("%s: %s starts a new training session; the unfinished session of model %s (from %s) "
                        "is abandoned", self.name, who, self.training.model_id, self.training_peer)
        self.training = self._configure(self._new_party())
        if self.validation_frame is not None:
            self.training.load_validation_data(self.validation_frame, self.validation_source)
        self.training_peer, self._digest = who, None
        reply = self.training.handle(request)
        log.info("%s: training session %s opened by %s (%s alignment, %d rows)", self.name,
                 request.session_id, who, "PSI" if isinstance(request, m.PsiRequest) else "hash", self.n_rows)
        return reply

    def _on_setup(self, req: m.TrainSetup, who):
        p = self._need_training("TrainSetup")
        _check_model_id(req.model_id)
        if req.model_id in self.models:
            raise ProtocolError(f"party {self.name!r} already holds a finished model {req.model_id!r}")
        reply = p.handle(req)
        self._digest = self._data_digest(p)     # the file is written at the first split (or TrainResume)
        log.info("%s: model %s: %s mode, %d rows aligned, %d features, max_bin %d (from %s)", self.name,
                 req.model_id, req.mode, p.n_aligned, len(p.feature_names), req.max_bin, who)
        return reply

    def _on_resume(self, req: m.TrainResume, who):
        p = self._need_training("TrainResume")
        if p.model_id != req.model_id:
            raise ProtocolError(f"TrainResume for model {req.model_id!r} but the session set up {p.model_id!r}")
        path = self.model_path(req.model_id)
        d = self._read_model_file(path) if path.exists() else None
        if d is None:
            raise InputError(f"party {self.name!r} has no saved lookup table for model {req.model_id!r} in "
                             f"{self.model_dir}: cannot resume (was it started with another --model-dir?)")
        if d.get("completed"):
            raise InputError(f"party {self.name!r}: model {req.model_id!r} is already complete")
        if d.get("salt") != p.salt.hex():
            raise InputError(f"party {self.name!r}: the resumed session's id salt differs from the one of "
                             f"model {req.model_id!r}")
        if d.get("data_digest") != self._digest:
            raise InputError(f"party {self.name!r}: its training data changed since model {req.model_id!r} "
                             "was started (different rows or values): cannot resume")
        if req.n_rounds < 0 or req.n_records < 0:
            raise ProtocolError("TrainResume with negative counts")
        kept = [r for r in d["records"] if int(r["round"]) < req.n_rounds]
        if len(kept) != req.n_records or [r["record_id"] for r in kept] != list(range(len(kept))):
            raise InputError(f"party {self.name!r} holds {len(kept)} records for the first {req.n_rounds} "
                             f"rounds of model {req.model_id!r} but the active party's checkpoint refers to "
                             f"{req.n_records}: the lookup table in {path} does not match the checkpoint")
        p.records = [record_from_json(r) for r in kept]
        self._persist()
        log.info("%s: model %s resumed by %s after %d rounds (%d records kept, %d dropped)", self.name,
                 req.model_id, who, req.n_rounds, len(kept), len(d["records"]) - len(kept))
        return m.Ack({"n_records": len(kept)})

    def _need_training(self, kind):
        if self.training is None:
            raise ProtocolError(f"party {self.name!r} has no training session in progress for {kind} "
                                "(a session starts with alignment)")
        return self.training

    # -- prediction ---------------------------------------------------------
    def _on_predict_start(self, req: m.PredictStart, who):
        mid = req.model_id
        party = self.models.get(mid)
        if party is None:
            if mid in self.unfinished:
                raise InputError(f"party {self.name!r}: model {mid!r} is unfinished (its training was "
                                 "interrupted): resume the training before predicting")
            raise InputError(f"party {self.name!r} holds no model {mid!r} in {self.model_dir}")
        if mid not in self._prediction_ready:
            party.load_prediction_data(self.frame, self.source)
            self._prediction_ready.add(mid)
        reply = party.handle(req)
        self._sessions[req.session_id] = party
        while len(self._sessions) > self.MAX_PREDICTION_SESSIONS:
            old, old_party = self._sessions.popitem(last=False)
            old_party.drop_session(old)
        n = len(req.hashes) if hasattr(req, "hashes") else len(getattr(req, "blinded", ()))
        log.info("%s: prediction session %s for model %s from %s: %d rows (%s)", self.name, req.session_id, mid,
                 who, n, "PSI" if isinstance(req, m.PsiRequest) else "hashed ids")
        return reply
