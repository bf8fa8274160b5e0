"""The network transport: the same serialized frames, carried over gRPC.

One generic gRPC service (no ``.proto`` code generation: raw bytes in, raw
bytes out) with two methods:

* ``/vfl.Party/Exchange`` (stream -> stream): one request frame, sent in
  chunks of at most :data:`CHUNK_BYTES`, answered by one reply frame in
  chunks. A 2048-bit ciphertext vector for 50,000 rows (~25 MB) thus never
  hits gRPC's per-message limit; the frame as a whole is capped by
  ``max_frame_bytes`` on both sides (the sender also announces the size so an
  oversized frame is refused before it is read).
* ``/vfl.Party/Hello`` (unary): who is there (party name, role, cap), used to
  wait for peers at start-up and to check that the address belongs to the
  party we expect.

Security: TLS with a CA the parties agree on and *mutual* authentication (the
server requires a client certificate from the CA; the client checks the
server's certificate against the peer's party *name*, whatever its address),
optionally a shared access token on top (``authorization: Bearer ...``), and
optionally a list of client certificate names a server accepts. Plaintext only
with an explicit ``insecure`` security object (the CLI's ``--insecure``).

Every call has a deadline; a refused call (oversized, unauthenticated,
malformed, unknown message type) gets a clear error while the server keeps
serving. ``grpcio`` is an optional dependency (``pip install '.[net]'``),
imported only when a network object is created.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from datasets.errors import InputError, PeerError
from protocols import messages as msg
from protocols.certs import NET_EXTRA_HINT, MissingDependency, check_party_name, load_party_tls
from protocols.serialization import dumps
from protocols.transport import Transport, caller_deadline
from protocols.units import check_seconds, format_bytes

log = logging.getLogger("vfl.net")

SERVICE = "vfl.Party"
EXCHANGE = f"/{SERVICE}/Exchange"
HELLO = f"/{SERVICE}/Hello"
CHUNK_BYTES = 1 << 20                     # 1 MiB per gRPC message
GRPC_MESSAGE_LIMIT = 4 << 20              # no single gRPC message may exceed this
DEFAULT_MAX_FRAME_BYTES = 1 << 30         # 1 GiB per protocol frame
DEFAULT_TIMEOUT = 60.0
#: a request stream that sends no chunk for this long is cut off (slowloris)
DEFAULT_READ_TIMEOUT = 20.0
MIN_TOKEN_CHARS = 16

_ADDR_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-_]+):(\d{1,5})$")


def require_grpc():
    try:
        import grpc
    except ImportError:
        raise MissingDependency(f"network mode needs the 'grpcio' package: {NET_EXTRA_HINT}") from None
    return grpc


def check_address(address: str, what: str = "address") -> str:
    """``host:port`` (``[v6]:port`` for IPv6 literals), port 0..65535."""
    m = _ADDR_RE.match(address or "")
    if not m or int(m.group(2)) > 65535:
        raise InputError(f"{what} {address!r} is not HOST:PORT (e.g. 127.0.0.1:50051)")
    return address


def is_loopback(host: str) -> bool:
    """Whether ``host`` (of a listen address) is the loopback interface only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_peers(specs) -> dict[str, str]:
    """``["telco=10.0.0.7:50051", ...]`` -> ``{"telco": "10.0.0.7:50051", ...}`` (order kept)."""
    peers: dict[str, str] = {}
    for spec in specs:
        name, sep, addr = str(spec).partition("=")
        if not sep or not name:
            raise InputError(f"--peer {spec!r} must be NAME=HOST:PORT (e.g. telco=127.0.0.1:50051)")
        if name in peers:
            raise InputError(f"party {name!r} is given twice in --peer")
        peers[name] = check_address(addr, f"address of party {name!r}")
    return peers


