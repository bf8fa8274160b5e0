"""The server side of the gRPC transport: :class:`PartyServer` serves a party's frame
handler, authenticating every caller (certificate names, access token), capping frames and
streams per client, cutting off stalled streams, and answering every refusal with a clear
error while it keeps serving (the wire itself: :mod:`protocols.grpc_wire`).
"""
from __future__ import annotations

import hmac
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from datasets.errors import InputError
from protocols import messages as msg
from protocols.grpc_security import Security, check_address, is_loopback
from protocols.grpc_wire import (
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_READ_TIMEOUT,
    SERVICE,
    chunks,
    grpc_options,
    require_grpc,
)
from protocols.serialization import dumps
from protocols.transport import caller_deadline
from protocols.units import check_seconds, format_bytes

log = logging.getLogger("vfl.net")


FrameHandler = Callable[[bytes, str], bytes]


class Caller(str):
    """The ``who`` a server passes its handler: a description of the caller for logs (the
    string), and ``client``, its identity for session ownership and per-client limits: the
    certificate names under TLS, else the claimed party name and the caller's host; ``session``, the
    tag its process sends (``x-vfl-session``, one per client transport) or None: two processes of
    one identity differ (issue 36, item 7: a newer training session takes over, the older is told)."""

    client: str
    session: str | None

    def __new__(cls, description: str, client: str, session: str | None = None):
        obj = super().__new__(cls, description)
        obj.client = client
        obj.session = session
        return obj


#: a client transport's session tag (``x-vfl-session``): hex, 8 to 64 characters; anything else is ignored
_SESSION_TAG = re.compile(r"[0-9a-f]{8,64}")


def _host_of(peer: str) -> str:
    """``ipv4:10.0.0.3:51234`` -> ``ipv4:10.0.0.3`` (the port changes with every connection)."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class _ReadWatch:
    """Request streams being read, and when each last sent a chunk: a stream silent for longer
    than the read timeout is cancelled, so stalled uploads cannot hold the server's workers."""

    def __init__(self, read_timeout: float):
        self.read_timeout = float(read_timeout)
        self._streams: dict[int, list] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cut = 0

    def start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=f"vfl-readwatch-{name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def begin(self, context) -> int:
        key = id(context)
        with self._lock:
            self._streams[key] = [context, time.monotonic()]
        return key

    def touch(self, key: int) -> None:
        with self._lock:
            entry = self._streams.get(key)
            if entry is not None:
                entry[1] = time.monotonic()

    def end(self, key: int) -> None:
        with self._lock:
            self._streams.pop(key, None)

    def _run(self) -> None:
        period = max(0.05, min(1.0, self.read_timeout / 4))
        while not self._stop.wait(period):
            now = time.monotonic()
            with self._lock:
                stale = [k for k, (_, t) in self._streams.items() if now - t > self.read_timeout]
                contexts = [self._streams.pop(k)[0] for k in stale]
            for context in contexts:
                self.cut += 1
                _cancel(context, f"no data for {self.read_timeout:g} s while reading the request")


class _StreamLimit:
    """Request streams in progress per client (its identity, :attr:`Caller.client`): at most
    ``per_client`` at once, so that one client (even an allowed one, stalling its uploads) holds
    a bounded share of the server's worker threads and every other client is still served."""

    def __init__(self, per_client: int):
        self.per_client = int(per_client)
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()
        self.refused = 0

    def enter(self, client: str) -> bool:
        with self._lock:
            n = self._open.get(client, 0)
            if n >= self.per_client:
                self.refused += 1
                return False
            self._open[client] = n + 1
            return True

    def leave(self, client: str) -> None:
        with self._lock:
            n = self._open.get(client, 0) - 1
            if n > 0:
                self._open[client] = n
            else:
                self._open.pop(client, None)

    def open(self, client: str) -> int:
        with self._lock:
            return self._open.get(client, 0)


