"""The WAN benchmark's link emulator: measured rate and delay within 10% of the setting."""
from __future__ import annotations

import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from linkemu import PROFILES, ShapedLink  # noqa: E402


class _Server:
    """Echoes what it reads (mode "echo") or swallows it and records when the last byte came ("sink")."""

    def __init__(self, mode: str):
        self.mode = mode
        self.received = 0
        self.last = None
        self.done = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.addr = self.sock.getsockname()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        conn, _ = self.sock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    break
                if self.mode == "echo":
                    conn.sendall(data)
                else:
                    self.received += len(data)
                    self.last = time.perf_counter()
        self.done.set()

    def close(self):
        self.sock.close()


def _connect(link: ShapedLink) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", link.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def test_one_way_delay_is_within_ten_percent():
    server = _Server("echo")
    with ShapedLink(server.addr, rate_mbps=None, delay_ms=40) as link, _connect(link) as s:
        rtts = []
        for _ in range(8):
            t0 = time.perf_counter()
            s.sendall(b"x" * 64)
            got = b""
            while len(got) < 64:
                got += s.recv(64)
            rtts.append(time.perf_counter() - t0)
    server.close()
    one_way = statistics.median(rtts) / 2
    assert abs(one_way - 0.040) <= 0.004, f"one-way delay {one_way * 1000:.1f} ms, set 40 ms"


@pytest.mark.parametrize("rate_mbps", [20.0, 80.0])
def test_rate_is_within_ten_percent(rate_mbps):
    server = _Server("sink")
    total = int(rate_mbps * 1e6 / 8 * 0.6)            # 0.6 s worth of bytes at the set rate
    with ShapedLink(server.addr, rate_mbps=rate_mbps, delay_ms=0) as link:
        s = _connect(link)
        t0 = time.perf_counter()
        s.sendall(b"\0" * total)
        s.shutdown(socket.SHUT_WR)
        assert server.done.wait(10), "the sink never saw the end of the stream"
        s.close()
    server.close()
    assert server.received == total
    assert link.up == total
    measured = total * 8 / (server.last - t0) / 1e6
    assert abs(measured - rate_mbps) <= 0.1 * rate_mbps, f"measured {measured:.1f} Mbit/s, set {rate_mbps}"


def test_rate_and_delay_add_up():
    """A transfer costs about size/rate + delay, not one or the other."""
    server = _Server("sink")
    total = int(10e6 / 8 * 0.4)                       # 0.4 s at 10 Mbit/s
    with ShapedLink(server.addr, rate_mbps=10, delay_ms=50) as link:
        s = _connect(link)
        t0 = time.perf_counter()
        s.sendall(b"\0" * total)
        s.shutdown(socket.SHUT_WR)
        assert server.done.wait(10)
        s.close()
    server.close()
    expected = 0.4 + 0.05
    assert abs((server.last - t0) - expected) <= 0.1 * expected


def test_profiles_and_bad_settings():
    assert set(PROFILES) == {"lan", "1gbit-1ms", "100mbit-10ms", "10mbit-50ms"}
    with pytest.raises(ValueError, match="unknown link profile"):
        ShapedLink.profile("56k", ("127.0.0.1", 1))
    with pytest.raises(ValueError, match="rate_mbps"):
        ShapedLink(("127.0.0.1", 1), rate_mbps=0)
    with pytest.raises(ValueError, match="delay_ms"):
        ShapedLink(("127.0.0.1", 1), delay_ms=-1)
