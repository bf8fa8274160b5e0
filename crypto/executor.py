"""Where the ciphertext kernels run: the executor interface and its local implementation.

The kernels (:mod:`crypto.histogram`, :mod:`crypto.compress`,
:mod:`crypto.paillier`) see an :class:`Executor` as **named shared state on
workers plus requests over it**:

* ``share(slot, obj, header, blobs)`` puts one big object (a key's tables, a
  party's encryptor) into the named ``slot`` of every
  worker, once: the executor remembers which local object a slot holds
  (``holds``), so sharing the same object again is free and a new object (the
  next round) replaces it. ``share_lazy`` encodes only when needed.
* ``map(requests)`` runs independent requests, each ``(header, blobs)`` with
  ``header["op"]`` an operation of :mod:`crypto.worker` that names the slots it
  reads; the replies come back in request order. ``broadcast`` sends one
  request to every worker.
* ``run_on(requests)`` runs each request on a given worker (the one whose slots hold a row
  shard, :mod:`crypto.shards`); ``submit_on`` starts them and returns at once (a
  :class:`Pending`, issue 24: a caller keeps many requests in flight while others use the
  same workers; a worker runs its requests in the order they reach it); ``reduce_on`` sums
  such requests' partial results with a ``combine`` operation, in slices on the workers
  (:meth:`Executor.sum_parts`); ``drop(prefix)`` forgets slots.
* ``n_workers``, a context-manager lifecycle (``start``, ``close``), and for
  benchmarks ``pids``, ``cpu_seconds`` (CPU time the workers reported) and
  ``worker_peaks()`` (peak resident memory per worker).

Requests and replies are frames of :mod:`crypto.framing` (JSON header, raw byte
blobs), and a worker's state is exactly what was shared into its slots; so the
cluster executor (:class:`crypto.dask_executor.DaskExecutor`, issue 11: row
shards that stay put on workers, one task per worker and level) implements the
same methods over Dask, and the kernels do not change. :class:`InlineExecutor`
runs the same operations in the calling process (one job, or tiny data).
Whether a batch goes to the workers at all is decided by
:func:`crypto.parallel.on_workers`, not by the executor.

:class:`LocalExecutor` is the implementation on this machine: ``n_workers``
child processes (``python -m crypto.worker``), each a loop that reads one
request frame from its stdin and writes one reply frame to its stdout. Each
has a **lane** in the parent (:class:`_Lanes`): a FIFO of requests that one
thread sends and answers in turn; unpinned requests (``map``) go to the first
idle lane. No lock is held while a worker computes, so the gradient stream,
the obfuscator fills, the intake and a level's tasks of one party share all its
workers (before issue 24 one lock held the whole pool for each call).
:class:`crypto.sim_executor.SimulatedExecutor` runs the same lanes over
simulated workers (the many-core model).

Why child processes started with ``subprocess`` rather than ``fork``: a forked
copy of a process that runs threads (a gRPC server, BLAS) may deadlock, Python
3.12+ warns about it, and a spawned ``multiprocessing`` child re-imports the
user's ``__main__``. A plain child process that imports only ``gmpy2`` (and
numpy for histograms) has none of these problems; it costs ~0.1 s once per
executor.

Lifetime: an executor belongs to one party object and is closed by it (end of
training, errors), by garbage collection, or at interpreter exit. A worker
exits on its own when its stdin closes, so a killed parent leaves no orphan
beyond the request in flight. All processes belong to the same party.
"""
from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import weakref
from abc import ABC, abstractmethod
from collections import deque
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from crypto import parallel, worker
from crypto.framing import Frame, encode_frame, read_frame
from crypto.parallel import resolve_workers
from datasets.errors import VFLError

_ROOT = str(Path(__file__).resolve().parents[1])

#: one request to a worker: ``(header with "op", blobs)``
Request = tuple[dict, Sequence[bytes]]


