"""Worker processes for the ciphertext kernels: every core, no re-shipping.

A :class:`WorkerPool` runs ``n_workers`` child processes (``python -m
crypto.worker``), each a loop that reads one request frame from its stdin
and writes one reply frame to its stdout. Big objects are *shared* once into
named slots of every worker (:meth:`WorkerPool.share`): the ciphertext vector
of a round, a party's bin matrix, an encryption key's tables. Later requests
name the slot, so a histogram request ships only row indices, never the
ciphertexts again. A slot remembers which local object it holds; sharing the
same object again is free, sharing a new one (next round) replaces it.

Why child processes started with ``subprocess`` rather than ``fork``: a
forked copy of a process that runs threads (a gRPC server, BLAS) may
deadlock, Python 3.12+ warns about it, and a spawned ``multiprocessing``
child re-imports the user's ``__main__``. A plain child process that imports
only ``gmpy2`` (and numpy for histograms) has none of these problems; it
costs ~0.1 s once per pool.

Lifetime: a pool belongs to one party object and is closed by it (end of
training, errors), by garbage collection, or at interpreter exit. A worker
exits on its own when its stdin closes, so a killed parent leaves no orphan
beyond the request in flight. Frames are a JSON header and raw byte blobs (never pickle); all
processes belong to the same party.
"""
from __future__ import annotations

import atexit
import json
import os
import selectors
import struct
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any, Sequence

from datasets.errors import InputError, VFLError

_HDR = struct.Struct("<I")
_SIZE = struct.Struct("<Q")
_ROOT = str(Path(__file__).resolve().parents[1])

#: peak resident memory (kB) of every worker process at the time its pool closed
WORKER_PEAKS: list[dict] = []


class WorkerError(VFLError, RuntimeError):
    """A worker process failed (its traceback is in the message) or died."""


MAX_WORKERS = 256


def default_workers() -> int:
    """Worker processes to use: ``VFL_N_JOBS`` if set (0: all cores), else the cores this
    process may run on."""
    env = os.environ.get("VFL_N_JOBS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise InputError(f"environment variable VFL_N_JOBS must be an integer, got {env!r}") from None
        if not 0 <= n <= MAX_WORKERS:
            raise InputError(f"environment variable VFL_N_JOBS must be from 0 to {MAX_WORKERS}, got {n}")
        if n:
            return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:       # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def resolve_workers(n_jobs: int | None) -> int:
    """``None`` or ``0``: the default (see :func:`default_workers`); else ``n_jobs`` processes
    (``1``: everything runs in the calling process)."""
    if n_jobs is None:
        return default_workers()
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or not 0 <= n_jobs <= MAX_WORKERS:
        raise InputError(f"n_jobs must be an integer from 0 (all cores) to {MAX_WORKERS}, got {n_jobs!r}")
    return n_jobs or default_workers()


# --- frames -----------------------------------------------------------------
def encode_frame(header: dict, blobs: Sequence[bytes] = ()) -> list[bytes]:
    header = dict(header, _blobs=[len(b) for b in blobs])
    h = json.dumps(header, separators=(",", ":")).encode()
    return [_HDR.pack(len(h)), h, *blobs]


def _read_exact(stream, n: int) -> bytes:
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError("stream closed")
    return data


def read_frame(stream) -> tuple[dict, list[bytes]]:
    (hl,) = _HDR.unpack(_read_exact(stream, _HDR.size))
    header = json.loads(_read_exact(stream, hl))
    blobs = [_read_exact(stream, s) if s else b"" for s in header.pop("_blobs", [])]
    return header, blobs


def write_frame(stream, header: dict, blobs: Sequence[bytes] = ()) -> None:
    for part in encode_frame(header, blobs):
        stream.write(part)
    stream.flush()


# --- the pool -----------------------------------------------------------------
class _Worker:
    __slots__ = ("proc", "busy", "task")

    def __init__(self, proc):
        self.proc = proc
        self.busy = False
        self.task = None


def _shutdown(workers: list, name: str, kill: list) -> None:
    """Close stdin of every worker and wait for it (kill it at once if ``kill[0]``, or after
    5 s); idempotent."""
    for w in workers:
        if w.proc.poll() is None:
            del WORKER_PEAKS[:-999]
            WORKER_PEAKS.append({"pool": name, "pid": w.proc.pid, "peak_kb": _peak_kb(w.proc.pid)})
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


_LIVE: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_LIVE):
        pool.close()


