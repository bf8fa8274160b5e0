"""Transports: how one party's messages reach another.

The protocol code only ever calls :meth:`Transport.call` (one request, one
reply) and :meth:`Transport.call_many`; it never knows whether the peer is in
the same process or across the network. Every message is serialized to bytes
on the way, so byte counts are true and no party can touch another's objects.
:meth:`Transport.call` is also the one place where a reply is checked against
the request's declared reply types (:data:`protocols.messages.REPLIES`).
"""
from __future__ import annotations

import contextvars
import random
import time
from abc import ABC, abstractmethod
from collections import defaultdict
from contextlib import contextmanager
from typing import Callable

from datasets.errors import InputError, PeerError, ProtocolError, VFLError
from protocols import messages as msg
from protocols.serialization import dumps, loads

# --- the caller's deadline, seen by long-running handlers ---------------------
_CALLER_ALIVE: contextvars.ContextVar = contextvars.ContextVar("vfl_caller_alive", default=None)


@contextmanager
def caller_deadline(alive: Callable[[], bool]):
    """While handling one request: ``alive()`` says whether the caller still waits (its deadline
    has not passed, it did not cancel). A server sets it; :func:`check_deadline` reads it."""
    token = _CALLER_ALIVE.set(alive)
    try:
        yield
    finally:
        _CALLER_ALIVE.reset(token)


def check_deadline(what: str) -> None:
    """Stop work nobody waits for: raise :class:`ProtocolError` if the caller's deadline passed.
    Handlers call it between chunks of long work (no-op outside a server call)."""
    alive = _CALLER_ALIVE.get()
    if alive is not None and not alive():
        raise ProtocolError(f"the caller's deadline passed (or it cancelled): {what} stopped")