class WorkerError(VFLError, RuntimeError):
    """A worker failed (its traceback is in the message) or died."""


class Executor(ABC):
    """Workers holding named shared state, and requests over that state (see the module doc).

    Implementations must be thread-safe and may start their workers lazily (at the
    first ``share``, ``broadcast`` or ``map``). A failed request raises
    :class:`WorkerError` and leaves the executor closed, never half-used.
    """

    name: str
    n_workers: int
    closed: bool
    cpu_seconds: float
    #: the least work worth one request (seconds): background work is batched to about this
    #: long (0: requests are cheap, as over a local pipe)
    task_seconds: float = 0.0

    # -- lifecycle --------------------------------------------------------
    @abstractmethod
    def start(self) -> "Executor":
        """Start the workers now (without waiting for them to be ready); returns ``self``."""

    @abstractmethod
    def close(self, kill: bool = False) -> None:
        """Stop every worker (idempotent): let it finish its request, or ``kill`` it now.
        A closed executor cannot be used again."""

    @property
    @abstractmethod
    def started(self) -> bool:
        """Whether workers are running."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- named shared state -------------------------------------------------
    # implementations keep ``_slots`` ({slot: the local object its workers hold}) and ``_lock``
    def _slots_valid(self) -> bool:
        """Whether the workers still hold what ``_slots`` records (they are running)."""
        return self.started

    def holds(self, slot: str, obj) -> bool:
        """Whether every worker's ``slot`` holds this very local object."""
        return self._slots.get(slot) is obj and self._slots_valid()

    def share(self, slot: str, obj, header: dict, blobs: Sequence[bytes] = (), op: str = "put") -> None:
        """Put ``obj`` (encoded as ``header``/``blobs``, see :mod:`crypto.worker` ``put``) into
        ``slot`` of every worker, unless the slot already holds this very object."""
        with self._lock:
            if self.holds(slot, obj):
                return
            self._slots.pop(slot, None)
            self.broadcast(dict(header, op=op, slot=slot), blobs)
            self._slots[slot] = obj

    #: the modules the workers' ``ext`` operation may run (see :meth:`allow`)
    extensions: tuple[str, ...] = ()

    def allow(self, *modules: str) -> None:
        """Let the ``ext`` operation of :mod:`crypto.worker` run these modules' ``WORKER_OPS`` on
        the workers (e.g. ``"parties.shard_ops"``): the party that starts or uses the executor
        hands them over, this floor names none. Kept in a slot (:data:`crypto.worker.EXTENSIONS_SLOT`):
        a no-op once every worker holds them."""
        with self._lock:
            wanted = tuple(sorted(set(self.extensions) | {str(m) for m in modules}))
            if wanted != self.extensions:
                self.extensions = wanted
            self.share(worker.EXTENSIONS_SLOT, self.extensions, {"modules": list(self.extensions)}, op="allow")

    def share_lazy(self, slot: str, obj, encode: Callable[[], tuple[dict, Sequence[bytes]]]) -> None:
        """Like :meth:`share`, calling ``encode() -> (header, blobs)`` only when needed."""
        if not self.holds(slot, obj):
            header, blobs = encode()
            self.share(slot, obj, header, blobs)

    # -- requests ----------------------------------------------------------
    @abstractmethod
    def broadcast(self, header: dict, blobs: Sequence[bytes] = ()) -> list[Frame]:
        """The same request to every worker; their replies in worker order."""

    @abstractmethod
    def map(self, requests: Sequence[Request]) -> list[Frame]:
        """Run independent requests on whichever worker is free, starting them in the given
        order (largest first is the caller's job); replies in request order."""

    # -- pinned requests (row shards that stay put, see crypto.shards) -------
    @abstractmethod
    def run_on(self, requests: Sequence[tuple[int, Request]]) -> list[Frame]:
        """Run each ``(worker index, request)`` on that very worker (its slots hold the shard the
        request reads); requests of different workers run concurrently; replies in order."""

    def submit_on(self, requests: Sequence[tuple[int, Request]]) -> "Pending":
        """Start pinned requests (as :meth:`run_on`) and return at once: :meth:`Pending.result`
        waits for their replies. A worker runs its requests in the order they reach it, whoever
        sent them, so a caller keeps many requests in flight (the gradient stream's window, the
        intake's fills and root partials) while others use the same workers. The default runs
        them before returning (an executor that cannot overlap callers)."""
        futures = []
        try:
            replies = self.run_on(requests)
        except BaseException as exc:
            fut: Future = Future()
            fut.set_exception(exc)
            return Pending([fut])
        for reply in replies:
            fut = Future()
            fut.set_result(reply)
            futures.append(fut)
        return Pending(futures)

    def reduce_on(self, requests: Sequence[tuple[int, Request]], combine: dict) -> Frame:
        """Run pinned requests whose replies are partial results (one blob each) and sum them with
        the ``combine`` operation of :mod:`crypto.worker` into one reply, whose header sums the
        partials' numeric ``additions``. The sum is spread over the workers (:meth:`sum_parts`);
        a cluster executor may sum next to the partials instead."""
        replies = self.run_on(requests)
        additions = sum(int(h.get("additions", 0)) for h, _ in replies)
        return {"additions": additions}, [self.sum_parts([blobs[0] for _, blobs in replies], combine)]

    def sum_parts(self, parts: Sequence[bytes], combine: dict) -> bytes:
        """The elementwise sum of partial results (fixed-width values, ``combine["width"]`` bytes
        each) with the ``combine`` operation: cut into :func:`reduce_slices` slices, each slice of
        every partial summed by one request on whichever worker is free (``(parts - 1) * values /
        slices`` additions each: the reduction takes about ``1 / n_workers`` of its work, not the
        driver's ``parts - 1`` passes over the whole vector). Small sums (under the ``reduce``
        threshold of :func:`crypto.parallel.on_workers`) stay in the calling process."""
        if not parts:
            return b""
        if len(parts) == 1:
            return bytes(parts[0])
        w = max(1, int(combine["width"]))
        n = len(parts[0]) // w
        if not parallel.on_workers(self, "reduce", (len(parts) - 1) * n):
            return self._run_here(dict(combine), list(parts))[1][0]
        cuts = reduce_slices(n, self.n_workers)
        reqs = [(dict(combine), [bytes(memoryview(p)[a * w:b * w]) for p in parts]) for a, b in cuts]
        return b"".join(blobs[0] for _, blobs in self.map(reqs))

    def _run_here(self, header: dict, blobs: Sequence[bytes]) -> Frame:
        """Run a stateless operation (``combine``) in the calling process (the driver; small sums)."""
        return worker.run(header, list(blobs), {})

    def drop(self, prefix: str) -> None:
        """Forget every slot whose name starts with ``prefix`` on every worker (and locally)."""
        if self.started and not self.closed:
            self.broadcast({"op": "drop", "prefix": prefix})
        for slot in [s for s in self._slot_names() if s.startswith(prefix)]:
            self._forget(slot)

    def _slot_names(self) -> list[str]:
        return list(self._slots)

    def _forget(self, slot: str) -> None:
        self._slots.pop(slot, None)

    # -- benchmarks -------------------------------------------------------
    @property
    @abstractmethod
    def pids(self) -> list[int]:
        """Process ids of the running workers (empty when not started)."""

    @abstractmethod
    def worker_peaks(self) -> list[dict]:
        """Peak resident memory of every worker this executor ran: ``{"pool", "pid",
        "peak_kb"}`` (``peak_kb`` ``None`` when unknown), measured now or when it stopped."""


