"""The passive party's side of online scoring (``vfl serve``): scoring channels, the id index,
quotas and the audit log.

* ``ServeOpen`` -> ``Ack``: a long-lived channel for one model; the skeleton is sent and checked
  against this party's records once (the rules of batch prediction apply: one-round prediction
  allowed, the caller may predict with the model, the model hash matches).
* ``ScoreRequest`` -> ``ScoreResponse``: this party's decisions at its nodes for a few applicants, found by their hashed
  ids in an index of the current table (built at start and after every reload); an applicant the
  table does not hold is answered by this party's default (missing-value) directions and flagged
  ``known = False``. Or ``ScoreRefused`` when the caller is past its limits.

Limits belong to this party (its own table of the federation file, never the caller's request):
``serve_requests_per_second`` (a token bucket per caller) and ``serve_rows_per_day`` (applicants
per caller and UTC day, restored from the audit log at start, so a restart does not reset it).
Every request, answered or refused, is appended to the audit log (JSON lines: time, caller, model,
channel, outcome and the hashed ids asked for) and counted in the metrics.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from datasets.errors import InputError, ProtocolError
from parties.serve_metrics import PassiveMetrics
from protocols import messages as m

log = logging.getLogger("vfl.passive")

#: applicants in one ScoreRequest (vfl serve's micro-batches are far smaller)
MAX_SCORE_ROWS = 4096
#: scoring channels open at once, per client (the oldest unused one is dropped beyond it)
MAX_CHANNELS_PER_CLIENT = 64


@dataclass(frozen=True)
class ServeLimits:
    """This party's online scoring limits, per caller (None: no limit)."""
    requests_per_second: float | None = None
    rows_per_day: int | None = None

    @classmethod
    def from_federation(cls, federation, name: str) -> "ServeLimits":
        if federation is None:
            return cls()
        entry = federation.party(name)
        return cls(entry.serve_requests_per_second, entry.serve_rows_per_day)


class _Bucket:
    """A token bucket: ``rate`` requests per second, bursts up to ``max(1, rate)``."""

    def __init__(self, rate: float, now: float):
        self.rate, self.capacity = float(rate), max(1.0, float(rate))
        self.tokens, self.at = self.capacity, now

    def take(self, now: float) -> float:
        """0.0 if a request may pass now (a token is taken), else the seconds until one may."""
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class AuditLog:
    """Append-only JSON lines (0600: hashed ids are this party's pseudonyms of its customers)."""

    def __init__(self, path):
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise InputError(f"--audit-log {self.path}: cannot open for appending ({exc.strerror or exc})") from None
        self._fh = os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def write(self, entry: dict) -> None:
        line = json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n"
        with self._lock:
            self._fh.write(line)        # line-buffered: one write(2) of a whole line, O_APPEND
            self._fh.flush()

    #: lines of an earlier day read in a row before the scan of :meth:`rows_today` stops (lines of
    #: several processes interleave within milliseconds around midnight)
    EARLIER_LINES = 1000
    BLOCK = 1 << 20

    def rows_today(self, day: str) -> dict[str, int]:
        """Applicants answered per caller on UTC day ``day`` (``YYYY-MM-DD``), from the log so far.
        The log is read from its end back to the lines of earlier days only: a start-up reads
        today's lines, not a year of them."""
        counts: dict[str, int] = {}
        earlier = 0
        try:
            for at, line in self._lines_from_end():
                try:
                    e = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    log.warning("audit log %s: the line at byte %d is not JSON (ignored for the daily quota)",
                                self.path, at)
                    continue
                if not isinstance(e, dict):
                    continue
                when = str(e.get("time", ""))[:10]
                if when < day:
                    earlier += 1
                    if earlier >= self.EARLIER_LINES:
                        break
                    continue
                earlier = 0
                if when == day and e.get("outcome") == "ok":
                    counts[e.get("caller", "?")] = counts.get(e.get("caller", "?"), 0) + int(e.get("rows", 0))
        except OSError:
            pass
        return counts

    def _lines_from_end(self):
        """``(byte offset, line)`` of the log's non-empty lines, last first, read in blocks."""
        with open(self.path, "rb") as fh:
            end, tail = fh.seek(0, os.SEEK_END), b""
            while end > 0:
                start = max(0, end - self.BLOCK)
                fh.seek(start)
                chunk = fh.read(end - start) + tail        # the file's bytes from start on, contiguous
                parts = chunk.split(b"\n")
                offsets, at = [], start
                for part in parts:
                    offsets.append(at)
                    at += len(part) + 1
                first = 1 if start > 0 else 0               # a line begun in the block before: read with it
                tail = parts[0] if start > 0 else b""
                for k in range(len(parts) - 1, first - 1, -1):
                    if parts[k].strip():
                        yield offsets[k], parts[k]
                end = start

    def close(self) -> None:
        with self._lock:
            self._fh.close()


