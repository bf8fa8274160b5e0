"""The WAN benchmark's link emulator. When each chunk is due is pure arithmetic
(:class:`linkemu.LinkSchedule`), tested exactly without a clock; through real sockets, what can
be asserted whatever the machine's speed: nothing arrives sooner than the delay and the rate
allow (a busy machine only makes a transfer slower), and every byte arrives."""
from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from linkemu import PROFILES, LinkSchedule, ShapedLink  # noqa: E402


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


def test_a_schedule_delivers_after_the_link_is_free_plus_the_delay():
    sch = LinkSchedule(rate_bytes=1000.0, delay=0.05)
    assert sch.deliver_at(0.0, 500) == pytest.approx(0.5 + 0.05)       # 0.5 s on the link, then the wire
    assert sch.deliver_at(0.1, 500) == pytest.approx(1.0 + 0.05)       # queued behind the first
    assert sch.deliver_at(3.0, 100) == pytest.approx(3.1 + 0.05)       # the link idle: starts at its arrival
    free = LinkSchedule(rate_bytes=None, delay=0.04)
    assert [free.deliver_at(t, 10**9) for t in (0.0, 0.0, 1.0)] == [0.04, 0.04, 1.04]


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(min_value=1e3, max_value=1e9), delay=st.floats(min_value=0.0, max_value=0.2),
       chunks=st.lists(st.tuples(st.floats(min_value=0.0, max_value=0.5), st.integers(min_value=1, max_value=1 << 18)),
                       min_size=1, max_size=40))
def test_a_schedule_never_beats_the_rate_or_the_delay_and_keeps_the_order(rate, delay, chunks):
    sch = LinkSchedule(rate, delay)
    now, due, sent = 0.0, [], 0
    for gap, n in chunks:
        now += gap
        d = sch.deliver_at(now, n)
        sent += n
        assert d >= now + n / rate + delay - 1e-9           # its own bytes on the link, then the wire
        assert d >= sent / rate + delay - 1e-9              # everything so far through the link since time 0
        due.append(d)
    assert due == sorted(due)                               # in order: a stream is not reordered
    back_to_back = LinkSchedule(rate, delay)
    last = [back_to_back.deliver_at(0.0, n) for _, n in chunks][-1]
    assert last == pytest.approx(sent / rate + delay, rel=1e-9)     # backlogged: exactly the rate


def test_nothing_comes_back_sooner_than_twice_the_delay():
    server = _Server("echo")
    with ShapedLink(server.addr, rate_mbps=None, delay_ms=40) as link, _connect(link) as s:
        rtts = []
        for _ in range(4):
            t0 = time.perf_counter()
            s.sendall(b"x" * 64)
            got = b""
            while len(got) < 64:
                got += s.recv(64)
            assert got == b"x" * 64
            rtts.append(time.perf_counter() - t0)
    server.close()
    assert min(rtts) >= 2 * 0.040 * 0.99, f"a round trip of {min(rtts) * 1000:.1f} ms through a 40 ms link"


@pytest.mark.parametrize("rate_mbps", [20.0, 80.0])
def test_a_transfer_arrives_whole_and_never_faster_than_the_rate(rate_mbps):
    server = _Server("sink")
    total = int(rate_mbps * 1e6 / 8 * 0.3)            # 0.3 s worth of bytes at the set rate
    with ShapedLink(server.addr, rate_mbps=rate_mbps, delay_ms=0) as link:
        s = _connect(link)
        t0 = time.perf_counter()
        s.sendall(b"\0" * total)
        s.shutdown(socket.SHUT_WR)
        assert server.done.wait(60), "the sink never saw the end of the stream"
        s.close()
    server.close()
    assert server.received == total
    assert link.up == total
    measured = total * 8 / (server.last - t0) / 1e6
    assert measured <= rate_mbps * 1.01, f"measured {measured:.1f} Mbit/s through a {rate_mbps} Mbit/s link"


def test_rate_and_delay_add_up():
    """A transfer takes at least size/rate + delay, not one or the other."""
    server = _Server("sink")
    total = int(10e6 / 8 * 0.2)                       # 0.2 s at 10 Mbit/s
    with ShapedLink(server.addr, rate_mbps=10, delay_ms=50) as link:
        s = _connect(link)
        t0 = time.perf_counter()
        s.sendall(b"\0" * total)
        s.shutdown(socket.SHUT_WR)
        assert server.done.wait(60)
        s.close()
    server.close()
    assert server.received == total
    assert server.last - t0 >= (0.2 + 0.05) * 0.99


def test_profiles_and_bad_settings():
    assert set(PROFILES) == {"lan", "1gbit-1ms", "100mbit-10ms", "10mbit-50ms"}
    with pytest.raises(ValueError, match="unknown link profile"):
        ShapedLink.profile("56k", ("127.0.0.1", 1))
    with pytest.raises(ValueError, match="rate_mbps"):
        ShapedLink(("127.0.0.1", 1), rate_mbps=0)
    with pytest.raises(ValueError, match="delay_ms"):
        ShapedLink(("127.0.0.1", 1), delay_ms=-1)
