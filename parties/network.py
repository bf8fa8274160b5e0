"""Network deployments: each party its own process (``vfl party passive|active``, ``vfl predict``).

* :func:`serve_passive` runs a passive party's server until stopped.
* :func:`train_active` connects to the passive parties, trains with a
  checkpoint after every round, and writes the finished model only at the end.
* :func:`predict_active` scores new rows of the active party with a saved model.

The protocol code is the same as in memory (:class:`parties.active.ActiveParty`
over a :class:`protocols.transport.Transport`); only the transport differs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np

from datasets.errors import InputError, PeerError, WriteError
from datasets.loaders import DEFAULT_BATCH_ROWS, iter_party_batches, read_party_table, read_party_table_deferred
from datasets.pieces import open_piece_table
from parties.active import ActiveParty
from parties.checkpoint import Checkpoint
from parties.drift import DriftRun, with_last
from parties.evaluation import BatchEvaluation
from parties.federation import Access, cert_names_of, stricter_drift
from parties.passive_explain import EXPLAIN_DIR
from parties.passive_online import AuditLog, OnlineScoring, ServeLimits
from parties.reveal_budget import default_paths
from parties.serve_metrics import PassiveMetrics, settle_heap, start_metrics_server
from parties.server import TAKEN_OVER, PassiveServer
from parties.table_reload import TableWatcher
from protocols.grpc_client import GrpcTransport
from protocols.grpc_security import check_address
from protocols.grpc_server import PartyServer
from protocols.grpc_wire import DEFAULT_MAX_FRAME_BYTES, DEFAULT_TIMEOUT
from protocols.transport import BusyError, frame_handler
from protocols.units import check_seconds
from vfl.core.files import atomic_text_writer, check_writable_dir, fsync_dir, write_json_atomic
from vfl.core.leafmask import PREDICTIONS
from vfl.core.model import BoostedModel, read_model_json
from vfl.core.objectives import get_objective
from vfl.core.params import ALIGNMENTS, Mode, TrainParams

log = logging.getLogger("vfl.active")

CHECKPOINT_FILE = "checkpoint.json"


def _read_csv(path, name, id_col, label_col=None, allow_text_label=False, categorical=None, weight_col=None):
    """A party's table: CSV, a Parquet file or a directory of Parquet files."""
    return read_party_table(path, name, id_col, label_col, allow_text_label=allow_text_label,
                            categorical=categorical, weight_col=weight_col)


# --------------------------------------------------------------------------- passive
def passive_access(name: str, security, federation=None) -> Access:
    """Who passive party ``name`` serves (deny by default, issue 22): under TLS, a federation file
    or ``--allow-client`` is required."""
    if federation is not None:
        entry = federation.party(name)
        if entry.name == federation.active:
            raise InputError(f"{federation.path}: {name!r} is the federation's active party, not a passive one")
        if entry.address is None:
            raise InputError(f"{federation.path}: party {name!r} has no address: it only predicts and serves nothing")
    elif security.tls and not security.allowed_clients:
        raise InputError(f"party {name!r} would serve any certificate of its CA: give --federation FILE (who may "
                         "train and predict, see docs/federation.md) or --allow-client NAME (deny by default)")
    return Access(name, bool(security.tls), federation, tuple(security.allowed_clients))


def _load_table(data, name: str, id_col: str, categorical=None):
    """A passive party's table: a Parquet table of numeric features as ids and a piece plan (rows
    read where they are used), else the whole table in memory."""
    table = open_piece_table(data, name, id_col, categorical)
    return table if table is not None else _read_csv(data, name, id_col, categorical=categorical).frame


class _Gate:
    """The server's handler while the table loads: every request is answered "busy, retry"
    (the health service says NOT_SERVING), then the party's own handler."""

    def __init__(self, name: str):
        self.name, self.target = name, None

    def __call__(self, frame: bytes, who):
        target = self.target
        if target is None:
            return frame_handler(self._loading)(frame)
        return target(frame, who)

    def _loading(self, request):
        raise BusyError(f"party {self.name!r} is loading its table; retry", retry_after=0.5)