@dataclass
class Security:
    """How a party proves who it is and whom it accepts.

    ``ca_pem``/``cert_pem``/``key_pem``: TLS material (all three, or none for
    plaintext). ``token``: a shared secret sent with every call (clients) or
    required from every caller (servers). ``allowed_clients``: certificate
    names a server accepts (empty: any certificate issued by the CA).
    """
    ca_pem: bytes | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str | None = None
    allowed_clients: tuple[str, ...] = ()

    @property
    def tls(self) -> bool:
        return self.ca_pem is not None

    def describe(self) -> str:
        parts = ["mutual TLS" if self.tls else "PLAINTEXT (--insecure)"]
        if self.token:
            parts.append("access token")
        if self.allowed_clients:
            parts.append("clients " + ", ".join(self.allowed_clients))
        return " + ".join(parts)

    @classmethod
    def from_options(cls, party: str, tls_dir=None, insecure: bool = False, token_file=None,
                     allowed_clients=()) -> "Security":
        """The security of ``party`` from CLI-style options (exactly one of ``tls_dir``/``insecure``)."""
        if tls_dir and insecure:
            raise InputError("give either --tls-dir DIR or --insecure, not both")
        if not tls_dir and not insecure:
            raise InputError("network mode needs --tls-dir DIR (certificates from `vfl certs`) or, for "
                             "plaintext on a trusted network, --insecure")
        token = read_token(token_file) if token_file else None
        allowed = tuple(allowed_clients)
        if allowed and insecure:
            raise InputError("--allow-client checks certificate names and needs --tls-dir (not --insecure); "
                             "use --token-file to authenticate clients over plaintext")
        if insecure:
            return cls(token=token)
        check_party_name(party)
        for c in allowed:
            check_party_name(c)
        ca, cert, key = load_party_tls(tls_dir, party)
        return cls(ca, cert, key, token, allowed)