@dataclass(eq=False)
class _Channel:
    channel_id: str
    client: str
    model_id: str
    plan: tuple
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class OnlineScoring:
    """Answers ``ServeOpen`` and ``ScoreRequest`` for a :class:`parties.server.PassiveServer`
    (set as its ``online``)."""

    def __init__(self, server, limits: ServeLimits | None = None, audit: AuditLog | None = None,
                 metrics: PassiveMetrics | None = None, clock=time.monotonic, wall=_utc_now):
        self.server, self.limits, self.audit = server, limits or ServeLimits(), audit
        self.metrics = metrics or PassiveMetrics()
        self.clock, self.wall = clock, wall
        self._channels: dict[str, _Channel] = {}
        self._indexes: dict[str, tuple] = {}        # model -> (table version, party, index, X)
        self._buckets: dict[str, _Bucket] = {}
        self._day = self.wall().strftime("%Y-%m-%d")
        self._rows_today: dict[str, int] = audit.rows_today(self._day) if audit is not None else {}
        self._lock = threading.Lock()
        self._index_lock = threading.Lock()

    # -- the index ------------------------------------------------------------
    def warm(self) -> None:
        """Build the id index of every finished model from the current table (at start, after a reload)."""
        with self.server._lock:
            mids = list(self.server.models)
        for mid in mids:
            try:
                self._index(mid)
            except Exception as exc:  # noqa: BLE001  (a model that cannot index its rows: said at its requests)
                log.warning("%s: model %s: no online index: %s", self.server.name, mid, exc)
        self.metrics.table_rows.set(self.server.n_rows)
        self.metrics.table_version.set(self.server.table_version)

    def _index(self, mid: str):
        with self._index_lock:
            have = self._indexes.get(mid)
            if have is not None and have[0] == self.server.table_version:
                return have
            party, version = self.server.prediction_party(mid)
            index = party.serve_index()
            entry = (version, party, index, index[2])
            self._indexes[mid] = entry
            log.info("%s: model %s: online id index of %d rows (table version %d)", self.server.name, mid,
                     len(index[1]), version)
            return entry

    # -- requests -------------------------------------------------------------
    def handle(self, request, who: str, client: str):
        if isinstance(request, m.ServeOpen):
            return self._open(request, who, client)
        return self._score(request, who, client)

    def has_channel(self, client: str) -> bool:
        """Whether ``client`` has a scoring channel open (a session, for the transport's caps)."""
        with self._lock:
            return any(c.client == client for c in self._channels.values())

    def _open(self, req: m.ServeOpen, who: str, client: str) -> m.Ack:
        mid = req.model_id
        with self.server._lock:
            party = self.server.models.get(mid)
        if party is None:
            raise InputError(f"party {self.server.name!r} holds no finished model {mid!r} in {self.server.model_dir}")
        if self.server.access is not None:
            self.server.access.check_predict(client, party.trainer, mid)
        _, party, _, _ = self._index(mid)
        plan = party.serve_plan(req)
        now = self.clock()
        with self._lock:
            mine = [c for c in self._channels.values() if c.client == client]
            if len(mine) >= MAX_CHANNELS_PER_CLIENT:
                old = min(mine, key=lambda c: c.last_used)
                del self._channels[old.channel_id]
            self._channels[req.channel_id] = _Channel(req.channel_id, client, mid, plan, now)
            self.metrics.channels.set(len(self._channels))
        log.info("%s: scoring channel %s for model %s opened by %s", self.server.name, req.channel_id, mid, who)
        # the default side of each of its nodes of the channel (where a missing value goes): what the active
        # party routes by while this party is down (one bit per node, no threshold, no row)
        defaults = "".join("1" if d else "0" for d in party.serve_defaults(plan))
        return m.Ack({"table_version": self.server.table_version, "default_left": defaults})

    def _score(self, req: m.ScoreRequest, who: str, client: str):
        t0 = time.perf_counter()
        with self._lock:
            ch = self._channels.get(req.channel_id)
        if ch is None:
            self.metrics.errors.labels("unknown channel", client).inc()
            raise ProtocolError(f"party {self.server.name!r}: unknown scoring channel {req.channel_id!r} (open it "
                                "with ServeOpen; a restarted party holds none)")
        if ch.client != client:
            self.metrics.errors.labels("not the channel's client", client).inc()
            raise ProtocolError(f"party {self.server.name!r}: scoring channel {req.channel_id!r} belongs to another "
                                "client")
        n = len(req.hashes)
        entry = {"time": self.wall().isoformat(timespec="milliseconds"), "caller": client, "model": ch.model_id,
                 "channel": ch.channel_id, "rows": n, "ids": [h.tobytes().hex() for h in req.hashes]}
        if n > MAX_SCORE_ROWS:
            self._record(entry, "refused", "too many rows")
            self.metrics.errors.labels("too many rows", client).inc()
            raise ProtocolError(f"party {self.server.name!r}: a ScoreRequest of {n} applicants, more than "
                                f"{MAX_SCORE_ROWS}")
        refused = self._charge(client, n)
        if refused is not None:
            rule, message, retry = refused
            self._record(entry, "refused", rule)
            self.metrics.quota.labels(client, rule).inc()
            self.metrics.requests.labels(client, "refused").inc()
            log.warning("%s: refused a score request of %d applicant(s) from %s: %s", self.server.name, n, who,
                        message)
            return m.ScoreRefused(rule, message, retry)
        try:
            _, party, index, X = self._index(ch.model_id)
            pos = party.serve_rows(index, req.hashes)
            known = pos >= 0
            rows = np.full((n, len(party.feature_names)), np.nan)
            if known.any():
                rows[known] = X[pos[known]]
            with ch.lock:
                ch.last_used = self.clock()
            party.serve_charge(client, ch.plan, pos[known])     # training rows refused; the lifetime budget
            decisions = party.serve_decisions(ch.plan, rows)
        except Exception as exc:
            self._record(entry, "error", type(exc).__name__)
            self.metrics.errors.labels(type(exc).__name__, client).inc()
            self.metrics.requests.labels(client, "error").inc()
            raise
        entry["unknown"] = int(n - known.sum())
        self._record(entry, "ok", None)
        self.metrics.requests.labels(client, "ok").inc()
        self.metrics.rows.labels(client).inc(n)
        if entry["unknown"]:
            self.metrics.unknown.labels(client).inc(entry["unknown"])
        self.metrics.batch.observe(n)
        self.metrics.latency.observe(time.perf_counter() - t0)
        return m.ScoreResponse(decisions, known)

    def _charge(self, client: str, n: int):
        """None if ``client`` may have ``n`` more applicants scored now (they are counted), else
        ``(rule, message, retry_after)``."""
        lim = self.limits
        now, day = self.clock(), self.wall().strftime("%Y-%m-%d")
        with self._lock:
            if day != self._day:
                self._day, self._rows_today = day, {}
            if lim.requests_per_second is not None:
                bucket = self._buckets.setdefault(client, _Bucket(lim.requests_per_second, now))
                wait = bucket.take(now)
                if wait > 0:
                    return ("serve_requests_per_second",
                            f"party {self.server.name!r} refuses the request: rule 'serve_requests_per_second': "
                            f"at most {lim.requests_per_second:g} online requests per second per caller; retry in "
                            f"{wait:.3f} s", wait)
            if lim.rows_per_day is not None:
                used = self._rows_today.get(client, 0)
                if used + n > lim.rows_per_day:
                    return ("serve_rows_per_day",
                            f"party {self.server.name!r} refuses the request: rule 'serve_rows_per_day': at most "
                            f"{lim.rows_per_day} applicants per caller and UTC day ({used} scored today, {n} asked)",
                            0.0)
            self._rows_today[client] = self._rows_today.get(client, 0) + n
        return None

    def _record(self, entry: dict, outcome: str, reason: str | None) -> None:
        if self.audit is None:
            return
        entry = dict(entry, outcome=outcome, **({"reason": reason} if reason else {}))
        try:
            self.audit.write(entry)
        except OSError as exc:     # the answer is not given without its audit line
            raise InputError(f"party {self.server.name!r}: cannot write its audit log {self.audit.path}: "
                             f"{exc.strerror or exc}") from None

    def rows_today(self, client: str) -> int:
        with self._lock:
            return self._rows_today.get(client, 0)