def _peak_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class WorkerPool:
    """``n_workers`` worker processes with named shared slots; thread-safe, started lazily."""

    def __init__(self, n_workers: int | None = None, name: str = "pool"):
        self.n_workers = resolve_workers(n_workers)
        self.name = name
        self._workers: list[_Worker] = []
        self._slots: dict[str, Any] = {}          # slot -> local object it holds
        self._lock = threading.RLock()
        self._finalizer = None
        self.closed = False
        self.cpu_seconds = 0.0                    # CPU time the workers reported, all requests

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
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self.name, self._kill)
        _LIVE.add(self)

    def start(self) -> "WorkerPool":
        """Start the processes now (non-blocking: they import while the caller works on)."""
        with self._lock:
            self._start()
        return self

    @property
    def started(self) -> bool:
        return bool(self._workers)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def close(self, kill: bool = False) -> None:
        """Stop every worker (idempotent): let it finish its request, or ``kill`` it now.
        A closed pool cannot be used again."""
        with self._lock:
            self.closed = True
            if kill and self._workers:
                self._kill[0] = True
            self._slots.clear()
            if self._finalizer is not None:
                self._finalizer()
            self._workers = []
            _LIVE.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- shared slots -------------------------------------------------------
    def holds(self, slot: str, obj) -> bool:
        return self._slots.get(slot) is obj and self.started

    def share(self, slot: str, obj, header: dict, blobs: Sequence[bytes] = (), op: str = "put") -> None:
        """Send ``obj`` (encoded as ``header``/``blobs``) to slot ``slot`` of every worker,
        unless the slot already holds this very object."""
        with self._lock:
            if self.holds(slot, obj):
                return
            self._slots.pop(slot, None)
            self.broadcast(dict(header, op=op, slot=slot), blobs)
            self._slots[slot] = obj

    def share_lazy(self, slot: str, obj, encode) -> None:
        """Like :meth:`share`, calling ``encode() -> (header, blobs)`` only when needed."""
        with self._lock:
            if not self.holds(slot, obj):
                header, blobs = encode()
                self.share(slot, obj, header, blobs)

    # -- requests ----------------------------------------------------------
    def broadcast(self, header: dict, blobs: Sequence[bytes] = ()) -> list[tuple[dict, list[bytes]]]:
        """The same request to every worker; their replies in worker order."""
        with self._lock:
            self._start()
            frame = encode_frame(header, blobs)
            try:
                for w in self._workers:
                    self._send(w, frame)
                return [self._receive(w) for w in self._workers]
            except BaseException:
                self.close(kill=True)
                raise

    def map(self, requests: Sequence[tuple[dict, Sequence[bytes]]]) -> list[tuple[dict, list[bytes]]]:
        """Run independent requests on whichever worker is free (largest first is the
        caller's job: requests start in the given order). Replies in request order."""
        with self._lock:
            if not requests:
                return []
            self._start()
            results: list = [None] * len(requests)
            pending = list(range(len(requests)))[::-1]
            sel = selectors.DefaultSelector()
            try:
                busy = 0
                for w in self._workers:
                    if not pending:
                        break
                    i = pending.pop()
                    self._send(w, encode_frame(*requests[i]))
                    w.task = i
                    sel.register(w.proc.stdout, selectors.EVENT_READ, w)
                    busy += 1
                while busy:
                    for key, _ in sel.select():
                        w = key.data
                        results[w.task] = self._receive(w)
                        if pending:
                            i = pending.pop()
                            self._send(w, encode_frame(*requests[i]))
                            w.task = i
                        else:
                            sel.unregister(w.proc.stdout)
                            w.task = None
                            busy -= 1
            except BaseException:
                sel.close()
                self.close(kill=True)
                raise
            sel.close()
            return results

    def _send(self, w: _Worker, frame: list[bytes]) -> None:
        try:
            for part in frame:
                w.proc.stdin.write(part)
            w.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(f"worker {w.proc.pid} of pool {self.name!r} died ({exc})") from None

    def _receive(self, w: _Worker) -> tuple[dict, list[bytes]]:
        try:
            header, blobs = read_frame(w.proc.stdout)
        except (EOFError, OSError, ValueError):
            code = w.proc.poll()
            raise WorkerError(f"worker {w.proc.pid} of pool {self.name!r} died (exit code {code})") from None
        if header.get("error"):
            raise WorkerError(f"worker {w.proc.pid} of pool {self.name!r} failed:\n{header['error']}")
        self.cpu_seconds += float(header.get("cpu", 0.0))
        return header, blobs