class BusyError(ProtocolError):
    """Raised by a handler at a limit right now (e.g. too many prediction sessions of one client):
    the caller gets an :class:`ErrorReply` of kind BUSY with ``retry_after`` seconds, retries
    (see :meth:`Transport.call`) and, if the receiver stays busy, raises :class:`PeerBusyError`."""

    def __init__(self, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.retry_after = float(retry_after)


class PeerBusyError(PeerError):
    """A peer stayed busy through every retry :meth:`Transport.call` allows."""


class Transport(ABC):
    """Request/reply channel from one local party to named peers.

    A request refused with "busy, retry" (:class:`ErrorReply` of kind BUSY: the receiver did no
    work) is sent again after the receiver's ``retry_after`` hint, growing by ``busy_backoff``
    per attempt (with jitter, each wait at most ``busy_max_sleep`` s), at most ``busy_retries``
    times and ``busy_max_wait`` s in all; then :class:`PeerBusyError`."""

    busy_retries = 40
    busy_max_wait = 60.0
    busy_max_sleep = 2.0
    busy_backoff = 1.5

    def __init__(self, local_name: str):
        self.local_name = local_name
        self.busy_waits: dict[str, int] = defaultdict(int)      # retries after BUSY, per peer
        self.bytes_sent: dict[tuple[str, str], int] = defaultdict(int)
        self.messages_sent: dict[tuple[str, str], int] = defaultdict(int)

    @abstractmethod
    def _exchange(self, peer: str, frame: bytes) -> bytes:
        """Deliver one request frame to ``peer`` and return its reply frame."""

    def _time_left(self) -> float | None:
        """Seconds left of the current call's own deadline (``None``: no deadline): a "busy, retry"
        wait that would pass it ends the retries at once (:class:`PeerBusyError`)."""
        return None

    def call(self, peer: str, message):
        """Send the request ``message`` to ``peer``; return its reply. An :class:`ErrorReply`
        raises (:class:`InputError` or :class:`PeerError`), and so does a reply of a type the
        request does not declare (:class:`PeerError` naming the peer, the request and the reply)."""
        expected = msg.REPLIES.get(type(message))
        if expected is None:
            raise ProtocolError(f"{type(message).__name__} is not a request (no reply declared in "
                                "protocols.messages.REPLIES)")
        frame = dumps(message)
        waited, attempt = 0.0, 0
        while True:
            reply = self._roundtrip(peer, frame, message)
            if not (isinstance(reply, msg.ErrorReply) and reply.kind == msg.ErrorKind.BUSY):
                break
            hint = min(max(float(reply.retry_after), 0.01), self.busy_max_sleep)
            wait = min(hint * self.busy_backoff ** attempt, self.busy_max_sleep) * random.uniform(0.75, 1.25)
            left = self._time_left()
            if attempt >= self.busy_retries or waited + wait > self.busy_max_wait or (left is not None
                                                                                     and wait >= left):
                raise PeerBusyError(f"party {peer!r} is busy (still after {attempt} retries over {waited:.1f} s): "
                                    f"{reply.message}")
            time.sleep(wait)
            waited += wait
            attempt += 1
            self.busy_waits[peer] += 1
        if isinstance(reply, msg.ErrorReply):
            if reply.kind == msg.ErrorKind.INPUT:
                raise InputError(f"party {peer!r}: {reply.message}")
            raise PeerError(f"party {peer!r} refused {type(message).__name__}: {reply.message}")
        if not isinstance(reply, expected):
            raise PeerError(f"party {peer!r} answered {type(message).__name__} with {type(reply).__name__}, "
                            f"expected {' or '.join(t.__name__ for t in expected)}")
        return reply

    def _roundtrip(self, peer: str, frame: bytes, message):
        self.bytes_sent[(self.local_name, peer)] += len(frame)
        self.messages_sent[(self.local_name, peer)] += 1
        reply_frame = self._exchange(peer, frame)
        self.bytes_sent[(peer, self.local_name)] += len(reply_frame)
        self.messages_sent[(peer, self.local_name)] += 1
        try:
            return loads(reply_frame)
        except ProtocolError as exc:
            raise PeerError(f"party {peer!r} sent a malformed reply to {type(message).__name__}: {exc}") from None

    def call_many(self, messages: dict):
        """Send one message to each peer; return ``{peer: reply}`` (sequential by default)."""
        return {peer: self.call(peer, m) for peer, m in messages.items()}

    def total_bytes(self) -> int:
        return sum(self.bytes_sent.values())

    def bytes_report(self) -> dict[str, int]:
        """``{"sender->receiver": bytes}``."""
        return {f"{a}->{b}": n for (a, b), n in sorted(self.bytes_sent.items())}


Handler = Callable[[bytes], bytes]


class InMemoryTransport(Transport):
    """All parties in one process; frames still go through bytes.

    ``handlers`` maps a peer name to a function taking a request frame and
    returning a reply frame (see :func:`frame_handler`). ``record=True`` keeps
    every frame as ``(sender, receiver, bytes)`` so tests can read exactly what
    each party received.
    """

    def __init__(self, local_name: str, handlers: dict[str, Handler], record: bool = False):
        super().__init__(local_name)
        self.handlers = dict(handlers)
        self.record = record
        self.log: list[tuple[str, str, bytes]] = []

    def _exchange(self, peer: str, frame: bytes) -> bytes:
        if peer not in self.handlers:
            raise PeerError(f"no party named {peer!r} in this federation")
        reply = self.handlers[peer](frame)
        if self.record:
            self.log.append((self.local_name, peer, frame))
            self.log.append((peer, self.local_name, reply))
        return reply


def frame_handler(handle: Callable) -> Handler:
    """Wrap a message-level ``handle(message) -> reply`` into a bytes-level handler.

    Errors raised by the party become an :class:`ErrorReply` so that a server
    keeps serving and the caller gets a message naming the problem.
    """
    def _handle(frame: bytes) -> bytes:
        try:
            request = loads(frame)
            reply = handle(request)
        except BusyError as exc:
            reply = msg.ErrorReply(msg.ErrorKind.BUSY, str(exc), min(max(exc.retry_after, 0.0), 3600.0))
        except InputError as exc:
            reply = msg.ErrorReply(msg.ErrorKind.INPUT, str(exc))
        except (ProtocolError, VFLError) as exc:
            reply = msg.ErrorReply(msg.ErrorKind.PROTOCOL, str(exc))
        return dumps(reply)

    return _handle