def _after_reload(service, own_process: bool) -> None:
    service.online.warm()
    if own_process:
        settle_heap()


def transport_admission(access: Access):
    """The membership check a passive party's transport makes of every call before it is served
    (None: no federation, or no TLS): the caller's certificate must identify a federation party that
    may train or predict here (or the active party, which predicts with models from before trainers
    were recorded). Sessions still apply their own rules (who trained which model)."""
    fed = access.federation
    if fed is None or not access.tls:
        return None
    members = {fed.active, *fed.trainers(access.party), *(fed.predictors(access.party) or ())}

    def admit(client: str) -> str | None:
        who = fed.party_of(cert_names_of(client) or ())
        if who is None:
            return (f"rule 'federation identity': certificate names {sorted(cert_names_of(client) or [])} are "
                    f"not one federation party's own names ({fed.path})")
        if who not in members:
            return f"rule 'federation members': {who!r} may neither train nor predict here ({fed.path})"
        return None
    return admit


def serve_passive(name: str, listen: str, data, id_col: str, model_dir, security,
                  max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, on_ready=None, stop_event=None,
                  policy: dict | None = None, validation_data=None, executor=None, categorical=None,
                  monotone: dict | None = None, dp_bins: dict | None = None, federation=None,
                  audit_log=None, metrics_listen: str | None = None, reload_interval: float = 1.0,
                  table_loader=_load_table) -> None:
    """Serve until SIGINT/SIGTERM (or ``stop_event``). ``on_ready(port)`` is called once listening;
    ``policy``: :class:`PassiveServer` policy attributes (``allowed_align``, ...);
    ``validation_data``: CSV of this party's features of the validation rows (if the active party
    trains with a validation set); ``executor``: the party's compute for the ciphertext kernels and
    its row shards (e.g. a Dask cluster, :func:`crypto.executor.dask_executor`);
    ``categorical``/``monotone``: this party's categorical columns and monotone constraints
    ``{column: +1 | -1}``; ``dp_bins``: its public bounds/edges for a DP released model
    (:func:`vfl.core.dp_bins_file.check_dp_bins`); ``federation``: the federation file
    (:class:`parties.federation.Federation`): who may train and predict (deny by default under TLS;
    without one, TLS needs ``security.allowed_clients``).

    Online scoring (``vfl serve``): ``audit_log`` is the append-only audit file of every scoring
    request, ``metrics_listen`` HOST:PORT serves Prometheus metrics at ``/metrics``; the limits
    come from the federation file. The table file is watched (every ``reload_interval`` s; 0: only
    on SIGHUP) and reloaded when it changes (:mod:`parties.table_reload`). The server listens
    before the table is loaded: its gRPC health service says NOT_SERVING (and requests are
    answered "busy, retry") until it is, then SERVING."""
    check_address(listen, "--listen address")
    if reload_interval != 0:
        check_seconds(reload_interval, "--reload-interval")
    access = passive_access(name, security, federation)
    policy = dict(policy or {})
    if federation is not None:
        policy.setdefault("min_node_rows", federation.min_node_rows)
        # the stricter of the party's own option and its federation entry
        own = policy.get("drift_policy", federation.party(name).drift)
        policy["drift_policy"] = stricter_drift(own, federation.party(name).drift)
        if federation.party(name).screen_epsilon is not None:      # the DP noise on its screening counts
            policy.setdefault("screen_epsilon", federation.party(name).screen_epsilon)
        entry = federation.parties.get(name)
        if entry is not None and entry.require_active_only_rounds:
            policy.setdefault("require_active_only_rounds", entry.require_active_only_rounds)
        if entry is not None and entry.categorical_ordered:
            policy.setdefault("categorical_ordered", True)
        if federation.dp_model_min_node_rows is not None:
            policy.setdefault("dp_model_min_node_rows", federation.dp_model_min_node_rows)
        if federation.party(name).explain_features:     # opt-in: its own features' explanations
            policy.setdefault("explain_features", True)
            policy.setdefault("explain_dir", str(Path(model_dir) / EXPLAIN_DIR))
    # its own limits and lifetime ledgers, on by default (issue 31): MODEL_DIR/ledgers/ unless given
    reveal_path, dp_path = default_paths(model_dir)
    policy.setdefault("limits", access.limits)
    policy.setdefault("reveal_budget_path", str(reveal_path))
    policy.setdefault("dp_ledger_path", str(dp_path))
    metrics = PassiveMetrics()
    gate = _Gate(name)
    if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)      # while the table loads: nothing to reload yet
    server = PartyServer(name, gate, listen, security, max_frame_bytes=max_frame_bytes,
                         admit=transport_admission(access))
    port = server.start()         # NOT_SERVING until the table is loaded
    stop = stop_event or threading.Event()
    watcher = audit = service = None
    try:
        audit = AuditLog(audit_log) if audit_log is not None else None
        table = table_loader(data, name, id_col, categorical)
        vf = _read_csv(validation_data, name, id_col, categorical=categorical) if validation_data is not None \
            else None
        service = PassiveServer(name, table, id_col, model_dir, source=str(data), policy=policy,
                                validation_frame=vf.frame if vf is not None else None,
                                validation_source=str(validation_data) if vf is not None else None,
                                executor=executor, categorical=categorical, monotone=monotone, dp_bins=dp_bins,
                                access=access)
        table = None
        service.online = OnlineScoring(service, ServeLimits.from_federation(federation, name), audit, metrics)
        service.online.warm()
        own_process = threading.current_thread() is threading.main_thread()
        if own_process:
            settle_heap()       # the table and its indexes live as long as the process (see settle_heap)
        gate.target = service.handle_frame
        server.in_session = service.holds_session      # calls of callers without a session: capped
        server.set_serving(True)
        if metrics_listen is not None:
            mport = start_metrics_server(metrics_listen, metrics)
            log.info("%s: metrics at http://%s:%d/metrics", name, metrics_listen.rpartition(":")[0], mport)
        watcher = TableWatcher(service, data, lambda: table_loader(data, name, id_col, categorical),
                               interval=reload_interval, after=lambda _v: _after_reload(service, own_process),
                               metrics=metrics)
        watcher.start()
        if own_process:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
            if hasattr(signal, "SIGHUP"):
                signal.signal(signal.SIGHUP, lambda *_: watcher.request())
        if on_ready is not None:
            on_ready(port)
        while not stop.wait(0.5):
            pass
    finally:
        server.set_serving(False)
        if watcher is not None:
            watcher.stop()
        refused = service.refused_requests if service is not None else 0   # answered with a refusal: counted once
        log.info("%s: shutting down (%d calls served, %d refused)", name, server.stats["calls"] - refused,
                 server.stats["refused"] + refused)
        server.stop(grace=2.0)
        if audit is not None:
            audit.close()


