"""A user-space link emulator: a TCP relay on loopback that limits rate and adds one-way delay.

    link = ShapedLink(("127.0.0.1", 50051), rate_mbps=100, delay_ms=10)
    # connect to ("127.0.0.1", link.port) instead of the target
    ...
    link.close()

Every connection accepted on ``link.port`` is relayed to the target. Each direction behaves
like a serial link of ``rate_mbps`` followed by a wire of ``delay_ms``: a chunk that arrives
at time ``t`` starts to leave when the link is free, occupies it for ``len * 8 / rate``
seconds, and is delivered ``delay`` seconds after its last byte left. The relay holds at
most ``buffer_bytes`` per direction (default: twice the bandwidth-delay product, at least
256 KiB); beyond that it stops reading, so TCP's own flow control pushes back on the sender
as a router's full queue would. Bytes are counted each way (``up``: towards the target).

No root, no kernel modules: portable, unlike ``tc netem`` (which this machine lacks;
``tc ... tbf`` inside a network namespace can rate-limit and serves as a cross-check).
The profiles of the WAN benchmark are in :data:`PROFILES`.
"""
from __future__ import annotations

import socket
import threading
import time
from collections import deque

#: name -> (rate in Mbit/s or None for unlimited, one-way delay in ms)
PROFILES: dict[str, tuple[float | None, float]] = {
    "lan": (None, 0.0),
    "1gbit-1ms": (1000.0, 1.0),
    "100mbit-10ms": (100.0, 10.0),
    "10mbit-50ms": (10.0, 50.0),
}


class LinkSchedule:
    """When the chunks of one direction are delivered: a chunk of ``n`` bytes arriving at ``now``
    starts to leave when the link is free (or at once), occupies it for ``n / rate_bytes`` seconds
    and is delivered ``delay`` seconds after its last byte left (unlimited rate: ``now + delay``).
    Pure arithmetic on the times it is given, so it is tested without a clock."""

    def __init__(self, rate_bytes: float | None, delay: float):
        self.rate_bytes, self.delay = rate_bytes, float(delay)
        self.link_free = 0.0

    def deliver_at(self, now: float, n: int) -> float:
        if self.rate_bytes is None:
            return now + self.delay
        start = max(now, self.link_free)
        self.link_free = start + n / self.rate_bytes
        return self.link_free + self.delay


class _Direction:
    """One direction of one connection: a reader thread schedules chunks, a writer delivers them."""

    def __init__(self, link: "ShapedLink", src: socket.socket, dst: socket.socket, name: str):
        self.link, self.src, self.dst, self.name = link, src, dst, name
        self.queue: deque[tuple[float, bytes]] = deque()
        self.queued = 0
        self.schedule = LinkSchedule(link.rate_bytes, link.delay)
        self.eof = False
        self.cond = threading.Condition()
        self.threads = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._write, daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self):
        link = self.link
        try:
            while True:
                data = self.src.recv(link.chunk_bytes)
                if not data:
                    break
                now = time.perf_counter()
                with self.cond:
                    while self.queued >= link.buffer_bytes and not link.closed:
                        self.cond.wait(0.05)
                    self.queue.append((self.schedule.deliver_at(now, len(data)), data))
                    self.queued += len(data)
                    self.cond.notify_all()
        except OSError:
            pass
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def _write(self):
        try:
            while True:
                with self.cond:
                    while not self.queue and not self.eof:
                        self.cond.wait()
                    if not self.queue:
                        break
                    deliver, data = self.queue[0]
                wait = deliver - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                self.dst.sendall(data)
                self.link.count(self.name, len(data))
                with self.cond:
                    self.queue.popleft()
                    self.queued -= len(data)
                    self.cond.notify_all()
        except OSError:
            pass
        try:
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class ShapedLink:
    """Relays TCP connections from ``127.0.0.1:port`` to ``target`` through an emulated link."""

    def __init__(self, target: tuple[str, int], rate_mbps: float | None = None, delay_ms: float = 0.0,
                 buffer_bytes: int | None = None, host: str = "127.0.0.1"):
        if rate_mbps is not None and not rate_mbps > 0:
            raise ValueError(f"rate_mbps must be positive or None, got {rate_mbps!r}")
        if not delay_ms >= 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms!r}")
        self.target = target
        self.rate_bytes = None if rate_mbps is None else rate_mbps * 1e6 / 8
        self.delay = delay_ms / 1000.0
        if buffer_bytes is None:
            bdp = 0 if self.rate_bytes is None else self.rate_bytes * max(self.delay, 0.001)
            buffer_bytes = max(int(2 * bdp), 256 * 1024)
        self.buffer_bytes = int(buffer_bytes)
        # small chunks at low rates keep delivery smooth; large ones keep a fast link cheap
        per_2ms = 1 << 20 if self.rate_bytes is None else self.rate_bytes * 0.002
        self.chunk_bytes = int(min(max(per_2ms, 4096), 256 * 1024))
        self.up = self.down = 0
        self.connections = 0
        self.closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def profile(cls, name: str, target: tuple[str, int]) -> "ShapedLink":
        if name not in PROFILES:
            raise ValueError(f"unknown link profile {name!r}; known: {', '.join(PROFILES)}")
        rate, delay = PROFILES[name]
        return cls(target, rate, delay)

    def count(self, direction: str, n: int) -> None:
        with self._lock:
            if direction == "up":
                self.up += n
            else:
                self.down += n

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.connections += 1
                self._sockets += [client, server]
            _Direction(self, client, server, "up")
            _Direction(self, server, client, "down")

    def close(self) -> None:
        self.closed = True
        for s in [self._sock, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