class _NonSessionLimit:
    """Request streams of callers holding no session at this party (``in_session(client)`` false):
    at most ``per_connection`` per connection and per client, and ``total`` in all (issue 36,
    item 5: two members without a session stalling their uploads held every worker). The other
    workers stay for the sessions under way, and for the first request of a new one."""

    def __init__(self, per_connection: int, total: int):
        self.per_connection, self.total = int(per_connection), int(total)
        self._by_conn: dict[str, int] = {}
        self._by_client: dict[str, int] = {}
        self._open = 0
        self._lock = threading.Lock()

    def enter(self, client: str, conn: str) -> str | None:
        """None when admitted, else why not."""
        with self._lock:
            if self._by_conn.get(conn, 0) >= self.per_connection:
                return f"{self.per_connection} calls without a session are in progress on this connection"
            if self._by_client.get(client, 0) >= self.per_connection:
                return f"{self.per_connection} calls without a session of this client are in progress"
            if self._open >= self.total:
                return f"{self.total} calls without a session are in progress in all"
            self._by_conn[conn] = self._by_conn.get(conn, 0) + 1
            self._by_client[client] = self._by_client.get(client, 0) + 1
            self._open += 1
            return None

    def leave(self, client: str, conn: str) -> None:
        with self._lock:
            for table, key in ((self._by_conn, conn), (self._by_client, client)):
                n = table.get(key, 0) - 1
                if n > 0:
                    table[key] = n
                else:
                    table.pop(key, None)
            self._open = max(0, self._open - 1)


def _add_health(server):
    """The standard gRPC health service on ``server`` (NOT_SERVING until told otherwise), or None
    when grpcio-health-checking is not installed (extra [net])."""
    try:
        from grpc_health.v1 import health, health_pb2_grpc
    except ImportError:
        log.warning("grpcio-health-checking is not installed: no grpc.health.v1 service (pip install "
                    "'vfl-boost[net]')")
        return None
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


def _cancel(context, details: str) -> None:
    """Cancel a server-side call from another thread (wakes a handler blocked reading it)."""
    call = getattr(getattr(context, "_rpc_event", None), "call", None)
    if call is not None:
        try:
            from grpc._cython import cygrpc
            call.cancel(cygrpc.StatusCode.deadline_exceeded, details)
        except Exception as exc:  # noqa: BLE001  (best effort: the client's deadline still applies)
            log.debug("could not cancel a stalled stream: %s", exc)


