"""Precomputed Paillier randomness: a store of fresh obfuscators made ahead of use.

Encrypting ``m`` is ``(1 + m n) * r^n mod n^2``; the expensive part, ``r^n`` (``hs^a`` with
the ``fast`` method), does not depend on ``m``. The key holder can make obfuscators while it
would otherwise wait (before training, while the passive parties build histograms, between
trees) and then encrypt a round with one multiplication per value
(:meth:`crypto.paillier.Encryptor.encrypt_with`).

The store's rules:

* **Each obfuscator is handed out once.** :meth:`ObfuscatorStore.take` removes what it returns;
  the store keeps no other reference, and counts what it produced and handed out so a test
  can check that the two never overlap.
* **Never on disk.** Obfuscators live in this process's memory only (and, while being made,
  in the executor's worker processes, which return them and keep nothing).
* **Sized by the rounds.** :meth:`ObfuscatorStore.plan` takes the values a round encrypts;
  the background filler keeps that many plus one round ahead, never more than ``max_items``.
* **Short of stock, make on the spot.** A ``take`` larger than the stock makes the rest
  immediately (on the executor when one is given) and counts it as made on the critical path.

The background filler runs in a thread and asks the executor for small batches
(:data:`BATCH_PER_WORKER` per worker), so a foreground request (a decryption, a round's
encryption) waits for one batch at most. Without an executor it does nothing: making
obfuscators in the driver would hold the GIL the party needs.
"""
from __future__ import annotations

import threading
import time
from collections import deque

from crypto.intcodec import bytes_to_ints, int_width

#: obfuscators per worker and background request (a few milliseconds of work at 2048 bits)
BATCH_PER_WORKER = 64


class ObfuscatorStore:
    """Fresh obfuscators for one key, made ahead of use, each handed out once."""

    def __init__(self, encryptor, executor=None, max_items: int = 1 << 21):
        self.encryptor = encryptor
        self.executor = executor
        self.max_items = int(max_items)
        self._items: deque = deque()
        self._lock = threading.Lock()
        self._target = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.produced = 0            # made in all (background + on demand)
        self.taken = 0               # handed out
        self.on_demand = 0           # made inside take() because the stock was short
        self.background_seconds = 0.0
        self.error: BaseException | None = None      # what stopped the background filler

    # -- sizing ---------------------------------------------------------------
    def plan(self, per_round: int) -> None:
        """Keep enough for two rounds of ``per_round`` values (capped at ``max_items``)."""
        self._target = min(self.max_items, 2 * int(per_round))
        self._wake.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    # -- making -----------------------------------------------------------------
    def _make(self, count: int, in_driver: bool = True) -> list:
        ex = self.executor
        if ex is None or (in_driver and count < 2 * BATCH_PER_WORKER):
            return self.encryptor.obfuscators(count)
        enc = self.encryptor
        ex.share("encryptor", enc, {"kind": "encryptor", "state": enc.state()})
        n_chunks = max(1, min(-(-count // BATCH_PER_WORKER), 4 * ex.n_workers))
        step = -(-count // n_chunks)
        sizes = [min(step, count - i) for i in range(0, count, step)]
        replies = ex.map([({"op": "obfuscate", "slot": "encryptor", "count": s}, []) for s in sizes])
        w2 = int_width(enc.nsquare)
        return [v for _, blobs in replies for v in bytes_to_ints(blobs[0], w2)]

    def fill(self, count: int, in_driver: bool = True) -> None:
        """Make ``count`` more now (blocking; small counts in this process unless ``in_driver`` is false)."""
        made = self._make(int(count), in_driver)
        with self._lock:
            self._items.extend(made)
            self.produced += len(made)

    def take(self, count: int) -> list:
        """``count`` obfuscators, removed from the store (made on the spot if it runs short)."""
        count = int(count)
        if self.error is not None:
            raise self.error
        with self._lock:
            k = min(count, len(self._items))
            out = [self._items.popleft() for _ in range(k)]
        if k < count:
            extra = self._make(count - k)
            with self._lock:
                self.produced += len(extra)
                self.on_demand += len(extra)
            out.extend(extra)
        with self._lock:
            self.taken += len(out)
        self._wake.set()
        return out

    # -- the background filler ---------------------------------------------------
    def start(self) -> "ObfuscatorStore":
        """Fill towards the planned size in a background thread (needs an executor)."""
        if self.executor is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="obfuscators", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        ex = self.executor
        while not self._stop.is_set():
            short = self._target - len(self)
            if short <= 0:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            batch = min(short, BATCH_PER_WORKER * max(1, ex.n_workers))
            t0 = time.perf_counter()
            try:
                self.fill(batch, in_driver=False)
            except Exception as exc:    # reported by the next take(), unless we are closing
                if not self._stop.is_set():
                    self.error = exc
                return
            self.background_seconds += time.perf_counter() - t0

    def close(self) -> None:
        """Stop the filler and drop every obfuscator not handed out."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            self._items.clear()

    def stats(self) -> dict:
        return {"produced": self.produced, "taken": self.taken, "on_demand": self.on_demand,
                "stock": len(self), "background_seconds": round(self.background_seconds, 3)}
