"""What the ``vfl`` commands share: the command class that keeps deprecated option names working,
the network options and the objects built from them (security, peers, Dask executor, message cap,
timeouts) and the logging set-up. No command lives here."""
from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

import click
from tqdm import tqdm

from crypto.cluster import check_dask_ca, dask_executor
from datasets.errors import InputError
from protocols.grpc_security import Security, parse_peers
from protocols.units import check_seconds
from vfl.core.files import REPORT_MODE, write_text_atomic

#: the largest --max-message-mb (64 GiB: far beyond any frame; a larger value is a typo)
MAX_MESSAGE_MB = 65536

# old option name -> its name now (the library says active/passive; FATE said guest/host; --trees
# counted rounds: a round grows one tree per class of a multiclass model)
DEPRECATED_OPTIONS = {"--guest": "--active", "--host": "--passive", "--trees": "--rounds"}


class VFLCommand(click.Command):
    """A command whose deprecated option names (:data:`DEPRECATED_OPTIONS`, declared as second
    names of the same option) still work and print a one-line deprecation note to stderr."""

    def parse_args(self, ctx, args):
        given = list(_before_separator(args))
        for old, new in DEPRECATED_OPTIONS.items():
            aliased = any(old in p.opts and new in p.opts for p in self.params if isinstance(p, click.Option))
            if aliased and any(a == old or a.startswith(old + "=") for a in given):
                click.echo(f"warning: {old} is deprecated, use {new}", err=True)
        return super().parse_args(ctx, args)


def _before_separator(args):
    for a in args:
        if a == "--":
            return
        yield a


class TqdmHandler(logging.StreamHandler):
    def emit(self, record):
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # never let logging break a run
            self.handleError(record)


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message`` (and
    ``error`` with the traceback of an exception), for log collectors (``--log-format json``)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def setup_logging(level: str, log_format: str = "text", loggers=("vfl",)) -> None:
    """Logs of ``loggers`` to stderr: ``text`` (time, level, message) or ``json`` (JSON lines)."""
    handler = TqdmHandler()
    handler.setFormatter(JsonLinesFormatter() if log_format == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    for name in loggers:
        root = logging.getLogger(name)
        root.handlers[:] = [handler]
        root.setLevel(level.upper())
        root.propagate = False


def log_format_option(f):
    return click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
                        help="Logs on stderr as text lines or as JSON lines (time, level, logger, message).")(f)


def security_from_options(party, tls_dir, insecure, token_file, allowed_clients=()):
    sec = Security.from_options(party, tls_dir, insecure, token_file, allowed_clients)
    if insecure:
        click.echo("warning: --insecure: messages travel in PLAINTEXT and no certificate authenticates the "
                   "parties" + (" (the access token is sent in clear too)" if token_file else "")
                   + "; use it only for tests or on a network you trust", err=True)
    return sec


