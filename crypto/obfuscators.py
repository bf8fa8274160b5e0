"""Precomputed Paillier randomness: fresh obfuscators made ahead of use.

Encrypting ``m`` is ``(1 + m n) * r^n mod n^2``; the expensive part, ``r^n`` (``hs^a`` with
the ``fast`` method), does not depend on ``m``. The key holder makes obfuscators while it
would otherwise wait (before training, while the passive parties build histograms and apply
splits, between trees) and then encrypts a round with one multiplication per value.

:class:`StockKeeper` does it: every executor worker (a local worker process, a Dask worker, or
the driver itself for the inline executor) keeps a stock of obfuscators of the current key in
its own memory (:class:`crypto.paillier.ObfuscatorStock`), filled by small ``obf_fill``
requests that the keeper's background thread sends only while the party waits for its peers
(:meth:`StockKeeper.waiting`; on an executor whose requests cost scheduling time, Dask, the
requests grow to about its ``task_seconds`` of work). A round's ``pack_encrypt`` takes from the worker's stock and
makes the rest on the spot, counting both. Each obfuscator is handed out once, never leaves
the process that made it (the only bytes are the tiny requests) and is never written anywhere.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager

import gmpy2

from crypto.executor import InlineExecutor
from crypto.intcodec import int_width

log = logging.getLogger("vfl.crypto")

# --- per-worker stocks, filled while the party waits ----------------------------------
#: obfuscators per worker and fill request: the most a foreground request waits for (about
#: 0.1 ms each at 2048 bits, so ~3 ms in the driver and ~6 ms on a worker process)
FILL_BATCH_INLINE = 32
FILL_BATCH_WORKER = 64
#: the largest fill request, in obfuscators per worker
MAX_FILL_BATCH = 16384
#: rounds of values each worker keeps ahead (its last round's values times this)
ROUNDS_AHEAD = 1.5
#: bytes of obfuscators one worker may hold
MAX_STOCK_BYTES = 64 << 20


class _Filler:
    """A background thread that fills a stock while its party waits (``_run``, written by each
    subclass, sleeps on ``_cond`` and stops once ``_stop`` is set): started once, stopped by
    :meth:`close` (which waits for the batch in flight)."""

    THREAD_NAME = "filler"

    def _init_thread(self) -> None:
        self._stop = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def start(self):
        if self._thread is None and not self._stop:
            self._thread = threading.Thread(target=self._run, name=self.THREAD_NAME, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop the background thread (waits for the batch in flight)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None


class StockKeeper(_Filler):
    """Keeps every worker's stock of one key's obfuscators near its target, in the background,
    only while the party waits for its peers (:meth:`waiting`).

    Targets follow the rounds (:meth:`plan`: the values each worker encrypted last round, times
    :data:`ROUNDS_AHEAD`, capped at :data:`MAX_STOCK_BYTES`). Counters: ``made`` (by the
    background fill), ``from_stock`` and ``on_spot`` (what rounds' encryptions took from the
    stocks and made themselves, :meth:`note_round`), ``background_seconds``. Seconds of
    background fill are added to the current round's timing as stage ``obfuscate_bg``
    (:attr:`timing`), or to ``before_training_seconds`` before the first round."""

    THREAD_NAME = "obfuscator-stock"
    SLOT = "encryptor"

    def __init__(self, executor, encryptor, max_bytes: int = MAX_STOCK_BYTES, batch: int | None = None):
        self.executor = executor
        self.encryptor = encryptor
        self.cap = max(1, int(max_bytes) // int_width(encryptor.cipher_modulus))
        inline = isinstance(executor, InlineExecutor)
        self.batch = int(batch or (FILL_BATCH_INLINE if inline else FILL_BATCH_WORKER))
        # an executor whose requests cost milliseconds of scheduling (Dask: the scheduler, the
        # client and the worker each spend CPU per task) asks for about that long a batch: the
        # batch doubles (or halves) until one fill request takes about ``task_seconds``
        self.task_seconds = float(getattr(executor, "task_seconds", 0.0) or 0.0)
        self._min_batch = self.batch
        self.targets = [0] * executor.n_workers
        self._full = [True] * executor.n_workers
        self._waiting = 0
        self._init_thread()
        self.timing = None
        self.made = self.from_stock = self.on_spot = self.batches = 0
        self.background_seconds = self.before_training_seconds = 0.0
        self.error: BaseException | None = None

    # -- what to keep -------------------------------------------------------------
    def plan(self, per_worker) -> None:
        """Keep about :data:`ROUNDS_AHEAD` times ``per_worker[i]`` obfuscators on worker ``i``."""
        with self._cond:
            n = len(self.targets)
            vals = [0] * n
            for i, v in enumerate(list(per_worker)[:n]):
                vals[i] = int(v)
            self.targets = [min(self.cap, int(ROUNDS_AHEAD * v)) for v in vals]
            self._full = [t <= 0 for t in self.targets]
            self._cond.notify_all()

    def note_round(self, counts: dict) -> None:
        """A round's encryption took ``counts["from_stock"]`` and made ``counts["on_spot"]``."""
        with self._cond:
            self.from_stock += int(counts.get("from_stock", 0))
            self.on_spot += int(counts.get("on_spot", 0))
            self._full = [t <= 0 for t in self.targets]      # the stocks were drawn on
            self._cond.notify_all()

    # -- when ---------------------------------------------------------------------------
    @contextmanager
    def waiting(self):
        """The party waits for its peers: fill in the background until the block ends (the
        batch in flight then finishes: a foreground request waits for one batch at most)."""
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._waiting -= 1

    def _short(self) -> list[int]:
        return [i for i, full in enumerate(self._full) if not full]

    def _run(self) -> None:
        enc, ex = self.encryptor, self.executor
        while True:
            with self._cond:
                while not self._stop and not (self._waiting and self._short()):
                    self._cond.wait()
                if self._stop:
                    return
                reqs = [(i, ({"op": "obf_fill", "slot": self.SLOT, "count": self.batch, "target": self.targets[i]},
                             [])) for i in self._short()]
            t0 = time.perf_counter()
            try:
                ex.share(self.SLOT, enc, {"kind": "encryptor", "state": enc.state()})
                replies = ex.run_on(reqs)
            except Exception as exc:      # the foreground notices a broken executor itself
                if not self._stop:
                    self.error = exc
                    log.warning("background obfuscators stopped: %s", exc)
                return
            dt = time.perf_counter() - t0
            with self._cond:
                for (i, (req, _)), (h, _) in zip(reqs, replies):
                    self.made += int(h.get("added", 0))
                    if int(h.get("stock", 0)) >= req["target"] or not int(h.get("added", 0)):
                        self._full[i] = True
                self.batches += 1
                self.background_seconds += dt
                self._resize(dt)
                timing = self.timing
                if timing is None:
                    self.before_training_seconds += dt
            if timing is not None:
                timing.add("obfuscate_bg", dt)

    def _resize(self, seconds: float) -> None:
        """Fit the next batch to the executor's ``task_seconds`` (a batch that took ``seconds``)."""
        if self.task_seconds <= 0:
            return
        if seconds < self.task_seconds / 2:
            self.batch = min(MAX_FILL_BATCH, 2 * self.batch)
        elif seconds > 2 * self.task_seconds:
            self.batch = max(self._min_batch, self.batch // 2)

    def worker_stats(self) -> list[dict]:
        """Every worker's stock counters (``stock``, ``made``, ``taken``), from the workers."""
        return [h for h, _ in self.executor.broadcast({"op": "obf_stats", "slot": self.SLOT})]

    def stats(self) -> dict:
        return {"made": self.made, "from_stock": self.from_stock, "on_spot": self.on_spot,
                "batches": self.batches, "background_seconds": round(self.background_seconds, 3),
                "before_training_seconds": round(self.before_training_seconds, 3)}


# --- the passive party: re-randomising its replies (issue 22) --------------------------
#: obfuscators a passive party makes per background batch (each a full r^n: ~8 ms at 2048 bits)
REPLY_FILL_BATCH = 4
#: obfuscators a passive party makes ahead of its first reply, while the key holder encrypts the
#: first gradients (a reply of default_credit's 10 features at 2048 bits holds ~8 ciphertexts)
REPLY_PREFILL = 32


class ReplyRandomizer(_Filler):
    """A passive party's re-randomisation of the ciphertexts it returns (issue 22, Build 4).

    Without it a histogram reply is the product of the key holder's own ciphertexts, which lets
    the key holder confirm a guessed bin membership exactly. Every returned ciphertext is
    multiplied by a fresh obfuscator of the key holder's public key made from this party's own
    uniform randomness (``encryptor.rerandomize`` of :func:`crypto.schemes.reply_encryptor`:
    ``r^n``, never a base the key holder chose, issue 31). The obfuscators come from the party's
    own stock (``encryptor.stock``), filled by a background thread only while the party waits for
    the next request (:meth:`busy` marks a request being served): ``prefill`` of them before the
    first reply, then about :data:`ROUNDS_AHEAD` times the last reply's size; the rest are made on
    the spot. The thread lets gmpy2 release the GIL during its exponentiations.

    Counters (for the lead's cost measurement): ``count`` ciphertexts re-randomised,
    ``from_stock``/``on_spot``, ``seconds`` spent re-randomising in the foreground,
    ``background_seconds`` spent filling the stock."""

    THREAD_NAME = "reply-obfuscators"

    def __init__(self, encryptor, max_bytes: int = MAX_STOCK_BYTES, batch: int = REPLY_FILL_BATCH,
                 prefill: int = REPLY_PREFILL):
        self.encryptor = encryptor
        self.cap = max(1, int(max_bytes) // int_width(encryptor.cipher_modulus))
        self.batch = int(batch)
        self.target = min(self.cap, max(0, int(prefill)))
        self.count = self.from_stock = self.on_spot = 0
        self.seconds = self.background_seconds = 0.0
        self._reported_bg = 0.0
        self._busy = 0
        self._init_thread()

    @contextmanager
    def busy(self):
        """A request is being served: no background fill until it ends."""
        with self._cond:
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def rerandomize(self, ciphertexts) -> list:
        """Every ciphertext times a fresh obfuscator; the stock's target follows the reply sizes."""
        t0 = time.perf_counter()
        out, k, spot = self.encryptor.rerandomize(ciphertexts)
        dt = time.perf_counter() - t0
        with self._cond:
            self.count += len(out)
            self.from_stock += k
            self.on_spot += spot
            self.seconds += dt
            self.target = min(self.cap, int(ROUNDS_AHEAD * len(out)))
            self._cond.notify_all()
        return out

    def background_since_last(self) -> float:
        """Seconds of background fill since the last call (reported with each reply)."""
        with self._cond:
            dt, self._reported_bg = self.background_seconds - self._reported_bg, self.background_seconds
        return dt

    def _run(self) -> None:
        gmpy2.get_context().allow_release_gil = True       # this thread's context only
        stock = self.encryptor.stock
        while True:
            with self._cond:
                while not self._stop and (self._busy or len(stock) >= self.target):
                    self._cond.wait()
                if self._stop:
                    return
                want = min(self.batch, self.target - len(stock))
            t0 = time.perf_counter()
            stock.fill(want, self.target)
            with self._cond:
                self.background_seconds += time.perf_counter() - t0

    def close(self) -> None:
        super().close()
        self.encryptor.stock.clear()

    def stats(self) -> dict:
        with self._cond:
            return {"count": self.count, "from_stock": self.from_stock, "on_spot": self.on_spot,
                    "seconds": round(self.seconds, 6), "background_seconds": round(self.background_seconds, 6),
                    "stock": len(self.encryptor.stock)}
