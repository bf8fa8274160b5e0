"""``vfl serve``: online scoring on the active party (extra ``serve``: FastAPI + uvicorn), and the
online options of ``vfl party passive`` (audit log, metrics, table reload, JSON logs)."""
from __future__ import annotations

import signal
import sys
import threading
import time

import click

from datasets.errors import InputError
from parties.federation import load_federation
from parties.network import load_active_model
from protocols.grpc_client import GrpcTransport
from protocols.grpc_security import check_address, is_loopback
from vfl.commands.common import (
    VFLCommand,
    check_timeouts,
    federation_peers,
    log_format_option,
    max_bytes,
    net_options,
    security_from_options,
    setup_logging,
)

SERVE_EXTRA_HINT = "pip install 'vfl-boost[serve]'"


def passive_online_options(f):
    """``vfl party passive``'s options for online scoring and operations."""
    opts = [
        click.option("--audit-log", type=click.Path(dir_okay=False),
                     help="Append-only audit log (JSON lines) of every online scoring request: time, caller, model, "
                          "outcome, hashed ids [default: online-audit.jsonl in --model-dir]."),
        click.option("--metrics-listen", default=None,
                     help="HOST:PORT to serve Prometheus metrics on (/metrics) [default: none]."),
        click.option("--reload-interval", type=float, default=1.0, show_default=True,
                     help="Seconds between checks of --data for changes (a changed table is reloaded without a "
                          "restart; also on SIGHUP); 0: only on SIGHUP."),
        log_format_option,
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _require_serve_extra():
    try:
        import uvicorn

        from vfl import serving
    except ImportError as exc:
        raise InputError(f"vfl serve needs FastAPI and uvicorn ({exc.name} is missing): {SERVE_EXTRA_HINT}") from None
    return uvicorn, serving


@click.command("serve", cls=VFLCommand)
@click.option("--model-dir", required=True, type=click.Path(file_okay=False),
              help="The active party's model directory (watched: a new model file there is loaded without a "
                   "restart; also on SIGHUP).")
@click.option("--federation", "federation_file", type=click.Path(dir_okay=False),
              help="The federation file: the passive parties' addresses (docs/federation.md).")
@click.option("--peer", "peer_specs", multiple=True, help="Passive party NAME=HOST:PORT; repeat for each.")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, help="HOST:PORT of the HTTP service.")
@click.option("--id-col", default="id", show_default=True, help="The id column's name (as in training).")
@click.option("--deadline-ms", type=float, default=200.0, show_default=True,
              help="A request's deadline unless it asks for another (?deadline_ms=): no request waits longer.")
@click.option("--max-deadline-ms", type=float, default=10000.0, show_default=True,
              help="The longest deadline a request may ask for.")
@click.option("--require-all", is_flag=True,
              help="Answer 503 naming the party when a passive party cannot answer within the deadline "
                   "[default: score by that party's default directions and say so].")
@click.option("--batch-rows", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="A micro-batch closes at this many applicants ...")
@click.option("--batch-wait-ms", type=float, default=1.0, show_default=True,
              help="... or this long after its first request, or sooner once it holds as many applicants as "
                   "the batch answered last (one round trip per passive party per batch).")