def net_options(f):
    """Options shared by every networked command."""
    opts = [
        click.option("--tls-dir", type=click.Path(file_okay=False),
                     help="Directory with ca.pem, NAME.pem, NAME.key (see `vfl certs`)."),
        click.option("--insecure", is_flag=True, help="Plaintext, no certificates (tests / trusted networks)."),
        click.option("--token-file", type=click.Path(dir_okay=False),
                     help="Shared access token (a file with one line) required on top of TLS or --insecure."),
        click.option("--max-message-mb", default=1024.0, show_default=True,
                     help="Largest protocol message accepted or sent (MiB)."),
        click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
                     show_default=True),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def dask_options(f):
    """A party's own compute on a Dask cluster (optional extra [dask])."""
    opts = [
        click.option("--dask-scheduler", help="Run this party's ciphertext work and row shards on its own Dask "
                                              "cluster: tls://HOST:PORT (tcp:// only with --dask-insecure)."),
        click.option("--dask-tls-dir", type=click.Path(file_okay=False),
                     help="Certificates for the Dask cluster: ca.pem and NAME.pem/NAME.key (or cert.pem/key.pem)."),
        click.option("--dask-insecure", is_flag=True,
                     help="Allow a non-TLS Dask scheduler (the cluster carries this party's plaintext data: "
                          "a private network only)."),
        click.option("--dask-via-scheduler", is_flag=True,
                     help="Relay payloads and results through the Dask scheduler (for a party process that "
                          "reaches the scheduler but not the workers; slower). Default: to the workers directly."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def party_executor(name: str, scheduler, tls_dir, insecure, role: str, via_scheduler: bool = False,
                   federation_ca: bytes | None = None):
    """The party's Dask executor, or None (its own worker processes). ``federation_ca``: the CA of
    the party's federation certificates (its ``--tls-dir``), which the cluster's CA must not be."""
    if not scheduler:
        if tls_dir or insecure or via_scheduler:
            raise click.UsageError("--dask-tls-dir, --dask-insecure and --dask-via-scheduler need --dask-scheduler")
        return None
    if scheduler.strip().startswith("local"):
        raise click.UsageError("--dask-scheduler takes a scheduler address; for a local cluster use "
                               "`vfl simulate --dask local:N`")
    check_dask_ca(tls_dir, federation_ca)
    return dask_executor(scheduler, f"{role}:{name}", tls_dir=tls_dir, insecure=insecure, direct=not via_scheduler)


def federation_peers(federation, name, peer_specs, active: bool):
    """``(this party's name, {passive party: address})`` from --peer and/or the federation file."""
    peers = parse_peers(peer_specs)
    if federation is None:
        if not peers:
            raise click.UsageError("give --peer NAME=HOST:PORT (repeat for each passive party) or --federation FILE")
        return name or "active", peers
    if active:
        name = name or federation.active
        if name != federation.active:
            raise InputError(f"{federation.path}: the active party is {federation.active!r}, not {name!r} (--name)")
    else:
        federation.party(name, "the model's active party")
    passives = federation.passives
    for p in peers:
        if p not in passives:
            raise InputError(f"{federation.path}: --peer {p!r} is not a passive party of the federation "
                             f"({', '.join(passives)})")
    return name, {**passives, **peers} if not peers else peers


def max_bytes(mb: float) -> int:
    if not 0 < mb <= MAX_MESSAGE_MB:         # NaN fails this too
        raise InputError(f"--max-message-mb must be more than 0 and at most {MAX_MESSAGE_MB} (MiB), got {mb}")
    return int(mb * 2 ** 20)


def check_timeouts(timeout: float, connect_timeout: float | None) -> None:
    """Every duration option, before anything is read or connected (inf, NaN, 1e12 refused)."""
    check_seconds(timeout, "--timeout")
    if connect_timeout is not None:
        check_seconds(connect_timeout, "--connect-timeout")


def min_iv_option(f):
    """``--min-iv`` of `vfl simulate` and `vfl party active` (issue 33): TrainParams ``min_iv``."""
    return click.option("--min-iv", "min_iv", type=click.FloatRange(0, 100), default=None,
                        help="Screen every feature first (WOE/IV, docs/screening.md; each passive party must grant "
                             "screening) and train only on those with an information value at least this (e.g. "
                             "0.02); each passive party is told the positions it keeps, names stay private.")(f)


def passive_exchange_options(f):
    """A passive party's own exchange settings (issue 31; also its federation entry's keys)."""
    f = click.option("--require-active-only-rounds", type=click.IntRange(0, 1 << 20), default=0, show_default=True,
                     help="Refuse a training whose first rounds on the active party's features only "
                          "(--active-only-rounds) are fewer than this.")(f)
    return click.option("--categorical-ordered", is_flag=True, default=False,
                        help="Strict: treat categorical features as ordered bins (shuffled candidates like any "
                             "feature); the active party then gets no per-category sums.")(f)


def passive_exchange_policy(require_active_only_rounds: int, categorical_ordered: bool) -> dict:
    """The policy entries of :func:`passive_exchange_options` (only those set)."""
    return {k: v for k, v in (("require_active_only_rounds", int(require_active_only_rounds)),
                              ("categorical_ordered", bool(categorical_ordered))) if v}


def write_report(path, doc) -> None:
    """A command's ``--output-json`` summary: atomic, mode 0644 (a report meant to be shared)."""
    write_text_atomic(path, json.dumps(doc, indent=1, default=float), REPORT_MODE)