class PartyServer:
    """Serves ``handler(frame, who) -> reply`` over gRPC on ``listen`` (``host:port``; port 0 = any free).

    ``who`` describes the authenticated caller for logs, e.g.
    ``"bank (certificate bank, ipv4:10.0.0.3:51234)"``. Anything the handler
    raises becomes an :class:`ErrorReply` and the server keeps serving.
    """

    #: seconds a client refused at its stream limit is told to wait before it retries
    BUSY_RETRY_AFTER = 0.2
    #: request streams of a caller holding no session, per connection and per client (issue 36, item 5)
    NON_SESSION_PER_CONNECTION = 2

    def __init__(self, name: str, handler: FrameHandler, listen: str, security: Security,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, max_workers: int = 16, role: str = "passive",
                 read_timeout: float = DEFAULT_READ_TIMEOUT, max_streams_per_client: int | None = None,
                 admit=None):
        """``max_streams_per_client``: request streams one client may have in progress at once
        (default: half of ``max_workers``); more are answered "busy, retry" at once, unread.
        ``admit(client)``: the membership check of a caller's identity (:attr:`Caller.client`), made
        before a call is given a worker's time: None admits it, a text refuses it (issue 36, item 5:
        any certificate of the CA held the workers before its session was refused)."""
        self.name, self.handler, self.role = name, handler, role
        self.admit = admit
        per_client = max(1, max_workers // 2) if max_streams_per_client is None else int(max_streams_per_client)
        if not 1 <= per_client <= max_workers:
            raise InputError(f"max_streams_per_client must be 1..{max_workers} (the worker threads), got {per_client}")
        self._streams = _StreamLimit(per_client)
        #: ``in_session(client) -> bool``: whether the caller holds a session here (a passive party's
        #: training or prediction session); None: every call counts as a session's (no further cap)
        self.in_session = None
        self._non_session = _NonSessionLimit(self.NON_SESSION_PER_CONNECTION, max(1, max_workers // 2))
        self._watch = _ReadWatch(check_seconds(read_timeout, "the read timeout"))
        self.listen = check_address(listen, "--listen address")
        if not security.tls and not is_loopback(self.listen.rsplit(":", 1)[0]):
            raise InputError(f"--insecure refuses to listen on {self.listen}: without TLS anyone on the network "
                             "could connect; listen on 127.0.0.1 (or [::1], localhost) or use --tls-dir")
        self.security = security
        if max_frame_bytes < 1024:
            raise InputError(f"the frame cap must be at least 1024 bytes, got {max_frame_bytes}")
        self.max_frame_bytes = int(max_frame_bytes)
        self.max_workers = max_workers
        self.port: int | None = None
        self._server = None
        self.stats = {"calls": 0, "refused": 0, "bytes_in": 0, "bytes_out": 0}
        self._stats_lock = threading.Lock()
        self.health = None          # the grpc.health.v1 servicer, once started (None: grpcio-health-checking missing)
        self._serving = False

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> int:
        grpc = require_grpc()
        server = grpc.server(ThreadPoolExecutor(max_workers=self.max_workers,
                                                thread_name_prefix=f"vfl-{self.name}"),
                             # never share the port with another process: a second server on a busy
                             # port must fail, not silently receive half of the calls
                             options=grpc_options(self.max_frame_bytes, "server") + [("grpc.so_reuseport", 0)])
        handlers = grpc.method_handlers_generic_handler(SERVICE, {
            "Exchange": grpc.stream_stream_rpc_method_handler(self._exchange),
            "Call": grpc.unary_unary_rpc_method_handler(self._call),
            "Hello": grpc.unary_unary_rpc_method_handler(self._hello),
        })
        server.add_generic_rpc_handlers((handlers,))
        self.health = _add_health(server)
        self.set_serving(self._serving)
        try:
            if self.security.tls:
                creds = grpc.ssl_server_credentials([(self.security.key_pem, self.security.cert_pem)],
                                                    root_certificates=self.security.ca_pem,
                                                    require_client_auth=True)
                port = server.add_secure_port(self.listen, creds)
            else:
                port = server.add_insecure_port(self.listen)
        except RuntimeError as exc:
            server.stop(None)
            raise InputError(f"cannot listen on {self.listen}: port {self.listen.rsplit(':', 1)[1]} is in use "
                             f"or not available ({exc})") from None
        if not port:
            server.stop(None)
            raise InputError(f"cannot listen on {self.listen}: port {self.listen.rsplit(':', 1)[1]} is in use "
                             "by another process (or not available)")
        server.start()
        self._watch.start(self.name)
        self._server, self.port = server, port
        log.info("%s: serving as %s party on %s:%d (%s, frame cap %s)", self.name, self.role,
                 self.listen.rsplit(":", 1)[0], port, self.security.describe(), format_bytes(self.max_frame_bytes))
        return port

    def set_serving(self, serving: bool) -> None:
        """What the standard health service (``grpc.health.v1.Health``) says, for the whole server
        and for ``vfl.Party``: SERVING or NOT_SERVING (e.g. before the party's table is loaded)."""
        self._serving = bool(serving)
        if self.health is None:
            return
        from grpc_health.v1 import health_pb2
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE):
            self.health.set(service, status)

    def wait(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout)

    def stop(self, grace: float | None = 1.0) -> None:
        self._watch.stop()
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(grace).wait()

    # -- checks -------------------------------------------------------------
    def _who(self, context) -> Caller:
        md = dict(context.invocation_metadata())
        claimed = str(md.get("x-vfl-party", "?"))[:64]
        tag = str(md.get("x-vfl-session", ""))
        tag = tag if _SESSION_TAG.fullmatch(tag) else None
        names = self._cert_names(context)
        where = context.peer()
        if names:
            cert = "/".join(sorted(names))
            return Caller(f"{claimed} (certificate {cert}, {where})", f"certificate {cert}", tag)
        return Caller(f"{claimed} ({where})", f"{claimed}@{_host_of(where)}", tag)

    @staticmethod
    def _cert_names(context) -> set[str]:
        auth = context.auth_context() or {}
        vals = list(auth.get("x509_common_name", [])) + list(auth.get("x509_subject_alternative_name", []))
        return {v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in vals}

    def _refuse(self, context, code, who: str, message: str):
        with self._stats_lock:
            self.stats["refused"] += 1
        log.warning("%s: refused a call from %s: %s", self.name, who, message)
        context.abort(code, f"party {self.name!r}: {message}")

    def _authorize(self, context) -> str:
        grpc = require_grpc()
        who = self._who(context)
        md = dict(context.invocation_metadata())
        if self.security.token:
            got = md.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {self.security.token}".encode()):
                self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, who,
                             "missing or wrong access token" if got else "no access token")
        if self.security.tls and self.security.allowed_clients:
            names = self._cert_names(context)
            if not names & set(self.security.allowed_clients):
                self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, who,
                             f"client certificate {sorted(names)} is not among the allowed clients "
                             f"{list(self.security.allowed_clients)}")
        refusal = self.admit(who.client) if self.admit is not None else None
        if refusal:
            self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, who, refusal)
        return who

    # -- methods ------------------------------------------------------------
    def _hello(self, request: bytes, context) -> bytes:
        self._authorize(context)
        return json.dumps({"party": self.name, "role": self.role, "frame_format": "VFL1",
                           "max_frame_bytes": self.max_frame_bytes}).encode()

    def _call(self, request: bytes, context) -> bytes:
        """A request frame in one message, its reply in one (:data:`protocols.grpc_wire.CALL`):
        served as an exchange (b"": dropped unserved, as an exchange's reply without a chunk)."""
        return b"".join(self._exchange(iter((request,)), context))

    def _exchange(self, request_iterator, context):
        who = self._authorize(context)
        client = getattr(who, "client", str(who))
        left = context.time_remaining()
        if left is not None and left <= 0:      # queued past the caller's deadline: nobody waits for it
            context.abort(require_grpc().StatusCode.DEADLINE_EXCEEDED,
                          f"party {self.name!r}: the request was queued past the caller's deadline; dropped unserved")
        if not self._streams.enter(client):
            log.info("%s: %s is at its limit of %d concurrent calls: busy, retry", self.name, who,
                     self._streams.per_client)
            yield from chunks(dumps(msg.ErrorReply(
                msg.ErrorKind.BUSY, f"party {self.name!r} is busy: {self._streams.per_client} calls of this "
                "client are in progress; retry", self.BUSY_RETRY_AFTER)))
            return
        try:
            in_session = self.in_session
            if in_session is None or in_session(client):
                yield from self._serve_stream(request_iterator, context, who)
                return
            conn = context.peer()
            why = self._non_session.enter(client, conn)
            if why is not None:
                log.info("%s: %s holds no session and %s: busy, retry", self.name, who, why)
                yield from chunks(dumps(msg.ErrorReply(
                    msg.ErrorKind.BUSY, f"party {self.name!r} is busy: {why}; retry", self.BUSY_RETRY_AFTER)))
                return
            try:
                yield from self._serve_stream(request_iterator, context, who)
            finally:
                self._non_session.leave(client, conn)
        finally:
            self._streams.leave(client)

    def _serve_stream(self, request_iterator, context, who):
        grpc = require_grpc()
        md = dict(context.invocation_metadata())
        declared = md.get("x-vfl-frame-bytes")
        cap = self.max_frame_bytes
        if declared is not None:
            if not declared.isdigit():
                self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, who, "bad x-vfl-frame-bytes header")
            declared = int(declared)
            if declared > cap:
                self._refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, who,
                             f"a frame of {format_bytes(declared)} exceeds this party's cap of {format_bytes(cap)}")
        t0 = time.perf_counter()
        buf = bytearray()
        watch = self._watch.begin(context)
        try:
            for chunk in request_iterator:
                self._watch.touch(watch)
                buf += chunk
                if len(buf) > cap:
                    self._refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, who,
                                 f"a frame of more than {format_bytes(cap)} exceeds this party's cap")
        except grpc.RpcError:       # cancelled: by the caller, or by the read watch (a stalled upload)
            log.warning("%s: dropped a request from %s: the stream stalled or was cancelled after %d bytes",
                        self.name, who, len(buf))
            return
        finally:
            self._watch.end(watch)
        if not context.is_active():
            log.warning("%s: dropped a request from %s: the stream stalled or was cancelled after %d bytes",
                        self.name, who, len(buf))
            return
        if declared is not None and len(buf) != declared:
            self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, who,
                         f"frame of {len(buf)} bytes, {declared} announced (truncated?)")
        frame = bytes(buf)
        del buf
        def alive() -> bool:
            left = context.time_remaining()
            return context.is_active() and (left is None or left > 0)

        try:
            with caller_deadline(alive):
                reply = self.handler(frame, who)
        except Exception as exc:   # a bug must not take the server down
            log.exception("%s: failed on a request from %s", self.name, who)
            reply = dumps(msg.ErrorReply(msg.ErrorKind.PROTOCOL, f"internal error at party {self.name!r}: "
                                                                 f"{type(exc).__name__}: {exc}"))
        with self._stats_lock:
            self.stats["calls"] += 1
            self.stats["bytes_in"] += len(frame)
            self.stats["bytes_out"] += len(reply)
        log.debug("%s: %s: %d bytes in, %d bytes out, %.3f s", self.name, who, len(frame), len(reply),
                  time.perf_counter() - t0)
        yield from chunks(reply)