#: values below which a slice of a reduction is not cut further
MIN_SLICE_VALUES = 8


def reduce_slices(n_values: int, n_workers: int) -> list[tuple[int, int]]:
    """``(start, stop)`` value ranges of a reduction over ``n_workers``: two per worker (a busy
    worker holds back less), none under :data:`MIN_SLICE_VALUES` values."""
    k = max(1, min(2 * max(1, int(n_workers)), int(n_values) // MIN_SLICE_VALUES))
    bounds = [round(i * int(n_values) / k) for i in range(k + 1)]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a] or [(0, int(n_values))]


# --- lanes: one FIFO of requests per worker, run by one thread each ------------------------
class Pending:
    """The replies of requests started with :meth:`Executor.submit_on`: :meth:`result` waits for
    them (in request order) and raises :class:`WorkerError` for the first that failed."""

    def __init__(self, futures: Sequence[Future], on_error: Callable[[], None] | None = None):
        self.futures = list(futures)
        self.on_error = on_error

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def result(self) -> list[Frame]:
        try:
            return [f.result() for f in self.futures]
        except BaseException:
            if self.on_error is not None:
                self.on_error()
            raise


class _Lanes:
    """``n`` lanes, each a FIFO of requests that one thread runs in turn with ``execute(i, header,
    blobs)`` (lane ``i``'s worker); unpinned requests (:meth:`map`) go to the first idle lane.
    Requests of different callers interleave: nothing holds a lock while a worker computes, so the
    encryption stream, the intake, the obfuscator fills and a level's tasks share every worker.
    Holds no reference to its executor (the executor's finalizer can still run)."""

    def __init__(self, n: int, execute: Callable[[int, dict, Sequence[bytes]], Frame], name: str):
        self.execute = execute
        self.cv = threading.Condition()
        self.own: list[deque] = [deque() for _ in range(n)]
        self.shared: deque = deque()
        self.stopped = False
        self.threads = [threading.Thread(target=self._loop, args=(i,), name=f"vfl-lane-{name}-{i}", daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def submit(self, lane: int | None, header: dict, blobs: Sequence[bytes]) -> Future:
        fut: Future = Future()
        with self.cv:
            if self.stopped:
                fut.set_exception(WorkerError("the executor is closed"))
                return fut
            (self.shared if lane is None else self.own[lane]).append((fut, header, blobs))
            self.cv.notify_all()
        return fut

    def _loop(self, i: int) -> None:
        own = self.own[i]
        while True:
            with self.cv:
                while not self.stopped and not own and not self.shared:
                    self.cv.wait()
                if self.stopped:
                    return
                fut, header, blobs = own.popleft() if own else self.shared.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(self.execute(i, header, blobs))
            except BaseException as exc:         # handed to the caller
                fut.set_exception(exc if isinstance(exc, WorkerError) else
                                  WorkerError(f"{type(exc).__name__}: {exc}"))
            fut = header = blobs = None

    def stop(self) -> None:
        """Stop every lane: queued requests fail, a running one finishes (or fails)."""
        with self.cv:
            self.stopped = True
            left = [item for q in self.own for item in q] + list(self.shared)
            for q in self.own:
                q.clear()
            self.shared.clear()
            self.cv.notify_all()
        for fut, _, _ in left:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(WorkerError("the executor was closed"))


# --- the local implementation ---------------------------------------------------
class _Worker:
    __slots__ = ("proc",)

    def __init__(self, proc):
        self.proc = proc


_CLOSED_PEAKS: list[dict] = []       # the peaks of every closed local executor, newest last


def _peak_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _shutdown(workers: list, name: str, kill: list, peaks: list, lanes: "_Lanes | None" = None) -> None:
    """Stop the lanes (queued requests fail), close stdin of every worker and wait for it (kill it
    at once if ``kill[0]``, or after 5 s), recording its peak memory in ``peaks``; idempotent."""
    if lanes is not None:
        lanes.stop()
    for w in workers:
        if w.proc.poll() is None:
            peak = {"pool": name, "pid": w.proc.pid, "peak_kb": _peak_kb(w.proc.pid)}
            peaks.append(peak)
            del _CLOSED_PEAKS[:-999]
            _CLOSED_PEAKS.append(peak)
            if kill[0]:
                w.proc.kill()
        try:
            w.proc.stdin.close()
        except OSError:
            pass
    for w in workers:
        try:
            w.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        try:
            w.proc.stdout.close()
        except OSError:
            pass
    workers.clear()


_LIVE: "weakref.WeakSet[LocalExecutor]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for ex in list(_LIVE):
        ex.close()


class LocalExecutor(Executor):
    """``n_workers`` worker processes on this machine with named shared slots; thread-safe,
    started lazily."""

    def __init__(self, n_workers: int | None = None, name: str = "pool"):
        self.n_workers = resolve_workers(n_workers)
        self.name = name
        self._workers: list[_Worker] = []
        self._slots: dict[str, Any] = {}          # slot -> local object it holds
        self._lock = threading.RLock()
        self._finalizer = None
        self._peaks: list[dict] = []              # workers stopped so far
        self.closed = False
        self._meter = _Meter()                    # CPU time the workers reported, all requests
        self._lanes: _Lanes | None = None

    @property
    def cpu_seconds(self) -> float:
        return self._meter.value

    @staticmethod
    def closed_peaks() -> list[dict]:
        """The :meth:`worker_peaks` of every local executor closed in this process (the last
        thousand workers; benchmarks add them up after the parties closed their executors)."""
        return list(_CLOSED_PEAKS)

    # -- lifecycle --------------------------------------------------------
    def _start(self) -> None:
        if self.closed:
            raise WorkerError(f"worker pool {self.name!r} is closed")
        if self._workers:
            return
        env = dict(os.environ)
        env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        for _ in range(self.n_workers):
            proc = subprocess.Popen([sys.executable, "-m", "crypto.worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, env=env, cwd=_ROOT)
            self._workers.append(_Worker(proc))
        self._kill = [False]
        self._lanes = _Lanes(self.n_workers, partial(_pipe_request, self._workers, self.name, self._meter), self.name)
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self.name, self._kill, self._peaks,
                                           self._lanes)
        _LIVE.add(self)

    def start(self) -> "LocalExecutor":
        with self._lock:
            self._start()
        return self

    @property
    def started(self) -> bool:
        return bool(self._workers)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def worker_peaks(self) -> list[dict]:
        with self._lock:
            live = [{"pool": self.name, "pid": w.proc.pid, "peak_kb": _peak_kb(w.proc.pid)}
                    for w in self._workers if w.proc.poll() is None]
            return list(self._peaks) + live

    def close(self, kill: bool = False) -> None:
        with self._lock:
            self.closed = True
            if kill and self._workers:
                self._kill[0] = True
            self._slots.clear()
            if self._finalizer is not None:
                self._finalizer()
            self._workers = []
            self._lanes = None
            _LIVE.discard(self)

    # -- shared slots -------------------------------------------------------
    def share_lazy(self, slot: str, obj, encode) -> None:
        with self._lock:
            super().share_lazy(slot, obj, encode)

    # -- requests ----------------------------------------------------------
    def _ready(self) -> _Lanes:
        lanes = self._lanes
        if lanes is None or self.closed:
            with self._lock:
                self._start()
                lanes = self._lanes
        return lanes

    def submit_on(self, requests: Sequence[tuple[int, Request]]) -> Pending:
        lanes = self._ready()
        for wi, _ in requests:
            if not 0 <= wi < self.n_workers:
                raise WorkerError(f"pool {self.name!r} has no worker {wi}")
        return Pending([lanes.submit(wi, h, b) for wi, (h, b) in requests], self._failed)

    def run_on(self, requests: Sequence[tuple[int, Request]]) -> list[Frame]:
        return self.submit_on(requests).result() if requests else []

    def broadcast(self, header: dict, blobs: Sequence[bytes] = ()) -> list[Frame]:
        return self.run_on([(wi, (header, blobs)) for wi in range(self.n_workers)])

    def map(self, requests: Sequence[Request]) -> list[Frame]:
        if not requests:
            return []
        lanes = self._ready()
        return Pending([lanes.submit(None, h, b) for h, b in requests], self._failed).result()

    def _failed(self) -> None:
        self.close(kill=True)



class _Meter:
    """A thread-safe running sum (the CPU seconds the workers reported)."""

    def __init__(self):
        self.value = 0.0
        self.lock = threading.Lock()

    def add(self, x: float) -> None:
        with self.lock:
            self.value += x


def _pipe_request(workers: list, name: str, meter: _Meter, i: int, header: dict, blobs: Sequence[bytes]) -> Frame:
    """One request to worker process ``i`` over its pipes (run by that worker's lane thread)."""
    try:
        w = workers[i]
    except IndexError:
        raise WorkerError(f"worker pool {name!r} is closed") from None
    try:
        for part in encode_frame(header, blobs):
            w.proc.stdin.write(part)
        w.proc.stdin.flush()
    except (BrokenPipeError, OSError, ValueError) as exc:
        raise WorkerError(f"worker {w.proc.pid} of pool {name!r} died ({exc})") from None
    try:
        reply_header, reply = read_frame(w.proc.stdout)
    except (EOFError, OSError, ValueError):
        code = w.proc.poll()
        raise WorkerError(f"worker {w.proc.pid} of pool {name!r} died (exit code {code})") from None
    if reply_header.get("error"):
        raise WorkerError(f"worker {w.proc.pid} of pool {name!r} failed:\n{reply_header['error']}")
    meter.add(float(reply_header.get("cpu", 0.0)))
    return reply_header, reply


class InlineExecutor(Executor):
    """The worker operations run in the calling process, over this object's own slots: the
    executor of a party with one job (``n_jobs=1``) or too little work to ship (a few hundred
    rows), so that the sharded code path is the same everywhere."""

    def __init__(self, name: str = "inline"):
        self.name = name
        self.n_workers = 1
        self.closed = False
        self.cpu_seconds = 0.0
        self._state: dict = {}
        self._slots: dict[str, Any] = {}
        self._lock = threading.RLock()

    def start(self) -> "InlineExecutor":
        if self.closed:
            raise WorkerError(f"executor {self.name!r} is closed")
        return self

    @property
    def started(self) -> bool:
        return not self.closed

    def close(self, kill: bool = False) -> None:
        self.closed = True
        self._state.clear()
        self._slots.clear()

    @property
    def pids(self) -> list[int]:
        return []

    def worker_peaks(self) -> list[dict]:
        return []

    def _slots_valid(self) -> bool:
        return not self.closed            # in this process: valid until closed

    def _run(self, header: dict, blobs: Sequence[bytes]) -> Frame:
        self.start()
        try:
            reply = worker.run(dict(header), list(blobs), self._state)
        except Exception as exc:
            raise WorkerError(f"executor {self.name!r} failed: {type(exc).__name__}: {exc}") from exc
        self.cpu_seconds += float(reply[0].get("cpu", 0.0))
        return reply

    def broadcast(self, header: dict, blobs: Sequence[bytes] = ()) -> list[Frame]:
        with self._lock:
            return [self._run(header, blobs)]

    def map(self, requests: Sequence[Request]) -> list[Frame]:
        with self._lock:
            return [self._run(h, b) for h, b in requests]

    def run_on(self, requests: Sequence[tuple[int, Request]]) -> list[Frame]:
        with self._lock:
            if any(wi != 0 for wi, _ in requests):
                raise WorkerError(f"executor {self.name!r} has one worker")
            return [self._run(h, b) for _, (h, b) in requests]

