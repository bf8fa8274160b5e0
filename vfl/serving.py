"""Online scoring over HTTP (``vfl serve``, extra ``serve``): a FastAPI app on the active party.

Endpoints:

* ``POST /v1/score`` — one applicant ``{"id": ..., "features": {name: value or null}}``, a list of
  them, or ``{"applicants": [...]}``; query ``explain=true`` (reason codes, ``base`` and ``margin``:
  ``vfl serve --explain-top K``), ``deadline_ms`` (at most the server's ``--max-deadline-ms``).
  Answers the probability
  (binary), the class probabilities and predicted class (multiclass) or the value (regression),
  the model version, and per applicant the passive parties that did not know it (``unknown_at``);
  ``default_routed`` names the parties that could not answer (down, slower than the deadline) and
  whose default directions were used instead. Errors: 422 (a bad applicant), 429 (a passive
  party's quota; ``Retry-After``), 503 (``--require-all`` and a party could not answer), 504 (the
  deadline passed).
* ``GET /healthz`` (the process answers), ``GET /readyz`` (a model is loaded and, with
  ``--require-all``, every passive party answers), ``GET /metrics`` (Prometheus).

:class:`ScoringService` holds the model version in use and swaps in a new one (SIGHUP, or the
model directory watched) without dropping requests: a request is scored with the version it
arrived under; the new version's channels are opened before it is used.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from datasets.errors import InputError, PeerError, VFLError
from parties.network import find_active_model_file
from parties.online_active import (
    DeadlinePassed,
    MicroBatcher,
    ModelVersion,
    OnlineScorer,
    PartyUnavailable,
    QuotaRefused,
    ServiceStopping,
    directory_signature,
    model_signature,
)
from parties.serve_metrics import ServeMetrics, settle_heap
from vfl.core.explain import ADVERSE, explain_decisions, plan_for, reason_records

log = logging.getLogger("vfl.serve")

#: applicants in one HTTP request
MAX_REQUEST_ROWS = 1000


class ReasonCodes:
    """The explainer of ``vfl serve``: reason codes from grouped path-dependent TreeSHAP
    (:mod:`vfl.core.explain`) computed from the decisions online scoring gathered (the passive
    parties' answers, or their default directions where they could not answer): no message
    beyond scoring's. Per applicant ``reasons`` (the ``top`` players that pushed the score most
    towards the ``adverse`` side, with their signed values), ``base`` (the expected margin) and
    ``margin`` (the raw score: ``base`` + every player's value); multiclass: per class."""

    def __init__(self, top: int = 3, adverse: str = "high", id_col: str = "id"):
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise InputError(f"--explain-top must be a positive integer, got {top!r}")
        if adverse not in ADVERSE:
            raise InputError(f"--adverse must be one of {ADVERSE}, got {adverse!r}")
        self.top, self.adverse, self.id_col = top, adverse, id_col

    def prepare(self, v: ModelVersion) -> None:
        """Tabulate the model's explanation plan before the version is used."""
        plan_for(v.model)

    def __call__(self, v: ModelVersion, raw, decisions: dict) -> list[dict]:
        model = v.model
        ex = explain_decisions(model, v.trees, decisions, raw)
        reasons = reason_records(ex, self.top, self.adverse, model.classes, self.id_col)
        K = ex.values.shape[1]
        if K == 1:
            return [{"reasons": reasons[i], "base": float(ex.base[0]), "margin": float(ex.margin[i, 0])}
                    for i in range(ex.n_rows)]
        names = [str(c) for c in (model.classes if model.classes is not None else range(K))]
        base = {names[k]: float(ex.base[k]) for k in range(K)}
        return [{"reasons": reasons[i], "base": base, "margin": {names[k]: float(ex.margin[i, k]) for k in range(K)}}
                for i in range(ex.n_rows)]


class ScoringService:
    """The model in use, the scorer and the micro-batcher of ``vfl serve``.

    ``explainer(version, raw, decisions) -> [fields per applicant]`` is the hook of the
    explanations (:class:`ReasonCodes`; None: ``explain=true`` answers 501); its ``prepare(version)``
    runs before a version is used."""

    def __init__(self, model_dir, transport, *, id_col: str = "id", require_all: bool = False,
                 deadline_ms: float = 200.0, max_deadline_ms: float = 10000.0, batch_rows: int = 64,
                 batch_wait_ms: float = 1.0, workers: int = 4, retry_seconds: float = 1.0,
                 watch_interval: float = 1.0, explainer=None, metrics: ServeMetrics | None = None,
                 freeze_heap: bool = False):
        for what, v in (("--deadline-ms", deadline_ms), ("--max-deadline-ms", max_deadline_ms)):
            if not 0 < v <= 3_600_000:
                raise InputError(f"{what} must be more than 0 and at most 3600000 (one hour), got {v}")
        if deadline_ms > max_deadline_ms:
            raise InputError(f"--deadline-ms {deadline_ms:g} is more than --max-deadline-ms {max_deadline_ms:g}")
        if not 0 <= batch_wait_ms <= 1000:
            raise InputError(f"--batch-wait-ms must be 0..1000, got {batch_wait_ms}")
        self.model_dir, self.transport, self.id_col = Path(model_dir), transport, id_col
        self.require_all = bool(require_all)
        self.deadline_s, self.max_deadline_s = deadline_ms / 1000.0, max_deadline_ms / 1000.0
        self.watch_interval, self.explainer = float(watch_interval), explainer
        self.freeze_heap = bool(freeze_heap)     # the process's own service (vfl serve): see settle_heap
        self.metrics = metrics or ServeMetrics()
        self.scorer = OnlineScorer(transport, require_all=require_all, retry_seconds=retry_seconds,
                                   metrics=self.metrics, calls=max(4, 4 * workers))
        self.batcher = MicroBatcher(self.scorer, max_rows=batch_rows, max_wait=batch_wait_ms / 1000.0,
                                    workers=workers)
        self.current: ModelVersion | None = None
        self._signature = None
        self._reload_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        # the listing the watcher starts from, taken before any model file is read: a file written after
        # it (while the first model loads, or before the watcher thread first runs) is a change to look at
        self._listing = directory_signature(self.model_dir)

    # -- model versions -------------------------------------------------------------
    def load(self, open_timeout: float) -> ModelVersion:
        """Load the model of ``model_dir`` and open its channels (a party that cannot be reached is
        retried at the first request); the first model must load, or :class:`InputError`."""
        self._listing = directory_signature(self.model_dir)
        path = find_active_model_file(self.model_dir)
        v = ModelVersion.load(path)
        self._check_peers(v)
        self._prepare(v)
        errors = self.scorer.open_all(v, open_timeout)
        for p, why in errors.items():
            log.warning("model %s: the scoring channel to %r is not open yet: %s", v.version, p, why)
        self._use(v, model_signature(path))
        return v

    def _check_peers(self, v: ModelVersion) -> None:
        missing = [p for p in v.model.passives if p not in self.transport.peers]
        if missing:
            raise InputError(f"model {v.version} needs passive part{'y' if len(missing) == 1 else 'ies'} "
                             f"{missing}: give --peer NAME=HOST:PORT or a federation file that names them")

    def _prepare(self, v: ModelVersion) -> None:
        prepare = getattr(self.explainer, "prepare", None)
        if prepare is not None:
            prepare(v)

    def _use(self, v: ModelVersion, signature) -> None:
        old, self.current, self._signature = self.current, v, signature
        if old is not None:
            self.metrics.model.labels(old.version).set(0)
        self.metrics.model.labels(v.version).set(1)
        if self.freeze_heap:
            settle_heap()
        log.info("serving model %s from %s (%d passive part%s owning splits)", v.version, v.path, len(v.owners),
                 "y" if len(v.owners) == 1 else "ies")

    def reload(self, open_timeout: float = 10.0) -> bool:
        """Load the model file again if it changed; the new version is used once its channels are
        open at every passive party that owns a split (a party without the model refuses: the
        version in use stays). Requests already in flight finish on the old version."""
        with self._reload_lock:
            try:
                path = find_active_model_file(self.model_dir)
                sig = model_signature(path)
                if sig == self._signature and self.current is not None and str(path) == self.current.path:
                    return False
                v = ModelVersion.load(path)
                self._check_peers(v)
                self._prepare(v)
                errors = self.scorer.open_all(v, open_timeout)
                if errors:
                    raise InputError("; ".join(f"party {p!r}: {why}" for p, why in errors.items()))
            except (VFLError, OSError) as exc:
                self.metrics.reloads.labels("failed").inc()
                log.error("the model in %s could not be loaded; model %s stays in use: %s", self.model_dir,
                          self.current.version if self.current else None, exc)
                return False
            self._use(v, sig)
            self.metrics.reloads.labels("ok").inc()
            return True

    def request_reload(self) -> None:
        """Reload soon (SIGHUP): on the watcher thread, never in a signal handler."""
        self._signature = None
        self._wake.set()

    def start_watching(self) -> None:
        self._watcher = threading.Thread(target=self._watch, name="vfl-model-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        # the directory's listing with each file's size and times: the model files are read (parsed) only when
        # it changed (or on SIGHUP); parsing a large model every second held up the requests scored meanwhile
        listing = self._listing
        while not self._stop.is_set():
            self._wake.wait(self.watch_interval if self.watch_interval > 0 else None)
            asked = self._wake.is_set()
            self._wake.clear()
            if self._stop.is_set():
                return
            now = directory_signature(self.model_dir)
            if now == listing and not asked:
                continue
            listing = now
            try:
                sig = model_signature(find_active_model_file(self.model_dir))
            except (VFLError, OSError):
                sig = None
            if sig is not None and sig != self._signature:
                time.sleep(0.05)      # a file being replaced: let it settle
                listing = directory_signature(self.model_dir)
                if not self.reload():
                    listing = None    # not taken (a party without the model yet): look again next time

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self.batcher.close()
        self.scorer.close()
        self.transport.close()

    # -- readiness ------------------------------------------------------------------------
    def readiness(self) -> tuple[bool, dict]:
        v = self.current
        peers = self.scorer.peer_state()
        body = {"model_version": v.version if v else None,
                "parties": {p: peers.get(p, "up") for p in (v.model.passives if v else [])}}
        ready = v is not None and (not self.require_all or not peers)
        return ready, body


# --------------------------------------------------------------------------- the HTTP app
def _applicants(body) -> tuple[list, list, bool]:
    """``(ids, feature dicts, single)`` of a request body."""
    single = isinstance(body, dict) and "applicants" not in body
    items = [body] if single else (body["applicants"] if isinstance(body, dict) else body)
    if not isinstance(items, list) or not items:
        raise InputError("the body must be an applicant {\"id\": ..., \"features\": {...}}, a non-empty list of "
                         "them, or {\"applicants\": [...]}")
    if len(items) > MAX_REQUEST_ROWS:
        raise InputError(f"{len(items)} applicants in one request, more than {MAX_REQUEST_ROWS}")
    ids, feats = [], []
    for i, a in enumerate(items):
        where = "the applicant" if single else f"applicant {i}"
        if not isinstance(a, dict) or set(a) - {"id", "features"} or "id" not in a:
            raise InputError(f"{where}: expected {{\"id\": ..., \"features\": {{name: value}}}}")
        aid = a["id"]
        if isinstance(aid, bool) or not isinstance(aid, (str, int)) or aid == "":
            raise InputError(f"{where}: the id must be a non-empty string or an integer, got {aid!r}")
        f = a.get("features", {})
        if not isinstance(f, dict):
            raise InputError(f"{where}: features must be an object {{name: value}}")
        for k, val in f.items():
            if val is not None and (isinstance(val, bool) or not isinstance(val, (int, float, str))):
                raise InputError(f"{where}: feature {k!r} must be a number, a string or null, got {val!r}")
        ids.append(aid)
        feats.append(f)
    return ids, feats, single


def _error(status: int, message: str, **extra) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status,
                        headers={"Retry-After": str(max(1, round(extra["retry_after"])))}
                        if extra.get("retry_after") else None)


def create_app(service: ScoringService):
    """The ASGI app of ``service``: its FastAPI app, the scoring route served first."""
    app = FastAPI(title="vfl-boost online scoring", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = service.metrics

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        ready, body = service.readiness()
        return JSONResponse({"ready": ready, **body}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def prometheus():
        data, ctype = metrics.exposition()
        return Response(content=data, media_type=ctype)

    outcomes = {}       # the request counter's child per outcome, looked up once

    async def score(request: Request):
        t0 = time.perf_counter()
        outcome = "error"
        try:
            try:
                explain = _flag(request.query_params.get("explain"), "explain")
                deadline_ms = _number(request.query_params.get("deadline_ms"), "deadline_ms")
            except InputError as exc:
                response = _error(422, str(exc))
            else:
                response = await _score(request, explain, deadline_ms)
            outcome = "ok" if response.status_code == 200 else str(response.status_code)
            return response
        finally:
            child = outcomes.get(outcome)
            if child is None:
                child = outcomes[outcome] = metrics.requests.labels(outcome)
            child.inc()
            metrics.latency.observe(time.perf_counter() - t0)

    async def _score(request: Request, explain: bool, deadline_ms: float | None):
        now = time.monotonic()
        wait = service.deadline_s if deadline_ms is None else deadline_ms / 1000.0
        if not 0 < wait <= service.max_deadline_s:
            return _error(422, f"deadline_ms must be more than 0 and at most {service.max_deadline_s * 1000:g}")
        deadline = now + wait
        v = service.current
        if v is None:
            return _error(503, "no model is loaded yet")
        if explain and service.explainer is None:
            return _error(501, "explanations (explain=true) are not available in this build: no explainer is "
                               "installed")
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(422, f"the body is not JSON: {exc}")
        try:
            ids, feats, single = _applicants(body)
            X = v.features(ids, feats, service.id_col)
        except InputError as exc:
            return _error(422, str(exc))
        fut = service.batcher.submit(v, ids, X, deadline, explain=explain)
        try:
            raw, unknown, degraded, decisions = await _result(fut, max(0.0, deadline - time.monotonic()) + 0.005)
        except (asyncio.TimeoutError, DeadlinePassed):
            fut.cancel()
            metrics.errors.labels("deadline", "-").inc()
            return _error(504, f"the deadline of {wait * 1000:g} ms passed before the applicant(s) were scored")
        except QuotaRefused as exc:
            return _error(429, str(exc), party=exc.party, rule=exc.rule, retry_after=exc.retry_after)
        except PartyUnavailable as exc:
            return _error(503, str(exc), party=exc.party)
        except ServiceStopping as exc:
            return _error(503, str(exc))
        except (PeerError, VFLError) as exc:
            metrics.errors.labels("peer", "-").inc()
            return _error(502, str(exc))
        results = v.output(raw)
        explained = None
        if explain:
            try:
                explained = await asyncio.to_thread(service.explainer, v, raw, decisions)
            except VFLError as exc:
                metrics.errors.labels("explain", "-").inc()
                return _error(500, f"the applicant(s) were scored but could not be explained: {exc}")
        for i, r in enumerate(results):
            r["id"] = ids[i]
            r["unknown_at"] = [p for p, u in unknown.items() if u[i]]
            if explained is not None:
                r.update(explained[i])
        doc = {"model_version": v.version}
        if degraded:
            doc["default_routed"] = degraded
        if single:
            return JSONResponse({**doc, **results[0]})
        return JSONResponse({**doc, "results": results})

    # a plain route: its two query parameters parsed here, not by FastAPI's dependency solving and validation,
    # which ran for every request (a few percent of the service's time per request in a profile at 200 req/s)
    app.add_route("/v1/score", score, methods=["POST"])      # reached by another method only: _ScoreFirst
    return _ScoreFirst(app, score)


def _result(fut, timeout: float):
    """An awaitable of the batcher's future ``fut`` (set in another thread), ending with
    :class:`asyncio.TimeoutError` after ``timeout`` s: one loop future and one timer, where
    ``asyncio.wait_for(asyncio.wrap_future(fut))`` chained three futures per request."""
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def copy(done):
        if waiter.done():
            return
        if done.cancelled():
            waiter.cancel()
        elif done.exception() is not None:
            waiter.set_exception(done.exception())
        else:
            waiter.set_result(done.result())

    def timed_out():
        if not waiter.done():
            waiter.set_exception(asyncio.TimeoutError())

    timer = loop.call_later(timeout, timed_out)
    waiter.add_done_callback(lambda _: timer.cancel())

    def hand_over(done):
        try:
            loop.call_soon_threadsafe(copy, done)
        except RuntimeError:        # the loop closed meanwhile (the service stopped): nobody waits
            pass
    fut.add_done_callback(hand_over)
    return waiter


class _ScoreFirst:
    """The service's ASGI app: ``POST /v1/score`` goes straight to its handler; every other request
    (and the score route under another method) to the FastAPI app. FastAPI's and Starlette's
    middleware layers, run for every request, were a fifth of the service's interpreter time per
    scored applicant in a closed-loop profile; the handler catches what they would (an error in it
    is a JSON 500, logged)."""

    def __init__(self, app: FastAPI, score):
        self.app, self._score = app, score

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/score":
            try:
                response = await self._score(Request(scope, receive))
            except Exception:  # noqa: BLE001  (a bug answers 500, as the middleware did)
                log.exception("vfl serve: failed on a scoring request")
                response = _error(500, "internal error while scoring (see the service's log)")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(value: str | None, name: str) -> bool:
    if value is None:
        return False
    v = value.strip().lower()
    if v in _TRUE or v in _FALSE:
        return v in _TRUE
    raise InputError(f"query parameter {name} must be true or false, got {value!r}")


def _number(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        x = float(value)
    except ValueError:
        raise InputError(f"query parameter {name} must be a number, got {value!r}") from None
    if x != x:
        raise InputError(f"query parameter {name} must be a number, got {value!r}")
    return x
