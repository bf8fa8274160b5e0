"""Network deployments: each party its own process (``vfl party passive|active``, ``vfl predict``).

* :func:`serve_passive` runs a passive party's server until stopped.
* :func:`train_active` connects to the passive parties, trains with a
  checkpoint after every round, and writes the finished model only at the end.
* :func:`predict_active` scores new rows of the active party with a saved model.

The protocol code is the same as in memory (:class:`parties.active.ActiveParty`
over a :class:`protocols.transport.Transport`); only the transport differs.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import signal
import threading
import time
from pathlib import Path

from datasets.errors import InputError, PeerError
from datasets.loaders import read_party_csv
from parties.active import ActiveParty
from parties.checkpoint import Checkpoint
from parties.server import PassiveServer
from protocols.grpc_transport import DEFAULT_MAX_FRAME_BYTES, DEFAULT_TIMEOUT, GrpcTransport, PartyServer, check_address
from vfl.files import write_json_atomic, write_text_atomic
from vfl.leafmask import PREDICTIONS
from vfl.model import BoostedModel
from vfl.params import ALIGNMENTS, Mode, TrainParams

log = logging.getLogger("vfl.active")

CHECKPOINT_FILE = "checkpoint.json"


def _read_csv(path, name, id_col, label_col=None, allow_text_label=False, categorical=None):
    return read_party_csv(path, name, id_col, label_col, allow_text_label=allow_text_label,
                          categorical=categorical)


# --------------------------------------------------------------------------- passive
def serve_passive(name: str, listen: str, data, id_col: str, model_dir, security,
                  max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, on_ready=None, stop_event=None,
                  policy: dict | None = None, validation_data=None, categorical=None,
                  monotone: dict | None = None) -> None:
    """Serve until SIGINT/SIGTERM (or ``stop_event``). ``on_ready(port)`` is called once listening;
    ``policy``: :class:`PassiveServer` policy attributes (``allowed_align``, ...);
    ``validation_data``: CSV of this party's features of the validation rows (if the active party
    trains with a validation set); ``categorical``/``monotone``: this party's categorical columns
    and monotone constraints ``{column: +1 | -1}``."""
    check_address(listen, "--listen address")
    pf = _read_csv(data, name, id_col, categorical=categorical)
    vf = _read_csv(validation_data, name, id_col, categorical=categorical) if validation_data is not None else None
    service = PassiveServer(name, pf.frame, id_col, model_dir, source=str(data), policy=policy,
                            validation_frame=vf.frame if vf is not None else None,
                            validation_source=str(validation_data) if vf is not None else None,
                            categorical=categorical, monotone=monotone)
    server = PartyServer(name, service.handle_frame, listen, security, max_frame_bytes=max_frame_bytes)
    port = server.start()
    stop = stop_event or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    if on_ready is not None:
        on_ready(port)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        log.info("%s: shutting down (%d calls served, %d refused)", name, server.stats["calls"],
                 server.stats["refused"])
        server.stop(grace=2.0)


# --------------------------------------------------------------------------- active: training
def _with_align(params: TrainParams, align: str) -> TrainParams:
    if align not in ALIGNMENTS:
        raise InputError(f"--align must be one of {ALIGNMENTS}, got {align!r}")
    return dataclasses.replace(params, align=align)


def _find_active_model(model_dir: Path) -> Path | None:
    found = []
    for f in sorted(model_dir.glob("*.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(d, dict) and d.get("role") == "active":
            found.append(f)
    if len(found) > 1:
        raise InputError(f"{model_dir} holds several active-party models ({', '.join(f.name for f in found)}); "
                         "keep one model per --model-dir")
    return found[0] if found else None


def train_active(data, id_col: str, label_col: str, name: str, peers: dict[str, str], params: TrainParams,
                 model_dir, security, timeout: float = DEFAULT_TIMEOUT, resume: bool = False,
                 force: bool = False, align: str = "hash", max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 connect_timeout: float | None = None, on_round=None, validation_data=None,
                 categorical=None, weight_col: str | None = None) -> dict:
    """Train against passive servers; return a JSON-ready summary (see the README).
    ``validation_data``: CSV of validation rows (id, label, features; the passive parties serve
    theirs with ``--validation-data``): metric history and early stopping.
    ``categorical``: this party's categorical columns; ``weight_col``: its sample-weight column
    (monotone constraints on its own features: ``params.monotone_constraints``)."""
    if not peers:
        raise InputError("give at least one --peer NAME=HOST:PORT")
    if name in peers:
        raise InputError(f"the active party and a passive party are both named {name!r}")
    params = _with_align(params, align)
    files = _ModelFiles(Path(model_dir), name, resumable=params.mode != Mode.DP)
    ck = files.prepare(resume, force)
    pf = _read_csv(data, name, id_col, label_col, allow_text_label=True, categorical=categorical)
    active = ActiveParty(name, pf.frame, id_col, label_col, source=str(data), categorical=categorical,
                         weight_col=weight_col)
    vf = _read_csv(validation_data, name, id_col, label_col, allow_text_label=True, categorical=categorical) \
        if validation_data is not None else None
    transport = GrpcTransport(name, peers, security, timeout=timeout, max_frame_bytes=max_frame_bytes)
    done_before = ck.n_rounds if ck is not None else 0
    counter = _RoundCounter(done_before, on_round)
    try:
        transport.connect(timeout=connect_timeout if connect_timeout is not None else timeout)
        t0 = time.perf_counter()
        try:
            model = active.fit(transport, list(peers), params, counter,
                               checkpoint=(lambda c: c.save(files.checkpoint)) if files.resumable else None,
                               resume=ck, validation=vf.frame if vf is not None else None)
        except PeerError as exc:
            raise PeerError(f"training stopped after {counter.rounds} of {params.n_estimators} round(s): {exc}; "
                            f"{files.resume_hint(counter.rounds)}") from None
        train_seconds = time.perf_counter() - t0
    finally:
        transport.close()
    model.history.setdefault("network", {}).update(
        {"resumed_after_rounds": done_before} if ck is not None else {})
    files.finish(model, force)
    log.info("%s: model %s finished: %d round(s); saved to %s", name, model.model_id, model.n_rounds, files.final)
    return {
        "mode": params.mode, "objective": params.objective, "active_party": name,
        "passive_parties": list(peers), "peers": dict(peers),
        "n_train": int(active.alignment_report.get(name, {}).get("n_kept", 0)),
        "train_seconds": train_seconds, "resumed_after_rounds": done_before if ck is not None else None,
        "n_trees": sum(len(r) for r in model.rounds), "model_id": model.model_id, "model_path": str(files.final),
        "alignment": active.alignment_report, "bytes_sent": transport.bytes_report(),
        "total_bytes": transport.total_bytes(),
        "messages_sent": {f"{a}->{b}": n for (a, b), n in sorted(transport.messages_sent.items())},
        "params": params.to_dict(), "timings": active.timings,
        "crypto_seconds": active.crypto_seconds(),
        "security": security.describe(),
        "n_rounds": model.n_rounds, "best_iteration": model.best_iteration, "classes": model.classes,
        "eval_metric": model.params.get("eval_metric"), "history": model.history,
        "n_validation": int(len(vf.frame)) if vf is not None else 0,
    }


class _RoundCounter:
    """``on_round`` of a network training: counts finished rounds (for the error message of an
    interrupted training), then calls the caller's ``on_round``."""

    def __init__(self, done_before: int, on_round=None):
        self.rounds, self.on_round = done_before, on_round

    def __call__(self, r, info):
        self.rounds = r + 1
        return self.on_round(r, info) if self.on_round is not None else None


