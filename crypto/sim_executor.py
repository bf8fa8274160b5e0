"""A many-core model of an executor (issue 24): its tasks *sleep* for their work.

:class:`SimulatedExecutor` has ``n_workers`` simulated workers (16, 64, ... on a 2-core machine).
Each request runs the real worker operation (:func:`crypto.worker.run`, over the simulated
worker's own slots, so the round that drives it is the real one: the gradient stream, the passive
party's intake, the levels) and then sleeps for the rest of the work it did (a task lasts its
counted seconds from its start, the real operation's time included), counted in units and priced by
:class:`SimCosts`: values packed and encrypted, homomorphic additions, values moved into or out of
a slot, values decrypted. The operations run in mode ``plain`` cost little real CPU, so the
sleeps dominate and the model's wall time is the schedule's: whatever keeps workers idle while
others work (a serial part of the drivers, a pipeline too shallow) shows up as wall time above
``work / workers``.

A simulated worker runs its requests one at a time, in the order they reach it, as a worker
process of :class:`crypto.executor.LocalExecutor` does. Work the *driver* does on the executor's
behalf (the combination of partial histograms in :meth:`crypto.executor.Executor.reduce_on` when it
happens in the calling process) sleeps in the calling thread and is counted as
``driver_seconds``: serial by construction.

Counters (for the model's assertions and figures): ``busy`` (simulated seconds per worker),
``units`` (per kind), ``tasks`` (requests run).
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from crypto import worker
from crypto.executor import Executor, Pending, Request, WorkerError, _Lanes
from crypto.framing import Frame


@dataclass(frozen=True)
class SimCosts:
    """Simulated seconds per counted unit of work."""
    encrypt: float = 2e-3      # one value packed and encrypted (pack_encrypt, encrypt)
    add: float = 6e-5          # one homomorphic addition (shard(s)_hist, root_partial, take, combine, compress)
    move: float = 3e-6         # one value written into a slot or read out of one (fill, get)
    decrypt: float = 2e-3      # one value decrypted

    def of(self, header: dict, blobs: Sequence[bytes], reply: Frame) -> tuple[dict, float]:
        """The units of one request and their simulated seconds."""
        op = header.get("op")
        units: dict = {}
        if op == "pack_encrypt":
            n = int(header["n_rows"])
            rows = sum(blobs[2]) if header.get("masked") and len(blobs) > 2 else n
            units["encrypt"] = rows * int(header.get("shifts", 1))
        elif op == "encrypt":
            units["encrypt"] = len(blobs[0]) // max(1, int(header["width"]))
        elif op in ("shard_hist", "shards_hist", "root_partial", "take"):
            units["add"] = int(reply[0].get("additions", 0))
        elif op == "combine":
            w = max(1, int(header["width"]))
            units["add"] = sum(len(b) // w for b in blobs[1:])
        elif op == "compress":
            units["add"] = int(header.get("shift_bits", 1)) * (len(reply[1][0]) if reply[1] else 0)
        elif op == "fill":
            units["move"] = sum(int(c) for _, c in header["segments"])
        elif op == "get":
            units["move"] = len(reply[1][0]) // max(1, int(header["width"])) if reply[1] else 0
        elif op == "decrypt":
            units["decrypt"] = len(reply[1][0]) // max(1, int(header.get("width", 1)) or 1) if reply[1] else 0
        seconds = sum(getattr(self, k) * v for k, v in units.items())
        return units, seconds


class SimulatedExecutor(Executor):
    """``n_workers`` simulated workers whose requests sleep for their counted work (see the module
    doc). Thread-safe; the workers are threads of this process, their slots dicts."""

    def __init__(self, n_workers: int, costs: SimCosts | None = None, name: str = "sim"):
        if int(n_workers) < 1:
            raise ValueError("a simulated executor needs at least one worker")
        self.n_workers = int(n_workers)
        self.costs = costs or SimCosts()
        self.name = name
        self.closed = False
        self.cpu_seconds = 0.0
        self._slots: dict = {}
        self._lock = threading.RLock()
        self._count = threading.Lock()
        self._state = [dict() for _ in range(self.n_workers)]
        self.busy = [0.0] * self.n_workers
        self.units: Counter = Counter()
        self.tasks = 0
        self.driver_seconds = 0.0
        self._lanes: _Lanes | None = None

    # -- lifecycle --------------------------------------------------------
    def start(self) -> "SimulatedExecutor":
        with self._lock:
            if self.closed:
                raise WorkerError(f"executor {self.name!r} is closed")
            if self._lanes is None:
                self._lanes = _Lanes(self.n_workers, self._execute, self.name)
        return self

    @property
    def started(self) -> bool:
        return self._lanes is not None and not self.closed

    def close(self, kill: bool = False) -> None:
        with self._lock:
            self.closed = True
            self._slots.clear()
            if self._lanes is not None:
                self._lanes.stop()

    @property
    def pids(self) -> list[int]:
        return []

    def worker_peaks(self) -> list[dict]:
        return []

    def work_seconds(self) -> float:
        """Simulated seconds of work so far, all workers and the driver's share."""
        return sum(self.busy) + self.driver_seconds

    # -- the simulated workers --------------------------------------------------
    def _charge(self, header: dict, blobs: Sequence[bytes], reply: Frame) -> float:
        units, seconds = self.costs.of(header, blobs, reply)
        with self._count:
            self.units.update(units)
            self.tasks += 1
        return seconds

    @staticmethod
    def _finish(started: float, seconds: float) -> None:
        """Sleep until ``seconds`` after ``started``: a task takes its counted time, the real
        operation's included (a machine under load stretches the real part, not the task)."""
        time.sleep(max(0.0, started + seconds - time.perf_counter()))

    def _execute(self, i: int, header: dict, blobs: Sequence[bytes]) -> Frame:
        started = time.perf_counter()
        reply = worker.run(dict(header), list(blobs), self._state[i])
        seconds = self._charge(header, blobs, reply)
        self._finish(started, seconds)
        with self._count:
            self.busy[i] += seconds
            self.cpu_seconds += float(reply[0].get("cpu", 0.0))
        return reply

    def _run_here(self, header: dict, blobs: Sequence[bytes]) -> Frame:
        started = time.perf_counter()
        reply = worker.run(header, list(blobs), {})
        seconds = self._charge(header, blobs, reply)
        self._finish(started, seconds)
        with self._count:
            self.driver_seconds += seconds
        return reply

    # -- requests ----------------------------------------------------------
    def submit_on(self, requests: Sequence[tuple[int, Request]]) -> Pending:
        self.start()
        for wi, _ in requests:
            if not 0 <= wi < self.n_workers:
                raise WorkerError(f"executor {self.name!r} has no worker {wi}")
        return Pending([self._lanes.submit(wi, h, b) for wi, (h, b) in requests])

    def run_on(self, requests: Sequence[tuple[int, Request]]) -> list[Frame]:
        return self.submit_on(requests).result() if requests else []

    def broadcast(self, header: dict, blobs: Sequence[bytes] = ()) -> list[Frame]:
        return self.run_on([(wi, (header, blobs)) for wi in range(self.n_workers)])

    def map(self, requests: Sequence[Request]) -> list[Frame]:
        self.start()
        return Pending([self._lanes.submit(None, h, b) for h, b in requests]).result()
