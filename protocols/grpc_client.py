"""The client side of the gRPC transport: :class:`GrpcTransport` talks to named peers with a
deadline on every call, marks an unreachable peer failed, calls several peers at once, and
tells a TLS client talking to a plaintext server (:func:`probe_plaintext`) what is wrong.
"""
from __future__ import annotations

import json
import logging
import secrets
import socket
import ssl
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from datasets.errors import InputError, PeerError
from protocols.certs import check_party_name, own_names_refusal
from protocols.grpc_security import Security, check_address
from protocols.grpc_wire import (
    CALL,
    CHUNK_BYTES,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_TIMEOUT,
    EXCHANGE,
    HELLO,
    MAX_ONE_MESSAGE,
    chunks,
    grpc_options,
    require_grpc,
)
from protocols.transport import Transport
from protocols.units import check_seconds, format_bytes

log = logging.getLogger("vfl.net")


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


def server_certificate_names(address: str, security: Security, timeout: float) -> set[str]:
    """The names (common name, DNS names) of the certificate the TLS server at ``address`` presents,
    read in a mutual TLS handshake of our own (gRPC's Python client does not show the server's
    certificate); it must be issued by our CA (raises ``ssl.SSLError``/``OSError`` otherwise)."""
    host, _, port = address.rpartition(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False          # gRPC checked the name the peer is dialled by; here: all its names
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=security.ca_pem.decode())
    ctx.set_alpn_protocols(["h2"])
    with tempfile.TemporaryDirectory(prefix="vfl-tls-") as d:     # 0700: the key never leaves it
        cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
        key.touch(mode=0o600)
        key.write_bytes(security.key_pem)
        cert.write_bytes(security.cert_pem)
        ctx.load_cert_chain(cert, key)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
        with ctx.wrap_socket(sock) as tls:
            peer = tls.getpeercert() or {}
    names = {v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"}
    names |= {v for k, v in peer.get("subjectAltName", ()) if k == "DNS"}
    return names


#: what a TLS failure that proves nothing about the certificates says (retried while connecting)
HANDSHAKE_UNFINISHED = "retried until --connect-timeout"
#: what only a refused certificate makes OpenSSL or gRPC say: a wrong CA, a certificate not issued for
#: the peer's name, our certificate refused by the peer (an alert), a TLS version mismatch
_TLS_REFUSALS = ("certificate_verify_failed", "certificate verify failed", "hostname verification",
                 "unknown_ca", "unknown ca", "bad_certificate", "bad certificate", "certificate_unknown",
                 "certificate_expired", "certificate_revoked", "unsupported_certificate", "wrong_version_number",
                 "no_shared_cipher", "handshake_failure", "peer did not return a certificate")


def tls_refusal(details: str) -> bool:
    """Whether a failed TLS handshake was a refusal of certificates (never retried), not a
    handshake cut short by a loaded server (a closed socket, a reset, a timeout: issue 36, item 4,
    64 concurrent clients of one passive party were told "wrong CA" and not retried)."""
    low = (details or "").lower()
    return any(w in low for w in _TLS_REFUSALS)


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
        #: this transport's tag, sent with every call (``x-vfl-session``): a passive party tells this
        #: process apart from another one with the same certificate (issue 36, item 7)
        self.session_tag = secrets.token_hex(8)
        self.peer_info: dict[str, dict] = {}
        self._channels, self._exchange_stubs, self._hello_stubs, self._call_stubs = {}, {}, {}, {}
        self._no_call: set[str] = set()         # peers without the Call method (older versions): Exchange only
        self._lock = threading.Lock()
        for peer, addr in self.peers.items():
            opts = grpc_options(self.max_frame_bytes, "client") + [
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
            self._call_stubs[peer] = ch.unary_unary(CALL)
            self._hello_stubs[peer] = ch.unary_unary(HELLO)

    # -- helpers ------------------------------------------------------------
    def _metadata(self, extra=()):
        md = [("x-vfl-party", self.local_name), ("x-vfl-session", self.session_tag), *extra]
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
            if tls_refusal(details):
                text = (f"TLS handshake with {where} failed (wrong CA, or a certificate not issued for "
                        f"{peer!r}, or our certificate was refused): {details}")
            elif any(w in low for w in ("handshake", "ssl", "certificate", "tls", "verification")):
                text = (f"TLS handshake with {where} did not complete (an overloaded server or network; "
                        f"{HANDSHAKE_UNFINISHED}): {details}")
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
                    if self.security.tls:
                        self._check_server_names(peer, deadline)
                    return info
                except PeerError as exc:
                    with self._lock:
                        self.failed.pop(peer, None)
                    text = str(exc)
                    retry = "is unavailable" in text or "did not answer" in text or HANDSHAKE_UNFINISHED in text
                    if not retry or time.monotonic() + 0.25 >= deadline:
                        if retry:
                            raise PeerError(f"party {peer!r} at {self.peers[peer]} is not reachable after "
                                            f"{timeout:g} s: {text}") from None
                        raise
                    time.sleep(0.25)

        infos = self._map(one, peers)
        self.peer_info.update(infos)
        return infos

    def _check_server_names(self, peer: str, deadline: float) -> None:
        """Issue 36, item 9: the server's certificate must carry only ``peer``'s own names (the rule
        the passive side applies to its callers): one issued for another party too, or carrying
        several parties' names, would let its holder pass as them; refused, never retried. A
        handshake of ours cut short (a loaded server) is retried until ``deadline``."""
        addr = self.peers[peer]
        while True:
            try:
                names = server_certificate_names(addr, self.security, max(0.5, min(5.0, deadline - time.monotonic())))
                break
            except (OSError, ValueError) as exc:    # ssl.SSLError is an OSError
                if time.monotonic() + 0.25 >= deadline:
                    raise PeerError(f"could not read the certificate of party {peer!r} at {addr}: {exc}") from None
                time.sleep(0.25)
        why = own_names_refusal(peer, names)
        if why is not None:
            with self._lock:
                self.failed[peer] = f"party {peer!r} refused: its certificate breaks the rule 'own names'"
            raise PeerError(f"refused the server of party {peer!r} at {addr}: rule 'own names': its certificate "
                            f"{sorted(names)} must carry only {peer!r}'s own names, but {why}")

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

    @contextmanager
    def deadline(self, seconds: float):
        """Calls made in this thread within the block end within ``seconds`` from now (instead of
        ``timeout`` each): a request with its own deadline (online scoring) never waits past it."""
        outer = getattr(self._deadline, "at", None)
        self._deadline.at = time.monotonic() + max(0.0, float(seconds))
        try:
            yield
        finally:
            self._deadline.at = outer

    def reset(self, peer: str) -> None:
        """Forget that ``peer`` failed: the next call tries it again (a long-lived client whose
        peer restarted)."""
        with self._lock:
            self.failed.pop(peer, None)

    def _time_left(self) -> float | None:
        at = getattr(self._deadline, "at", None)
        return None if at is None else at - time.monotonic()

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
            if len(frame) <= CHUNK_BYTES and self.max_frame_bytes < MAX_ONE_MESSAGE and peer not in self._no_call:
                try:        # one message each way, no stream (see protocols.grpc_wire)
                    return self._read_reply(peer, (self._call_stubs[peer](frame, timeout=self._attempt_timeout(),
                                                                          metadata=md),))
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    with self._lock:            # an older server: it never ran the request
                        self._no_call.add(peer)
            return self._read_reply(peer, self._exchange_stubs[peer](chunks(frame), timeout=self._attempt_timeout(),
                                                                     metadata=md))
        except grpc.RpcError as exc:
            raise self._error(peer, exc) from None

    def _read_reply(self, peer: str, call) -> bytes:
        """The reply frame of a call (its chunks, or a Call's one message), joined within the frame cap."""
        out = bytearray()
        for chunk in call:
            out += chunk
            if len(out) > self.max_frame_bytes:
                if hasattr(call, "cancel"):
                    call.cancel()
                raise PeerError(f"party {peer!r} sent a reply of more than {format_bytes(self.max_frame_bytes)} "
                                "(the frame cap): refused")
        if not out:     # a server closes a call it dropped (e.g. queued past its deadline) with no reply
            raise PeerError(f"party {peer!r} at {self.peers[peer]} ended the call without a reply (it dropped "
                            f"the request: the call's deadline of {self.timeout:g} s (--timeout) ran out "
                            "before it was served, or the stream was cancelled)")
        return bytes(out)

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