def read_token(path) -> str:
    p = Path(path)
    try:
        token = p.read_text().strip()
    except OSError as exc:
        raise InputError(f"cannot read token file {p}: {exc.strerror or exc}") from None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token) or not token.isprintable():
        raise InputError(f"token in {p} must be at least {MIN_TOKEN_CHARS} printable characters without "
                         "spaces (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token


def _chunks(frame: bytes):
    view = memoryview(frame)
    if not frame:
        yield b""
    for i in range(0, len(frame), CHUNK_BYTES):
        yield bytes(view[i:i + CHUNK_BYTES])


def _grpc_options(max_frame_bytes: int):
    return [("grpc.max_send_message_length", GRPC_MESSAGE_LIMIT),
            ("grpc.max_receive_message_length", GRPC_MESSAGE_LIMIT)]


# --------------------------------------------------------------------------- server
FrameHandler = Callable[[bytes, str], bytes]


class Caller(str):
    """The ``who`` a server passes its handler: a description of the caller for logs (the
    string), and ``client``, its identity for session ownership and per-client limits: the
    certificate names under TLS, else the claimed party name and the caller's host."""

    client: str

    def __new__(cls, description: str, client: str):
        obj = super().__new__(cls, description)
        obj.client = client
        return obj


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

    def __init__(self, name: str, handler: FrameHandler, listen: str, security: Security,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, max_workers: int = 16, role: str = "passive",
                 read_timeout: float = DEFAULT_READ_TIMEOUT, max_streams_per_client: int | None = None):
        """``max_streams_per_client``: request streams one client may have in progress at once
        (default: half of ``max_workers``); more are answered "busy, retry" at once, unread."""
        self.name, self.handler, self.role = name, handler, role
        per_client = max(1, max_workers // 2) if max_streams_per_client is None else int(max_streams_per_client)
        if not 1 <= per_client <= max_workers:
            raise InputError(f"max_streams_per_client must be 1..{max_workers} (the worker threads), got {per_client}")
        self._streams = _StreamLimit(per_client)
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

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> int:
        grpc = require_grpc()
        server = grpc.server(ThreadPoolExecutor(max_workers=self.max_workers,
                                                thread_name_prefix=f"vfl-{self.name}"),
                             # never share the port with another process: a second server on a busy
                             # port must fail, not silently receive half of the calls
                             options=_grpc_options(self.max_frame_bytes) + [("grpc.so_reuseport", 0)])
        handlers = grpc.method_handlers_generic_handler(SERVICE, {
            "Exchange": grpc.stream_stream_rpc_method_handler(self._exchange),
            "Hello": grpc.unary_unary_rpc_method_handler(self._hello),
        })
        server.add_generic_rpc_handlers((handlers,))
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

    def wait(self, timeout: float | None = None) -> bool:
        return self._server.wait_for_termination(timeout)

    def stop(self, grace: float | None = 1.0) -> None:
        self._watch.stop()
        if self._server is not None:
            self._server.stop(grace).wait()

    # -- checks -------------------------------------------------------------
    def _who(self, context) -> Caller:
        md = dict(context.invocation_metadata())
        claimed = str(md.get("x-vfl-party", "?"))[:64]
        names = self._cert_names(context)
        where = context.peer()
        if names:
            cert = "/".join(sorted(names))
            return Caller(f"{claimed} (certificate {cert}, {where})", f"certificate {cert}")
        return Caller(f"{claimed} ({where})", f"{claimed}@{_host_of(where)}")

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
        return who

    # -- methods ------------------------------------------------------------
    def _hello(self, request: bytes, context) -> bytes:
        self._authorize(context)
        return json.dumps({"party": self.name, "role": self.role, "frame_format": "VFL1",
                           "max_frame_bytes": self.max_frame_bytes}).encode()

    def _exchange(self, request_iterator, context):
        who = self._authorize(context)
        client = getattr(who, "client", str(who))
        left = context.time_remaining()
        if left is not None and left <= 0:      # queued past the caller's deadline: nobody waits for it
            return
        if not self._streams.enter(client):
            log.info("%s: %s is at its limit of %d concurrent calls: busy, retry", self.name, who,
                     self._streams.per_client)
            yield from _chunks(dumps(msg.ErrorReply(
                msg.ErrorKind.BUSY, f"party {self.name!r} is busy: {self._streams.per_client} calls of this "
                "client are in progress; retry", self.BUSY_RETRY_AFTER)))
            return
        try:
            yield from self._serve_stream(request_iterator, context, who)
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
        yield from _chunks(reply)


# --------------------------------------------------------------------------- client
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def probe_plaintext(address: str, timeout: float = 2.0) -> str | None:
    """What listens at ``address``: ``"plaintext"`` (an HTTP/2 server without TLS answered our
    preface with its settings), ``"other"`` (something answered otherwise or hung up: a TLS
    server does), or None (nothing accepts connections there)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError):
        return None
    try:
        sock.settimeout(timeout)
        sock.sendall(_H2_PREFACE)
        head = b""
        while len(head) < 9:
            part = sock.recv(9 - len(head))
            if not part:
                break
            head += part
    except OSError:
        return "other"
    finally:
        sock.close()
    return "plaintext" if len(head) == 9 and head[3] == 0x04 else "other"


class GrpcTransport(Transport):
    """Client side: talks to named peers at ``peers = {name: "host:port"}``.

    ``timeout`` bounds every call (upload, the peer's work, download). A peer
    that is unreachable or times out is marked failed: later calls to it fail
    at once (so that, e.g., the end-of-training notice does not wait another
    timeout), calls to other peers go on. :meth:`call_many` talks to several
    peers concurrently.
    """

    concurrent = True

    def __init__(self, local_name: str, peers: dict[str, str], security: Security,
                 timeout: float = DEFAULT_TIMEOUT, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        super().__init__(local_name)
        grpc = require_grpc()
        timeout = check_seconds(timeout, "--timeout")
        self.peers = {p: check_address(a, f"address of party {p!r}") for p, a in dict(peers).items()}
        self.security = security
        self.timeout = float(timeout)
        self.max_frame_bytes = int(max_frame_bytes)
        self.busy_max_wait = self.timeout      # "busy, retry" waits count against the call's own deadline
        self._deadline = threading.local()     # the call in progress (per thread): when its --timeout ends
        self.failed: dict[str, str] = {}
        self.peer_info: dict[str, dict] = {}
        self._channels, self._exchange_stubs, self._hello_stubs = {}, {}, {}
        self._lock = threading.Lock()
        for peer, addr in self.peers.items():
            opts = _grpc_options(self.max_frame_bytes) + [
                ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 2000)]
            if security.tls:
                check_party_name(peer)
                creds = grpc.ssl_channel_credentials(root_certificates=security.ca_pem,
                                                     private_key=security.key_pem,
                                                     certificate_chain=security.cert_pem)
                opts.append(("grpc.ssl_target_name_override", peer))
                ch = grpc.secure_channel(addr, creds, options=opts)
            else:
                ch = grpc.insecure_channel(addr, options=opts)
            self._channels[peer] = ch
            self._exchange_stubs[peer] = ch.stream_stream(EXCHANGE)
            self._hello_stubs[peer] = ch.unary_unary(HELLO)

    # -- helpers ------------------------------------------------------------
    def _metadata(self, extra=()):
        md = [("x-vfl-party", self.local_name), *extra]
        if self.security.token:
            md.append(("authorization", f"Bearer {self.security.token}"))
        return md

    def _error(self, peer: str, exc) -> PeerError:
        grpc = require_grpc()
        code = exc.code() if hasattr(exc, "code") else None
        details = (exc.details() if hasattr(exc, "details") else str(exc)) or ""
        where = f"party {peer!r} at {self.peers[peer]}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            text = f"{where} did not answer within {self.timeout:g} s (--timeout); is it running and reachable?"
        elif code == grpc.StatusCode.UNAVAILABLE and self._tls_mismatch(peer):
            if self.security.tls:
                text = (f"TLS mismatch: {where} is a plaintext (--insecure) server but we use TLS; "
                        "start both parties with TLS (or both with --insecure)")
            else:
                text = (f"TLS mismatch: {where} expects TLS but we connect in plaintext (--insecure); "
                        "give this party --tls-dir (or start both parties with --insecure)")
            return PeerError(text)
        elif code == grpc.StatusCode.UNAVAILABLE:
            low = details.lower()
            if any(w in low for w in ("handshake", "ssl", "certificate", "tls", "verification")):
                text = (f"TLS handshake with {where} failed (wrong CA, or a certificate not issued for "
                        f"{peer!r}, or our certificate was refused): {details}")
            else:
                text = f"{where} is unavailable (did the process stop?): {details}"
        elif code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            text = f"{where} refused our credentials: {details}"
        elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            text = f"{where} refused a message as too large: {details}"
        elif code == grpc.StatusCode.CANCELLED:
            text = f"call to {where} was cancelled: {details}"
        else:
            text = f"call to {where} failed ({code.name if code else type(exc).__name__}): {details}"
        if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
            with self._lock:
                self.failed[peer] = text
        return PeerError(text)

    def _tls_mismatch(self, peer: str) -> bool:
        """After an "unavailable": does the peer listen, speaking the other kind (TLS or not)?"""
        kind = probe_plaintext(self.peers[peer], timeout=min(2.0, self.timeout))
        if kind is None:
            return False
        return (kind == "plaintext") if self.security.tls else (kind == "other")

    # -- connection ---------------------------------------------------------
    def hello(self, peer: str, timeout: float | None = None) -> dict:
        grpc = require_grpc()
        stub = self._hello_stubs[peer]
        try:
            raw = stub(json.dumps({"party": self.local_name}).encode(), timeout=timeout or self.timeout,
                       metadata=self._metadata())
        except grpc.RpcError as exc:
            raise self._error(peer, exc) from None
        try:
            info = json.loads(raw.decode())
            assert isinstance(info, dict)
        except (ValueError, AssertionError):
            raise PeerError(f"party {peer!r} at {self.peers[peer]} answered hello with garbage") from None
        if info.get("party") != peer:
            raise PeerError(f"the server at {self.peers[peer]} is party {info.get('party')!r}, not {peer!r}: "
                            "check --peer")
        return info

    def connect(self, timeout: float | None = None, peers=None) -> dict[str, dict]:
        """Wait until every peer answers (at most ``timeout`` s, default the call timeout)."""
        timeout = self.timeout if timeout is None else check_seconds(timeout, "--connect-timeout")
        peers = list(self.peers) if peers is None else list(peers)

        def one(peer):
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                try:
                    info = self.hello(peer, timeout=max(0.1, min(left, self.timeout)))
                    with self._lock:
                        self.failed.pop(peer, None)
                    log.info("%s: connected to party %r at %s", self.local_name, peer, self.peers[peer])
                    return info
                except PeerError as exc:
                    with self._lock:
                        self.failed.pop(peer, None)
                    text = str(exc)
                    retry = "is unavailable" in text or "did not answer" in text
                    if not retry or time.monotonic() + 0.25 >= deadline:
                        if retry:
                            raise PeerError(f"party {peer!r} at {self.peers[peer]} is not reachable after "
                                            f"{timeout:g} s: {text}") from None
                        raise
                    time.sleep(0.25)

        infos = self._map(one, peers)
        self.peer_info.update(infos)
        return infos

    # -- Transport ----------------------------------------------------------
    def call(self, peer: str, message):
        """:meth:`Transport.call` within ``timeout`` in all: the attempts after "busy, retry" replies
        share the call's one deadline (each attempt gets what is left of it)."""
        outer = getattr(self._deadline, "at", None)
        self._deadline.at = time.monotonic() + self.timeout if outer is None else outer
        try:
            return super().call(peer, message)
        finally:
            self._deadline.at = outer

    def _attempt_timeout(self) -> float:
        at = getattr(self._deadline, "at", None)
        return self.timeout if at is None else max(0.001, at - time.monotonic())

    def _exchange(self, peer: str, frame: bytes) -> bytes:
        grpc = require_grpc()
        if peer not in self.peers:
            raise PeerError(f"no address for party {peer!r}: give --peer {peer}=HOST:PORT")
        with self._lock:
            failed = self.failed.get(peer)
        if failed:
            raise PeerError(f"{failed} (failed earlier; not retried)")
        if len(frame) > self.max_frame_bytes:
            raise InputError(f"a message to party {peer!r} has {format_bytes(len(frame))}, more than the frame cap "
                             f"of {format_bytes(self.max_frame_bytes)} (raise --max-message-mb)")
        md = self._metadata([("x-vfl-frame-bytes", str(len(frame)))])
        try:
            call = self._exchange_stubs[peer](_chunks(frame), timeout=self._attempt_timeout(), metadata=md)
            out = bytearray()
            for chunk in call:
                out += chunk
                if len(out) > self.max_frame_bytes:
                    call.cancel()
                    raise PeerError(f"party {peer!r} sent a reply of more than {format_bytes(self.max_frame_bytes)} "
                                    "(the frame cap): refused")
            return bytes(out)
        except grpc.RpcError as exc:
            raise self._error(peer, exc) from None

    def _map(self, fn, peers):
        """Run ``fn(peer)`` for every peer concurrently; raise the first error in peer order."""
        peers = list(peers)
        if len(peers) <= 1:
            return {p: fn(p) for p in peers}
        results, errors = {}, {}
        with ThreadPoolExecutor(max_workers=len(peers), thread_name_prefix="vfl-call") as pool:
            futures = {p: pool.submit(fn, p) for p in peers}
            for p, f in futures.items():
                try:
                    results[p] = f.result()
                except Exception as exc:   # re-raised below, after every call has finished
                    errors[p] = exc
        for p in peers:
            if p in errors:
                raise errors[p]
        return results

    def call_many(self, messages: dict):
        return self._map(lambda p: self.call(p, messages[p]), list(messages))

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