@click.option("--workers", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Micro-batches in flight at once.")
@click.option("--retry-seconds", type=float, default=1.0, show_default=True,
              help="A passive party that failed is asked again after this long (until then: its default "
                   "directions, or 503 with --require-all).")
@click.option("--watch-interval", type=float, default=1.0, show_default=True,
              help="Seconds between checks of --model-dir for a new model; 0: only on SIGHUP.")
@click.option("--timeout", default=10.0, show_default=True,
              help="Seconds to open the scoring channels of a model at the passive parties.")
@click.option("--connect-timeout", type=float, help="Seconds to wait for the peers at start [default: --timeout].")
@click.option("--explain-top", type=click.IntRange(0, 1000), default=3, show_default=True,
              help="Reason codes per applicant of POST /v1/score?explain=true (TreeSHAP from the decisions scoring "
                   "gathered: no other message to the passive parties); 0: explain=true answers 501.")
@click.option("--adverse", type=click.Choice(["high", "low"]), default="high", show_default=True,
              help="Reason codes name the players that pushed the score towards this side (high: a larger score, "
                   "e.g. the probability of default, is adverse).")
@click.option("--http-cert", type=click.Path(dir_okay=False), help="TLS certificate (PEM) of the HTTP service.")
@click.option("--http-key", type=click.Path(dir_okay=False), help="TLS key (PEM) of the HTTP service.")
@net_options
@log_format_option
def serve(model_dir, federation_file, peer_specs, listen, id_col, deadline_ms, max_deadline_ms, require_all,
          batch_rows, batch_wait_ms, workers, retry_seconds, watch_interval, timeout, connect_timeout, explain_top,
          adverse, http_cert, http_key, tls_dir, insecure, token_file, max_message_mb, log_level, log_format):
    """Score applicants online: POST /v1/score (see docs/serving.md), GET /healthz, /readyz, /metrics."""
    uvicorn, serving = _require_serve_extra()
    setup_logging(log_level, log_format, loggers=("vfl", "uvicorn"))
    check_timeouts(timeout, connect_timeout)
    if bool(http_cert) != bool(http_key):
        raise click.UsageError("--http-cert and --http-key go together")
    for what, v in (("--retry-seconds", retry_seconds), ("--watch-interval", watch_interval)):
        if not 0 <= v <= 3600:
            raise InputError(f"{what} must be 0..3600 seconds, got {v}")
    address = check_address(listen, "--listen address")
    host, port = address.rsplit(":", 1)
    federation = load_federation(federation_file) if federation_file else None
    model = load_active_model(model_dir)
    _, peers = federation_peers(federation, model.active_party, peer_specs, active=False)
    sec = security_from_options(model.active_party, tls_dir, insecure, token_file)
    if not http_cert and not is_loopback(host.strip("[]")):
        click.echo(f"warning: the HTTP service on {address} has no TLS (--http-cert/--http-key): put it behind a "
                   "TLS-terminating proxy", err=True)
    transport = GrpcTransport(model.active_party, {p: peers[p] for p in model.passives if p in peers}, sec,
                              timeout=timeout, max_frame_bytes=max_bytes(max_message_mb))
    explainer = serving.ReasonCodes(explain_top, adverse, id_col) if explain_top else None
    service = serving.ScoringService(model_dir, transport, id_col=id_col, require_all=require_all,
                                     deadline_ms=deadline_ms, max_deadline_ms=max_deadline_ms, batch_rows=batch_rows,
                                     batch_wait_ms=batch_wait_ms, workers=workers, retry_seconds=retry_seconds,
                                     watch_interval=watch_interval, explainer=explainer, freeze_heap=True)
    try:
        try:
            transport.connect(timeout=connect_timeout if connect_timeout is not None else timeout)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001  (a partner down at start: served by default routing)
            click.echo(f"warning: {exc}; serving anyway (that party is retried at the requests)", err=True)
        service.load(timeout)
        service.start_watching()
        # no proxy-header rewriting: the service does not use the client's address (and no access log)
        config = uvicorn.Config(serving.create_app(service), host=host.strip("[]"), port=int(port), log_config=None,
                                access_log=False, proxy_headers=False, lifespan="off", ssl_certfile=http_cert,
                                ssl_keyfile=http_key)
        server = uvicorn.Server(config)
        if hasattr(signal, "SIGHUP") and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, lambda *_: service.request_reload())
        threading.Thread(target=_announce, args=(server, "https" if http_cert else "http", service), daemon=True,
                         name="vfl-announce").start()
        server.run()
    finally:
        service.close()


def _announce(server, scheme: str, service) -> None:
    """Print the address once uvicorn listens (the port, when 0 was asked for)."""
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.02)
    sock = server.servers[0].sockets[0]
    host, port = sock.getsockname()[:2]
    click.echo(f"serving model {service.current.version} on {scheme}://{host}:{port}")
    sys.stdout.flush()