class _ModelFiles:
    """The active party's files in ``--model-dir``: the checkpoint while training, the model after."""

    def __init__(self, model_dir: Path, name: str, resumable: bool):
        self.dir, self.name, self.resumable = model_dir, name, resumable
        self.checkpoint, self.final = model_dir / CHECKPOINT_FILE, model_dir / f"{name}.json"
        self.existing: Path | None = None

    def prepare(self, resume: bool, force: bool) -> Checkpoint | None:
        """Check the directory for a new or resumed training; the checkpoint to resume, if any."""
        if self.dir.exists() and not self.dir.is_dir():
            raise InputError(f"--model-dir {self.dir} is not a directory")
        self.existing = _find_active_model(self.dir) if self.dir.is_dir() else None
        if resume and not self.resumable:
            raise InputError("--resume is not available in dp mode: each passive party's noisy release happens "
                             "once per training, and a resumed run would release again (spending more privacy "
                             "budget); start the training again")
        if resume:
            if not self.checkpoint.exists():
                if self.existing is not None:
                    raise InputError(f"the training in {self.dir} already completed ({self.existing.name}); "
                                     "nothing to resume")
                raise InputError(f"no checkpoint to resume in {self.dir} ({CHECKPOINT_FILE} is missing)")
            ck = Checkpoint.load(self.checkpoint)
            log.info("%s: resuming model %s after %d round(s) from %s", self.name, ck.model_id, ck.n_rounds,
                     self.checkpoint)
            return ck
        if self.checkpoint.exists():
            raise InputError(f"{self.dir} holds an unfinished training ({CHECKPOINT_FILE}): continue it with "
                             f"--resume, or delete {self.checkpoint} to start over")
        if self.existing is not None and not force:
            raise InputError(f"{self.dir} already holds a finished model ({self.existing.name}); use another "
                             "--model-dir or --force to replace it")
        self.dir.mkdir(parents=True, exist_ok=True)
        return None

    def resume_hint(self, n_rounds: int) -> str:
        """What to do after a training stopped by a peer's failure."""
        if not self.resumable:
            return "dp mode cannot be resumed: start again"
        if self.checkpoint.exists() and n_rounds > 0:
            return (f"the checkpoint {self.checkpoint} keeps the first {n_rounds} round(s) (completed: false): "
                    "restart the failed party and run the same command with --resume")
        return "no round was finished, so there is nothing to resume: start again"

    def finish(self, model: BoostedModel, force: bool) -> None:
        """Write the final model (replacing another with --force) and drop the checkpoint."""
        if force and self.existing is not None and self.existing != self.final:
            self.existing.unlink()
        write_json_atomic(self.final, model.to_dict())
        if self.checkpoint.exists():
            self.checkpoint.unlink()