# --------------------------------------------------------------------------- active: training
def _with_align(params: TrainParams, align: str) -> TrainParams:
    if align not in ALIGNMENTS:
        raise InputError(f"--align must be one of {ALIGNMENTS}, got {align!r}")
    return dataclasses.replace(params, align=align)


def _scan_model_dir(model_dir: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The active-party model files of ``model_dir`` and its unreadable ``*.json`` files (with the
    reason): an empty or damaged model file must be named, not reported as "no model"."""
    found, unreadable = [], []
    for f in sorted(model_dir.glob("*.json")):
        if f.name == CHECKPOINT_FILE:
            continue
        try:
            d = read_model_json(f)
        except InputError as exc:
            unreadable.append((f, str(exc)))
            continue
        if d.get("role") == "active":
            found.append(f)
    return found, unreadable


def _find_active_model(model_dir: Path) -> Path | None:
    found, _ = _scan_model_dir(model_dir)
    if len(found) > 1:
        raise InputError(f"{model_dir} holds several active-party models ({', '.join(f.name for f in found)}); "
                         "keep one model per --model-dir")
    return found[0] if found else None


def train_active(data, id_col: str, label_col: str, name: str, peers: dict[str, str], params: TrainParams,
                 model_dir, security, timeout: float = DEFAULT_TIMEOUT, resume: bool = False,
                 force: bool = False, align: str = "hash", max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 connect_timeout: float | None = None, on_round=None, validation_data=None,
                 link_mbps: float | None = None, executor=None, categorical=None,
                 weight_col: str | None = None, warm_start=None) -> dict:
    """Train against passive servers; return a JSON-ready summary (see docs/deployment.md).
    ``validation_data``: CSV of validation rows (id, label, features; the passive parties serve
    theirs with ``--validation-data``): metric history and early stopping. ``link_mbps``: the
    links' throughput for the pre-shift cost model (None: measured on the gradient messages).
    ``categorical``: this party's categorical columns; ``weight_col``: its sample-weight column
    (monotone constraints on its own features: ``params.monotone_constraints``).
    ``warm_start``: the model directory of a completed model of these parties to continue with more
    rounds (:mod:`parties.warm_start`): a new model, written to ``model_dir``."""
    if not peers:
        raise InputError("give at least one --peer NAME=HOST:PORT")
    if name in peers:
        raise InputError(f"the active party and a passive party are both named {name!r}")
    params = _with_align(params, align)
    dp_model = params.dp_model is not None and math.isfinite(params.dp_model)     # cannot resume either
    files = _ModelFiles(Path(model_dir), name, resumable=params.mode != Mode.DP and not dp_model,
                        dp_model=dp_model)
    if warm_start is not None and resume:
        raise InputError("--warm-start starts a new training from a saved model; --resume continues an interrupted "
                         "one: give one of them")
    base = load_active_model(warm_start) if warm_start is not None else None    # read before the directory is
    ck = files.prepare(resume, force)                                           # prepared (it may be the same)
    if ck is not None:
        check_writable_dir(files.dir, "--model-dir")      # resuming into a directory that became read-only
    # a Parquet table's numeric features are read after the alignment; the frame is handed over
    # (emptied column by column as the party reads it) and the features dropped once binned
    deferred = read_party_table_deferred(data, name, id_col, label_col, keep=[weight_col] if weight_col else [],
                                         allow_text_label=True, categorical=categorical, weight_col=weight_col)
    frame, features = deferred if deferred is not None else \
        (_read_csv(data, name, id_col, label_col, allow_text_label=True, categorical=categorical,
                   weight_col=weight_col), None)
    active = ActiveParty(name, frame.frame, id_col, label_col, source=str(data), executor=executor,
                         categorical=categorical, weight_col=weight_col, low_memory=True, features=features)
    frame = deferred = None
    active.link_mbps = link_mbps
    vf = _read_csv(validation_data, name, id_col, label_col, allow_text_label=True, categorical=categorical) \
        if validation_data is not None else None
    transport = GrpcTransport(name, peers, security, timeout=timeout, max_frame_bytes=max_frame_bytes)
    done_before = ck.n_rounds if ck is not None else (base.n_rounds if base is not None else 0)
    counter = _RoundCounter(done_before, on_round)
    try:
        transport.connect(timeout=connect_timeout if connect_timeout is not None else timeout)
        t0, cpu0 = time.perf_counter(), _cpu_seconds()
        try:
            model = active.fit(transport, list(peers), params, counter,
                               checkpoint=(lambda c: c.save(files.checkpoint)) if files.resumable else None,
                               resume=ck, validation=vf.frame if vf is not None else None, warm_start=base)
        except PeerError as exc:
            hint = files.resume_hint(counter.rounds)
            if TAKEN_OVER in str(exc):       # issue 36, item 7: not a failed party; the newer process trains
                hint = ("another process training with this certificate owns the session now; " + hint.replace(
                    "restart the failed party and run", "once it has finished, run"))
            raise PeerError(f"training stopped after {counter.rounds} of {params.n_estimators} round(s): {exc}; "
                            f"{hint}") from None
        except WriteError as exc:
            raise WriteError(f"training stopped after {counter.rounds} of {params.n_estimators} round(s): {exc}; "
                             f"{files.resume_hint(counter.rounds)}", exc.path, exc.errno) from None
        train_seconds = time.perf_counter() - t0
        train_cpu_seconds = _cpu_seconds() - cpu0
    finally:
        transport.close()
    model.history.setdefault("network", {}).update(
        {"resumed_after_rounds": done_before} if ck is not None else {})
    files.finish(model, force)
    log.info("%s: model %s finished: %d round(s); saved to %s", name, model.model_id, model.n_rounds, files.final)
    return {
        "mode": params.mode, "objective": params.objective, "active_party": name,
        "passives": list(peers), "peers": dict(peers),
        "n_train": int(active.alignment_report.get(name, {}).get("n_kept", 0)),
        "train_seconds": train_seconds, "train_cpu_seconds": train_cpu_seconds,
        "resumed_after_rounds": done_before if ck is not None else None,
        "warm_start": model.history.get("warm_start"),
        "n_trees": sum(len(r) for r in model.rounds), "model_id": model.model_id, "model_path": str(files.final),
        "alignment": active.alignment_report, "bytes_sent": transport.bytes_report(),
        "total_bytes": transport.total_bytes(),
        "messages_sent": {f"{a}->{b}": n for (a, b), n in sorted(transport.messages_sent.items())},
        "params": params.to_dict(), "settings": dict(model.settings), "timings": active.timings,
        "crypto_seconds": active.crypto_seconds(),
        "security": security.describe(),
        "n_rounds": model.n_rounds, "best_iteration": model.best_iteration, "classes": model.classes,
        "eval_metric": model.params.get("eval_metric"), "history": model.history,
        "n_validation": int(len(vf.frame)) if vf is not None else 0,
    } | ({"dp_model": model.dp_model} if model.dp_model is not None else {})


def _cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children (worker processes) so far."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


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

    def __init__(self, model_dir: Path, name: str, resumable: bool, dp_model: bool = False):
        self.dir, self.name, self.resumable, self.dp_model = model_dir, name, resumable, dp_model
        self.checkpoint, self.final = model_dir / CHECKPOINT_FILE, model_dir / f"{name}.json"
        self.existing: Path | None = None

    def prepare(self, resume: bool, force: bool) -> Checkpoint | None:
        """Check the directory for a new or resumed training; the checkpoint to resume, if any."""
        if self.dir.exists() and not self.dir.is_dir():
            raise InputError(f"--model-dir {self.dir} is not a directory")
        self.existing = _find_active_model(self.dir) if self.dir.is_dir() else None
        if resume and not self.resumable and self.dp_model:
            raise InputError("--resume is not available for a --dp-model training: its DP bin edges and noisy leaf "
                             "values spend privacy budget once per training, and a resumed run would draw new "
                             "edges (spending again and disagreeing with the finished rounds); start the "
                             "training again")
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
        if self.dir.is_dir() and not force:
            damaged = [why for f, why in _scan_model_dir(self.dir)[1] if f == self.final]
            if damaged:
                raise InputError(f"{damaged[0]}; use another --model-dir or --force to replace it")
        check_writable_dir(self.dir, "--model-dir")       # a read-only directory: refused before training
        return None

    def resume_hint(self, n_rounds: int) -> str:
        """What to do after a training stopped by a peer's failure."""
        if not self.resumable:
            return ("a --dp-model training" if self.dp_model else "dp mode") + " cannot be resumed: start again"
        if self.checkpoint.exists() and n_rounds > 0:
            return (f"the checkpoint {self.checkpoint} keeps the first {n_rounds} round(s) (completed: false): "
                    "restart the failed party and run the same command with --resume")
        return "no round was finished, so there is nothing to resume: start again"

    def finish(self, model: BoostedModel, force: bool) -> None:
        """Write the final model (replacing another with --force) and drop the checkpoint. If the
        write fails (a full disk), the checkpoint is kept and ``--resume`` completes this step: the
        passive parties, already told the training finished, reopen the model for the resumed
        run, which trains no further round and writes the model."""
        try:
            write_json_atomic(self.final, model.file_dict())
        except WriteError as exc:
            kept = (f"the checkpoint {self.checkpoint} was kept (all {model.n_rounds} round(s)): free space and "
                    "run the same command with --resume to write the model") if self.checkpoint.exists() else \
                "train again"
            raise WriteError(f"the training finished but the model could not be saved: {exc}; {kept}",
                             exc.path, exc.errno) from None
        if force and self.existing is not None and self.existing != self.final:
            self.existing.unlink()
        if self.checkpoint.exists():
            self.checkpoint.unlink()
            fsync_dir(self.dir)


# --------------------------------------------------------------------------- active: prediction
def check_prediction(prediction: str) -> None:
    if prediction not in PREDICTIONS:
        raise InputError(f"--prediction must be one of {PREDICTIONS}, got {prediction!r}")


def _predict_proba(active: ActiveParty, transport, frame, source, prediction: str, align: str | None,
                   drift_run=None, last: bool = True):
    if align is not None and align not in ALIGNMENTS:
        raise InputError(f"--align must be one of {ALIGNMENTS}, got {align!r}")
    ids, raw = active.predict_raw(transport, frame, source, prediction=prediction, align=align, drift_run=drift_run,
                                  last=last)
    return ids, get_objective(active.model.objective).transform(raw)


def load_active_model(model_dir) -> BoostedModel:
    return BoostedModel.load(find_active_model_file(model_dir))


def find_active_model_file(model_dir) -> Path:
    """The active-party model file of ``model_dir`` (an :class:`InputError` saying why there is none)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise InputError(f"model directory {model_dir} does not exist")
    path = _find_active_model(model_dir)
    if path is None:
        _, unreadable = _scan_model_dir(model_dir)
        if unreadable:
            raise InputError(f"no readable active-party model in {model_dir}: " + "; ".join(
                why for _, why in unreadable))
        if (model_dir / CHECKPOINT_FILE).exists():
            raise InputError(f"{model_dir} holds only an unfinished training ({CHECKPOINT_FILE}): finish it with "
                             "`vfl party active ... --resume` before predicting")
        raise InputError(f"no active-party model in {model_dir}")
    return path


def check_peers(model: BoostedModel, peers: dict[str, str]) -> None:
    """The peers are exactly the model's passive parties."""
    missing = [p for p in model.passives if p not in peers]
    if missing:
        raise InputError("the model needs passive part" + ("y " if len(missing) == 1 else "ies ")
                         + ", ".join(repr(p) for p in missing) + ": give --peer "
                         + " --peer ".join(f"{p}=HOST:PORT" for p in missing))
    extra = [p for p in peers if p not in model.passives]
    if extra:
        raise InputError(f"the model was not trained with part{'y' if len(extra) == 1 else 'ies'} {extra}; "
                         f"its passive parties are {model.passives}")


def predict_active(model_dir, data, id_col: str, peers: dict[str, str], security, out=None,
                   timeout: float = DEFAULT_TIMEOUT, prediction: str = "one-round",
                   max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, connect_timeout: float | None = None,
                   align: str | None = None, batch_rows: int = DEFAULT_BATCH_ROWS, collect: bool | None = None,
                   drift: bool = False, label_col: str | None = None, segment: str | None = None,
                   points=None):
    """Score the rows of ``data`` (the active party's columns: CSV, Parquet file or directory);
    returns ``(ids, proba, summary)``.

    ``prediction``: "one-round" (leaf masks) or "node" (node-by-node routing); ``align``: how the
    passive parties find the rows ("hash" or "psi"; default: as in training).
    The rows are read and scored ``batch_rows`` at a time (one prediction session per batch) and
    each batch's lines are appended to ``out`` (written atomically at the end), so the driver holds
    one batch of features and predictions at a time (plus the ids, checked for duplicates first);
    the output is the same as scoring all rows at once. ``collect`` (default: when ``out`` is None)
    keeps every batch's ids and predictions for the return value; without it ``ids`` and ``proba``
    are None. ``drift``: the summary's ``drift`` is every party's PSI of its own inputs on these rows
    (:class:`parties.drift.DriftRun`); ``label_col``: a column of ``data`` holding the true labels,
    the summary's ``credit`` their credit metrics (per value of the column ``segment`` too).
    ``points``: a :class:`vfl.core.scorecard.PointsScale` adds each row's scorecard points to
    ``out`` (a binary model only)."""
    check_prediction(prediction)
    collect = out is None if collect is None else collect
    model = load_active_model(model_dir)
    model.check_points(points)
    check_peers(model, peers)
    batches = iter_party_batches(data, model.active_party, id_col, batch_rows=batch_rows,
                                 categorical=list(model.categories))
    first = next(batches)            # the whole id column is checked here, before connecting
    evaluation = BatchEvaluation(model, first.frame, str(data), label_col, segment) \
        if label_col is not None or segment is not None else None
    run = DriftRun(model) if drift else None
    active = ActiveParty.from_model(model, id_col)
    used = {p: peers[p] for p in model.passives}
    transport = GrpcTransport(model.active_party, used, security, timeout=timeout, max_frame_bytes=max_frame_bytes)
    kept_ids, kept_proba, n_rows, n_batches = [], [], 0, 0
    try:
        transport.connect(timeout=connect_timeout if connect_timeout is not None else timeout)
        t0 = time.perf_counter()
        with atomic_text_writer(out) if out is not None else contextlib.nullcontext() as fh:
            for pf, last in with_last(_chain(first, batches)):
                frame = pf.frame if evaluation is None else evaluation.add(pf.frame)
                ids, proba = _predict_proba(active, transport, frame, pf.source, prediction, align, run, last)
                if evaluation is not None:
                    evaluation.add_output(proba)
                if fh is not None:
                    fh.write(model.prediction_table(ids, proba, id_col, points).to_csv(index=False,
                                                                                      header=n_batches == 0))
                if collect:
                    kept_ids.append(ids)
                    kept_proba.append(proba)
                n_rows += len(ids)
                n_batches += 1
        seconds = time.perf_counter() - t0
    finally:
        transport.close()
    ids = np.concatenate(kept_ids) if collect else None
    proba = np.concatenate(kept_proba) if collect else None
    summary = {"model_id": model.model_id, "n_rows": n_rows, "predict_seconds": seconds,
               "prediction": prediction, "align": align or model.params.get("align", "hash"),
               "n_batches": n_batches, "batch_rows": batch_rows,
               "bytes_sent": transport.bytes_report(), "total_bytes": transport.total_bytes()}
    if evaluation is not None:
        summary["credit"] = evaluation.report()
    if run is not None:
        summary["drift"] = run.report()
    if points is not None:
        summary["points"] = points.to_dict()
    log.info("%s: predicted %d rows in %d batch(es) with model %s in %.2f s", model.active_party, n_rows,
             n_batches, model.model_id, seconds)
    return ids, proba, summary


def _chain(first, rest):
    yield first
    yield from rest


__all__ = ["serve_passive", "train_active", "predict_active", "load_active_model"]
