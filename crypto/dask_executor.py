"""A party's ciphertext work on its own Dask cluster (``pip install '.[dask]'``; issue 11).

:class:`DaskExecutor` implements :class:`crypto.executor.Executor` over a
``distributed`` client: every request is one Dask task running the same
operations as a local worker process (:func:`crypto.worker.run`), over slots
kept in the Dask worker process under this executor's private namespace (so two
executors of the same party, or tests sharing a cluster, never see each other's
slots). Tasks carry plain data only: a JSON-able header and ``bytes`` blobs
(fixed-width integers, numpy buffers); Dask's own pickling moves them between
the party's driver and its workers, never between parties.

* ``share``/``broadcast``: one task pinned to each worker.
* ``run_on``: one task pinned to the worker holding the shard (``workers=[address]``,
  ``allow_other_workers=False``); payloads above 1 MB are ``scatter``-ed to that worker first.
* Payloads and results travel between the driver and the workers directly
  (``direct_to_workers``), not through the scheduler: it carries task metadata only.
* ``reduce_on``: pinned partial tasks, then pairwise ``combine`` tasks on the workers (a tree
  reduction); only the final sum comes back to the driver.
* ``map``: unpinned tasks (the slots they read are on every worker).

Faults: a worker that leaves while tasks wait on it (killed, lost) is noticed
within a second (the scheduler's worker list is polled while waiting) and raises
:class:`crypto.executor.WorkerError` naming the executor (the party) and the
worker's address; a task lost with its worker (restarted by a nanny) and a failing
task raise it too, and a scheduler that goes (killed) raises one line naming it, not
Dask's list of cancelled futures. A scheduler that refuses connections is reported
at once (a TCP probe before the client's own wait). Either way the
executor forgets its connection and slots (the shards on the lost worker are
gone, so the training stops) and reconnects at the next request, seeing the
workers alive then: ``--resume`` continues the training on the same executor.

Security: a party's cluster carries its plaintext data (features, gradients);
it must be private to the party. Remote schedulers are reached over TLS
(:func:`security_from_dir`); a plain ``tcp://`` scheduler is refused unless the
caller passes ``insecure=True`` (``--dask-insecure``). ``local:N`` starts a
``LocalCluster`` of N single-threaded worker processes on loopback with the
dashboard off, owned (and closed) by the executor, over TLS with a temporary
security context (``Security.temporary()``: a fresh CA and certificate in memory; issue 22).
Key material (the key holder's private key in an encryptor or decryptor) is shipped to the
workers only through a scheduler reached over TLS, unless ``insecure=True``
(:meth:`DaskExecutor.share`).
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

import dask
import distributed
from distributed import Client, LocalCluster
from distributed.security import Security

from crypto import worker
from crypto.executor import Executor, Pending, Request, WorkerError
from crypto.framing import Frame
from datasets.errors import InputError

#: seconds between checks of the scheduler's worker list while waiting for tasks
POLL_SECONDS = 1.0
#: seconds a batch of finished results may take to arrive before the workers are checked again
FETCH_SECONDS = 10.0
#: Dask settings for a cluster that runs CPU-bound crypto tasks: no statistical profiler (it samples
#: every thread of a worker every 10 ms), and the event-loop watchdog and system monitor woken
#: less often (20 ms and 500 ms by default). The local clusters this module starts use them; give
#: your own ``dask scheduler`` and ``dask worker`` processes :func:`lean_environment`.
LEAN_CONFIG = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "200ms",
               "distributed.admin.system-monitor.interval": "2s"}


def lean_environment() -> dict[str, str]:
    """:data:`LEAN_CONFIG` as the ``DASK_*`` environment variables Dask reads at start."""
    return {"DASK_" + k.upper().replace(".", "__").replace("-", "_"): str(v) for k, v in LEAN_CONFIG.items()}


#: payloads (bytes) above which a pinned task's blobs are scattered to its worker first
SCATTER_BYTES = 1 << 20
#: seconds to wait for a scheduler to accept a TCP connection before the client's own (long) wait
PROBE_SECONDS = 5.0
#: seconds :meth:`DaskExecutor.close` waits for a request in flight before closing under it
CLOSE_WAIT_SECONDS = 5.0


def _first_line(exc: BaseException) -> str:
    """``Name: first line`` of an exception (Dask's cancellations list every future, one a line)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def probe_scheduler(address: str, timeout: float = PROBE_SECONDS) -> str | None:
    """Why a scheduler at ``tcp://`` / ``tls://`` ``address`` cannot be reached at once (connection
    refused, no such host), or None (it accepts connections, or did not answer within ``timeout``:
    then the client's own wait decides)."""
    parts = urlsplit(address)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return f"bad address {address!r}"
    if not host or port is None:
        return None
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.timeout:
        return None
    except ConnectionRefusedError:
        return "connection refused: is the scheduler running there?"
    except OSError as exc:
        return f"{exc.strerror or exc}"
    return None

_NAMESPACES: dict[str, dict] = {}      # in each Dask worker process: namespace -> slots
_NS_LOCK = threading.Lock()


def _slots(ns: str) -> dict:
    with _NS_LOCK:
        return _NAMESPACES.setdefault(ns, {})


def _task(ns: str, header: dict, blobs, after=None) -> Frame:
    """One request on a Dask worker, over the slots of namespace ``ns``; ``after``: the previous
    pinned task of the same worker (a dependency: Dask then runs them in order)."""
    return worker.run(dict(header), list(blobs), _slots(ns))


def _combine_task(header: dict, a: Frame, b: Frame) -> Frame:
    """Sum two partial replies (the tree reduction of :meth:`DaskExecutor.reduce_on`)."""
    h, out = worker.run(dict(header), [a[1][0], b[1][0]], {})
    return {"additions": int(a[0].get("additions", 0)) + int(b[0].get("additions", 0)),
            "cpu": float(a[0].get("cpu", 0.0)) + float(b[0].get("cpu", 0.0)) + h.get("cpu", 0.0)}, out


def _drop_namespace(ns: str) -> int:
    with _NS_LOCK:
        _NAMESPACES.pop(ns, None)
    return os.getpid()


def _peak_kb() -> dict:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return {"pid": os.getpid(), "peak_kb": int(line.split()[1])}
    except OSError:
        pass
    return {"pid": os.getpid(), "peak_kb": None}


def security_from_dir(tls_dir, party: str | None = None) -> Security:
    """Dask TLS settings from a certificate directory: ``ca.pem`` and the party's ``NAME.pem`` /
    ``NAME.key`` (as ``vfl certs`` writes them), else ``cert.pem`` / ``key.pem``."""
    d = Path(tls_dir)
    ca = d / "ca.pem"
    pairs = ([(d / f"{party}.pem", d / f"{party}.key")] if party else []) + [(d / "cert.pem", d / "key.pem")]
    found = next(((c, k) for c, k in pairs if c.is_file() and k.is_file()), None)
    if not ca.is_file() or found is None:
        want = " or ".join(f"{c.name}/{k.name}" for c, k in pairs)
        raise InputError(f"--dask-tls-dir {d}: needs ca.pem and {want}")
    cert, key = found
    return Security(tls_ca_file=str(ca), tls_client_cert=str(cert), tls_client_key=str(key),
                    tls_scheduler_cert=str(cert), tls_scheduler_key=str(key),
                    tls_worker_cert=str(cert), tls_worker_key=str(key), require_encryption=True)


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``"local:N"`` -> ``("local", N)``; a scheduler address -> ``(address, None)``. The worker
    count of a local cluster is required (``local`` or ``local:`` alone is refused: the number of
    worker processes is the user's choice, not a silent default)."""
    spec = str(spec).strip()
    if spec == "local" or spec.startswith("local:"):
        _, _, n = spec.partition(":")
        if not n.strip():
            raise InputError(f"--dask {spec!r}: give the number of local workers, local:N (e.g. local:2)")
        try:
            k = int(n)
        except ValueError:
            raise InputError(f"--dask {spec!r}: expected local:N with N the number of workers") from None
        if not 1 <= k <= 256:
            raise InputError(f"--dask {spec!r}: the number of local workers must be 1..256")
        return "local", k
    if "://" not in spec:
        raise InputError(f"Dask scheduler {spec!r}: give an address such as tls://host:8786 (or local:N)")
    return spec, None


class _DaskPending(Pending):
    """Submitted Dask tasks: :meth:`result` gathers them (noticing a lost worker)."""

    def __init__(self, executor: "DaskExecutor", futures: list, watch: Sequence[int],
                 pinned: Sequence[int] | None = None):
        super().__init__(futures)
        self.executor, self.watch, self.pinned = executor, list(watch), pinned

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def result(self) -> list[Frame]:
        return self.executor._gather(self.futures, self.watch, self.pinned)


class DaskExecutor(Executor):
    """A party's executor over a Dask cluster (see the module docstring).

    ``scheduler``: ``"local:N"`` (a private ``LocalCluster`` of ``N`` processes) or an address
    (``tls://host:8786``; ``tcp://`` only with ``insecure=True``). ``security``: a Dask
    ``Security`` (or ``tls_dir``, see :func:`security_from_dir`). ``n_workers``: wait for that
    many workers at start (default: those connected, at least one). ``direct``: the driver sends
    payloads to and takes results from the workers directly (the default: the scheduler then
    carries only task metadata); ``False`` relays them through the scheduler, for a driver that
    can reach the scheduler but not the workers."""

    #: a task costs the scheduler, the client and the worker about a millisecond of CPU each:
    #: background requests (obfuscator fills) carry about 0.1 s of work
    task_seconds = 0.1
    #: what a lost worker's or scheduler's error tells the user to do (a simulation, which cannot
    #: resume, says "run the simulation again")
    advice = "resume the training (--resume)"

    def __init__(self, scheduler: str = "local:2", *, name: str = "dask", security: Security | None = None,
                 tls_dir=None, insecure: bool = False, n_workers: int | None = None,
                 timeout: float = 60.0, direct: bool = True):
        self.name = str(name)
        self.direct = bool(direct)
        self.spec, local = parse_spec(scheduler)
        self._local_workers = local
        if local is None:
            if tls_dir is not None and security is None:
                security = security_from_dir(tls_dir, name.split(":")[-1])
            if self.spec.startswith("tls://") and security is None:
                raise InputError(f"Dask scheduler {self.spec}: TLS needs certificates (--dask-tls-dir DIR)")
            if not self.spec.startswith("tls://") and not insecure:
                raise InputError(f"Dask scheduler {self.spec} is not TLS: a party's cluster carries its plaintext "
                                 "data; use tls://... with --dask-tls-dir, or --dask-insecure on a private network")
        elif security is None:      # a local cluster speaks TLS too: a throwaway CA and certificate, in memory
            try:
                security = Security.temporary()
            except ImportError:
                if not insecure:
                    raise InputError("--dask local:N runs its cluster over TLS, which needs the 'cryptography' "
                                     "package (pip install '.[net]'); or give --dask-insecure") from None
        self.security = security
        self.insecure = bool(insecure)
        self.timeout = float(timeout)
        self._want = n_workers if n_workers is not None else local
        self._client: Client | None = None
        self._cluster = None
        self._addresses: list[str] = []
        self._ns = f"{self.name}-{secrets.token_hex(6)}"
        self._slots: dict = {}
        self._lock = threading.RLock()
        self.closed = False
        self.cpu_seconds = 0.0
        self._peaks: list[dict] = []
        self._last: dict = {}          # worker index -> its last pinned task

    # -- lifecycle --------------------------------------------------------
    def _start(self) -> None:
        if self.closed:
            raise WorkerError(f"Dask executor {self.name!r} is closed")
        if self._client is not None:
            return
        try:
            if self._local_workers is not None:
                if self._cluster is None:
                    # a worker killed under a local cluster: its nanny's restart, cut short when the run ends,
                    # is logged as a traceback (and the stray process reaped at exit): the Error line says it
                    logging.getLogger("distributed.process").setLevel(logging.ERROR)
                    with dask.config.set(LEAN_CONFIG):      # the scheduler and worker processes start with it
                        self._cluster = LocalCluster(
                            n_workers=self._local_workers, threads_per_worker=1, processes=True,
                            host="127.0.0.1", dashboard_address=None, silence_logs=logging.CRITICAL,
                            security=self.security,
                            # no dashboard; the scheduler's health endpoint on a free
                            # loopback port (not 8787, which another cluster may hold)
                            scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"})
                self._client = Client(self._cluster, security=self.security, timeout=self.timeout,
                                      direct_to_workers=self.direct)
            else:
                why = probe_scheduler(self.spec, min(PROBE_SECONDS, self.timeout))
                if why is not None:        # refused at once: reported at once, not after the client's timeout
                    raise WorkerError(f"Dask cluster of {self.name!r} at {self.spec}: cannot connect ({why})")
                self._client = Client(self.spec, security=self.security, timeout=self.timeout,
                                      direct_to_workers=self.direct)
            self._client.wait_for_workers(self._want or 1, timeout=self.timeout)
        except (OSError, TimeoutError, distributed.TimeoutError) as exc:
            client, self._client = self._client, None
            if client is not None:
                client.close()
            raise WorkerError(f"Dask cluster of {self.name!r} at {self.spec}: cannot connect or no workers "
                              f"({type(exc).__name__}: {exc})") from None
        self._addresses = sorted(self._client.nthreads())
        if self._want:
            self._addresses = self._addresses[:self._want]

    @property
    def scheduler_tls(self) -> bool:
        """Whether the scheduler is reached over TLS."""
        return str(self.client.scheduler.address).startswith("tls://")

    def share(self, slot: str, obj, header: dict, blobs: Sequence[bytes] = (), op: str = "put") -> None:
        """:meth:`Executor.share`, refusing to ship key material (a private key's factors) to a
        scheduler reached without TLS unless the executor was made with ``insecure=True``."""
        state = header.get("state") if isinstance(header.get("state"), dict) else {}
        if header.get("kind") in ("encryptor", "decryptor") and state.get("p") and not self.insecure \
                and not self.scheduler_tls:
            raise InputError(f"Dask executor {self.name!r}: refusing to send key material to the scheduler "
                             f"{self.client.scheduler.address}, reached without TLS; use a tls:// scheduler "
                             "(--dask-tls-dir) or, on a private network, --dask-insecure")
        super().share(slot, obj, header, blobs, op)

    def start(self) -> "DaskExecutor":
        with self._lock:
            self._start()
        return self

    @property
    def started(self) -> bool:
        return self._client is not None and not self.closed

    @property
    def n_workers(self) -> int:
        if self._client is None and not self.closed:
            self.start()
        return max(1, len(self._addresses))

    @property
    def addresses(self) -> list[str]:
        """The workers, in the order shards are pinned to them."""
        self.start()
        return list(self._addresses)

    @property
    def client(self) -> Client:
        self.start()
        return self._client

    def close(self, kill: bool = False) -> None:
        """Free the slots and close the client (and a local cluster). A request still waiting on the
        cluster (a lost worker or scheduler) gets :data:`CLOSE_WAIT_SECONDS`; then the client is
        closed under it, which ends its wait with an error: a party stopped by SIGTERM exits."""
        locked = self._lock.acquire(timeout=CLOSE_WAIT_SECONDS)
        try:
            if self.closed:
                return
            self.closed = True
            client, cluster, self._client, self._cluster = self._client, self._cluster, None, None
            self._slots.clear()
            self._last = {}
            if client is not None:
                try:
                    if locked:
                        self._peaks = self._collect_peaks(client)
                    if not kill and locked:
                        client.run(_drop_namespace, self._ns)
                except Exception:                 # a lost cluster: nothing left to free
                    pass
                client.close()
            if cluster is not None:
                try:
                    cluster.close(timeout=CLOSE_WAIT_SECONDS)     # a worker restarting after a kill: never a hang
                except Exception:                 # (TimeoutError) its processes go with this one
                    pass
        finally:
            if locked:
                self._lock.release()

    # -- shared slots -------------------------------------------------------
    # -- requests ----------------------------------------------------------
    def _submit_on(self, wi: int, header: dict, blobs: Sequence[bytes]):
        if not 0 <= wi < len(self._addresses):
            raise WorkerError(f"Dask executor {self.name!r} has no worker {wi}")
        addr = self._addresses[wi]
        blobs = [bytes(b) for b in blobs]
        if sum(len(b) for b in blobs) > SCATTER_BYTES:
            self._check_alive([wi])          # a scatter to a dead worker would wait for its connect timeout
            (data,) = self._client.scatter([blobs], workers=[addr], hash=False, broadcast=False)
        else:
            data = blobs
        prev = self._last.get(wi)
        if prev is not None and prev.done() and prev.status == "finished":
            prev = None                  # nothing to wait for (a failed one fails the next)
        fut = self._client.submit(_task, self._ns, header, data, prev, workers=[addr], allow_other_workers=False,
                                  pure=False, key=f"vfl-{header.get('op')}-{secrets.token_hex(8)}")
        self._last[wi] = fut       # a worker runs its pinned requests in the order they were sent
        return fut

    def _gone(self, wi: int) -> WorkerError:
        return WorkerError(f"Dask worker {self._addresses[wi]} of {self.name!r} is gone (killed or lost) while it "
                           f"held row shards of the training; restart the worker and {self.advice}")

    def _scheduler_gone(self, exc: BaseException) -> WorkerError:
        # a lost scheduler shows either as the client's lost connection or as every task cancelled
        # (Dask's FuturesCancelledError, one line per future): the user is told which, in words
        why = "its tasks were cancelled" if isinstance(exc, CancelledError) else _first_line(exc)
        return WorkerError(f"the Dask scheduler of {self.name!r} at {self.spec} is gone or unreachable "
                           f"({why}); restart it and its workers, then {self.advice}")

    def _check_alive(self, watch: Sequence[int]) -> None:
        """Raise :class:`WorkerError` naming the first worker of ``watch`` the scheduler no longer lists."""
        client = self._client
        if client is None:          # closed under the request (the party is stopping)
            raise WorkerError(f"Dask executor {self.name!r} was closed while a request waited on it")
        if client.status != "running":     # the scheduler connection dropped: the client reconnects (would block)
            raise self._scheduler_gone(ConnectionError(f"the client lost its scheduler (status {client.status!r})"))
        alive = set(client.nthreads())
        for wi in sorted(set(watch)):
            if self._addresses[wi] not in alive:
                raise self._gone(wi)

    def _gather(self, futures: list, watch: Sequence[int], pinned: Sequence[int] | None = None) -> list:
        """Wait for ``futures``, noticing when a worker of ``watch`` (indices of workers whose
        slots the futures need) leaves, a task is lost (its worker restarted) or the scheduler
        goes; their results in order. ``pinned``: the worker of each future (when each is pinned to
        one), to name it when its task fails. Every failure is one :class:`WorkerError` line naming the
        party and the worker (or the scheduler)."""
        client = self._client
        if client is None:          # closed or aborted under the request (another caller's failure)
            raise WorkerError(f"Dask executor {self.name!r} was closed while a request waited on it")
        try:
            for fut in futures:     # waited through this executor's own client (its event loop)
                while True:
                    try:
                        fut.exception(timeout=POLL_SECONDS)
                        break
                    except (TimeoutError, distributed.TimeoutError):
                        pass
                    self._check_alive(watch)
                    lost = [f for f in futures if f.status in ("lost", "cancelled")]
                    if lost:
                        raise WorkerError(f"{len(lost)} task(s) of {self.name!r} were lost on the Dask workers "
                                          f"{[self._addresses[wi] for wi in sorted(set(watch))]} (killed or "
                                          f"restarted) while they held row shards of the training; {self.advice}")
            for f, wi in zip(futures, pinned if pinned is not None else [None] * len(futures)):
                if f.status == "error":
                    exc = f.exception()
                    if isinstance(exc, KeyError) and wi is not None:     # its slots are gone: a new process
                        raise WorkerError(f"Dask worker {self._addresses[wi]} of {self.name!r} lost the row shards "
                                          f"of the training (restarted or replaced: {_first_line(exc)}); "
                                          f"{self.advice}")
                    where = self._addresses[wi] if wi is not None else \
                        ", ".join(self._addresses[i] for i in sorted(set(watch)))
                    raise WorkerError(f"a task of {self.name!r} failed on its Dask worker ({where}): "
                                      f"{_first_line(exc)}")
            out = self._fetch(client, futures)
        except WorkerError:
            self._abort(futures)
            raise
        except (distributed.TimeoutError, OSError, CancelledError) as exc:
            # a cancelled future (FuturesCancelledError lists them all) or a closed connection: the
            # scheduler is gone (or this executor was closed under the request, e.g. by SIGTERM)
            self._abort(futures)
            raise self._scheduler_gone(exc) from None
        cpu = sum(float(header.get("cpu", 0.0)) for header, _ in out)
        with self._lock:
            self.cpu_seconds += cpu
        return out

    def _fetch(self, client, futures: list) -> list:
        """The finished ``futures``' results in one batch, never waiting for good on a worker that
        died after its task finished (its result is gone; the pinned task can run nowhere else, so
        Dask would wait for that worker for ever: issue 36, item 3). Every :data:`FETCH_SECONDS`
        without the results, every worker of this executor is checked."""
        if not futures:
            return []
        while True:
            try:
                return list(client.sync(client._gather, futures, callback_timeout=FETCH_SECONDS))
            except (TimeoutError, distributed.TimeoutError):
                self._check_alive(range(len(self._addresses)))
                lost = [f for f in futures if f.status != "finished"]
                if lost:
                    raise WorkerError(f"{len(lost)} result(s) of {self.name!r} were lost with their Dask worker "
                                      f"(killed or restarted) before they were fetched; {self.advice}") from None

    def _abort(self, futures) -> None:
        """After a failure: cancel the tasks and forget the connection and every slot (the shards of
        the training are lost); the next request reconnects and sees the workers then alive, so a
        resumed training (new shards) can run on the same executor."""
        with self._lock:
            client, self._client = self._client, None
            if client is None:        # another caller aborted already
                return
            self._slots.clear()
            self._last = {}
            self._addresses = []
            self._ns = f"{self.name}-{secrets.token_hex(6)}"
        try:
            client.cancel(futures)
        except Exception:
            pass
        try:
            client.close()
        except Exception:
            pass

    def submit_on(self, requests: Sequence[tuple[int, Request]]) -> Pending:
        """Submit pinned tasks and return at once (no lock is held while they run, so the
        gradient stream's window, the intake and a level share the cluster)."""
        with self._lock:
            self._start()
            futures = [self._submit_on(wi, h, b) for wi, (h, b) in requests]
        return _DaskPending(self, futures, [wi for wi, _ in requests], pinned=[wi for wi, _ in requests])

    def run_on(self, requests: Sequence[tuple[int, Request]]) -> list[Frame]:
        if not requests:
            return []
        return self.submit_on(requests).result()

    def broadcast(self, header: dict, blobs: Sequence[bytes] = ()) -> list[Frame]:
        with self._lock:
            self._start()
            return self.run_on([(wi, (header, blobs)) for wi in range(len(self._addresses))])

    def map(self, requests: Sequence[Request]) -> list[Frame]:
        if not requests:
            return []
        with self._lock:
            self._start()
            futures = [self._client.submit(_task, self._ns, h, [bytes(b) for b in blobs], pure=False,
                                           workers=self._addresses,
                                           key=f"vfl-{h.get('op')}-{secrets.token_hex(8)}")
                       for h, blobs in requests]
            watch = range(len(self._addresses))
        return self._gather(futures, watch)

    def reduce_on(self, requests: Sequence[tuple[int, Request]], combine: dict) -> Frame:
        if not requests:
            return {"additions": 0}, [b""]
        with self._lock:
            self._start()
            level = [self._submit_on(wi, h, b) for wi, (h, b) in requests]
            pinned = [wi for wi, _ in requests]
            parts = list(level)
            while len(parts) > 1:       # pairwise sums on the workers, next to the partials
                nxt = [self._client.submit(_combine_task, combine, parts[i], parts[i + 1], pure=False,
                                           key=f"vfl-combine-{secrets.token_hex(8)}")
                       for i in range(0, len(parts) - 1, 2)]
                parts = nxt + ([parts[-1]] if len(parts) % 2 else [])
        ((header, blobs),) = self._gather([parts[0]], pinned)
        return header, blobs

    def drop(self, prefix: str) -> None:
        super().drop(prefix)

    # -- benchmarks -------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        if not self.started:
            return []
        return [r for r in self._client.run(os.getpid).values()]

    def _collect_peaks(self, client) -> list[dict]:
        return [{"pool": self.name, "worker": addr, **r} for addr, r in client.run(_peak_kb).items()]

    def worker_peaks(self) -> list[dict]:
        with self._lock:
            if self.started:
                return self._collect_peaks(self._client)
            return list(self._peaks)