# --------------------------------------------------------------------------- active: prediction
def check_prediction(prediction: str) -> None:
    if prediction not in PREDICTIONS:
        raise InputError(f"--prediction must be one of {PREDICTIONS}, got {prediction!r}")


def _predict_proba(active: ActiveParty, transport, frame, source, prediction: str, align: str | None):
    if align is not None and align not in ALIGNMENTS:
        raise InputError(f"--align must be one of {ALIGNMENTS}, got {align!r}")
    return active.predict_proba(transport, frame, source, prediction=prediction, align=align)


def load_active_model(model_dir) -> BoostedModel:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise InputError(f"model directory {model_dir} does not exist")
    path = _find_active_model(model_dir)
    if path is None:
        if (model_dir / CHECKPOINT_FILE).exists():
            raise InputError(f"{model_dir} holds only an unfinished training ({CHECKPOINT_FILE}): finish it with "
                             "`vfl party active ... --resume` before predicting")
        raise InputError(f"no active-party model in {model_dir}")
    return BoostedModel.load(path)


def predict_active(model_dir, data, id_col: str, peers: dict[str, str], security, out=None,
                   timeout: float = DEFAULT_TIMEOUT, prediction: str = "one-round",
                   max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, connect_timeout: float | None = None,
                   align: str | None = None):
    """Score the rows of ``data`` (the active party's columns); returns ``(ids, proba, summary)``.

    ``prediction``: "one-round" (leaf masks) or "node" (node-by-node routing); ``align``: how the
    passive parties find the rows ("hash" or "psi"; default: as in training)."""
    check_prediction(prediction)
    model = load_active_model(model_dir)
    missing = [p for p in model.passive_parties if p not in peers]
    if missing:
        raise InputError("the model needs passive part" + ("y " if len(missing) == 1 else "ies ")
                         + ", ".join(repr(p) for p in missing) + ": give --peer "
                         + " --peer ".join(f"{p}=HOST:PORT" for p in missing))
    extra = [p for p in peers if p not in model.passive_parties]
    if extra:
        raise InputError(f"the model was not trained with part{'y' if len(extra) == 1 else 'ies'} {extra}; "
                         f"its passive parties are {model.passive_parties}")
    pf = _read_csv(data, model.active_party, id_col, categorical=list(model.categories))
    active = ActiveParty.from_model(model, id_col)
    used = {p: peers[p] for p in model.passive_parties}
    transport = GrpcTransport(model.active_party, used, security, timeout=timeout, max_frame_bytes=max_frame_bytes)
    try:
        transport.connect(timeout=connect_timeout if connect_timeout is not None else timeout)
        t0 = time.perf_counter()
        ids, proba = _predict_proba(active, transport, pf.frame, str(data), prediction, align)
        seconds = time.perf_counter() - t0
    finally:
        transport.close()
    if out is not None:
        write_text_atomic(out, model.prediction_table(ids, proba, id_col).to_csv(index=False))
    summary = {"model_id": model.model_id, "n_rows": int(len(ids)), "predict_seconds": seconds,
               "prediction": prediction, "align": align or model.params.get("align", "hash"),
               "bytes_sent": transport.bytes_report(), "total_bytes": transport.total_bytes()}
    log.info("%s: predicted %d rows with model %s in %.2f s", model.active_party, len(ids), model.model_id, seconds)
    return ids, proba, summary


__all__ = ["serve_passive", "train_active", "predict_active", "load_active_model"]
