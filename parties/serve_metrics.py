"""Prometheus metrics of online scoring (``vfl serve`` and the passive parties' servers).

Each process keeps its own :class:`prometheus_client.CollectorRegistry` (several servers in one
test process never mix their counts). prometheus-client is optional (extras ``serve`` and
``net``): without it every metric is a no-op and :func:`start_metrics_server` says which extra
to install.
"""
from __future__ import annotations

import gc

from datasets.errors import InputError

try:                            # optional extras [serve] and [net]
    import prometheus_client as prom
except ImportError:             # pragma: no cover - without the extra: metrics are no-ops
    prom = None

#: latency buckets (seconds): online scoring targets tens of milliseconds
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0)
#: rows per batch (micro-batches of vfl serve, score requests at a passive party)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def settle_heap() -> None:
    """Take every object alive now out of the cyclic garbage collector's passes (``gc.freeze``):
    a serving process's model, table and indexes live as long as the process, and a full
    collection walking them held every request for 50-150 ms (measured: p99 at 200 requests per
    second went from 137 ms to 32 ms). Objects made later are collected as usual; a frozen object
    is still freed when nothing refers to it. Called by ``vfl serve`` and ``vfl party passive``
    (their own processes) once a model version or a table is in use."""
    gc.freeze()


class _Noop:
    def labels(self, *args, **kwargs):
        return self

    def inc(self, *args, **kwargs):
        pass

    def observe(self, *args, **kwargs):
        pass

    def set(self, *args, **kwargs):
        pass


class Metrics:
    """A registry of named metrics: ``counter``/``histogram``/``gauge`` declare, attributes read."""

    def __init__(self):
        self.registry = prom.CollectorRegistry() if prom is not None else None

    def counter(self, name: str, doc: str, labels=()):
        return prom.Counter(name, doc, list(labels), registry=self.registry) if prom is not None else _Noop()

    def histogram(self, name: str, doc: str, labels=(), buckets=LATENCY_BUCKETS):
        return prom.Histogram(name, doc, list(labels), buckets=buckets, registry=self.registry) \
            if prom is not None else _Noop()

    def gauge(self, name: str, doc: str, labels=()):
        return prom.Gauge(name, doc, list(labels), registry=self.registry) if prom is not None else _Noop()

    def exposition(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the Prometheus text format."""
        if prom is None:
            return b"# prometheus-client is not installed (pip install 'vfl-boost[serve]')\n", "text/plain"
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST


class PassiveMetrics(Metrics):
    """A passive party's online scoring and table."""

    def __init__(self):
        super().__init__()
        self.requests = self.counter("vfl_passive_score_requests_total", "Online score requests by caller and outcome",
                                     ("caller", "outcome"))
        self.rows = self.counter("vfl_passive_score_rows_total", "Applicants scored by caller", ("caller",))
        self.unknown = self.counter("vfl_passive_unknown_rows_total", "Applicants not in this party's table "
                                                                      "(answered by the default directions)",
                                    ("caller",))
        self.errors = self.counter("vfl_passive_score_errors_total", "Online requests failed, by cause and caller",
                                   ("cause", "caller"))
        self.quota = self.counter("vfl_passive_quota_refusals_total", "Online requests refused by a quota",
                                  ("caller", "rule"))
        self.latency = self.histogram("vfl_passive_score_seconds", "Time to answer one score request")
        self.batch = self.histogram("vfl_passive_score_batch_rows", "Applicants per score request",
                                    buckets=BATCH_BUCKETS)
        self.table_rows = self.gauge("vfl_passive_table_rows", "Rows of the table in use")
        self.table_version = self.gauge("vfl_passive_table_version", "Version of the table in use (+1 per reload)")
        self.reloads = self.counter("vfl_passive_table_reloads_total", "Table reloads by outcome", ("outcome",))
        self.channels = self.gauge("vfl_passive_score_channels", "Open scoring channels")


class ServeMetrics(Metrics):
    """``vfl serve``: requests, rows, errors by cause and peer, latency, batch sizes, quotas."""

    def __init__(self):
        super().__init__()
        self.requests = self.counter("vfl_serve_requests_total", "HTTP score requests by outcome", ("outcome",))
        self.rows = self.counter("vfl_serve_rows_total", "Applicants scored")
        self.errors = self.counter("vfl_serve_errors_total", "Failures by cause and peer", ("cause", "peer"))
        self.latency = self.histogram("vfl_serve_request_seconds", "Time to answer one HTTP score request")
        self.peer_latency = self.histogram("vfl_serve_peer_seconds", "Round trip of one batch to a passive party",
                                           ("peer",))
        self.batch = self.histogram("vfl_serve_batch_rows", "Applicants per micro-batch", buckets=BATCH_BUCKETS)
        self.fallback = self.counter("vfl_serve_default_routed_rows_total",
                                     "Applicants scored by a party's default directions, by peer and reason",
                                     ("peer", "reason"))
        self.quota = self.counter("vfl_serve_quota_refusals_total", "Batches refused by a passive party's quota",
                                  ("peer", "rule"))
        self.model = self.gauge("vfl_serve_model_info", "The model in use (1) by version", ("version",))
        self.reloads = self.counter("vfl_serve_model_reloads_total", "Model reloads by outcome", ("outcome",))


def start_metrics_server(listen: str, metrics: Metrics):
    """Serve ``metrics`` at ``http://LISTEN/metrics`` (a passive party's ``--metrics-listen``);
    returns the port."""
    if prom is None:
        raise InputError("--metrics-listen needs prometheus-client: pip install 'vfl-boost[net]'")
    host, _, port = listen.rpartition(":")
    try:
        server, _ = prom.start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1", registry=metrics.registry)
    except (OSError, ValueError) as exc:
        raise InputError(f"--metrics-listen {listen}: cannot listen ({exc})") from None
    return server.server_address[1]
