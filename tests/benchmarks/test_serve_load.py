"""benchmarks/serve_load.py's load generator: its plain-socket HTTP client reads every answer by its
Content-Length (whatever the pieces the bytes arrive in, answers back to back on one connection),
reconnects when the service closes the connection, and the throughput windows alternate between
the two services."""
from __future__ import annotations

import http.server
import importlib.util
import socket
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("serve_load_under_test", ROOT / "benchmarks" / "serve_load.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


serve_load = _load()


def _answer_bytes(status: int, body: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n"
            % (status, extra, len(body))) + body


@settings(max_examples=60, deadline=None)
@given(answers=st.lists(st.tuples(st.sampled_from([200, 422, 429, 503]), st.binary(max_size=300)),
                        min_size=1, max_size=4),
       cuts=st.lists(st.integers(min_value=1, max_value=40), max_size=30))
def test_answers_are_read_by_their_length_whatever_the_pieces(answers, cuts):
    data = b"".join(_answer_bytes(s, b, b"x-note: a\r\n" if i % 2 else b"") for i, (s, b) in enumerate(answers))
    a, b = socket.socketpair()
    try:
        pos = 0
        for n in cuts:                  # the answers' bytes in arbitrary pieces
            if pos >= len(data):
                break
            a.sendall(data[pos:pos + n])
            pos += n
        a.sendall(data[pos:])
        c = serve_load.Client("http://127.0.0.1:1")
        c.sock = b
        assert [c._answer() for _ in answers] == [s for s, _ in answers]
        assert c.buf == b""             # nothing of a later answer was taken as this one's
    finally:
        a.close()
        b.close()


def test_an_answer_without_a_length_or_cut_short_is_an_error_not_a_status():
    for data in (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{}",
                 _answer_bytes(200, b"{}")[:-1]):
        a, b = socket.socketpair()
        try:
            a.sendall(data)
            a.shutdown(socket.SHUT_WR)
            c = serve_load.Client("http://127.0.0.1:1")
            c.sock = b
            with pytest.raises(ConnectionError):
                c._answer()
        finally:
            a.close()
            b.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"       # keep-alive
    seen: list = []

    def do_POST(self):  # noqa: N802  (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append((self.path, self.headers["Content-Type"], body))
        status = 422 if body == b'{"bad": 1}' else 200
        out = b'{"ok": true}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        if body == b'{"close": 1}':
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(out)
        if body == b'{"close": 1}':
            self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Handler.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_the_client_posts_on_one_connection_and_reconnects_when_it_is_closed(server):
    c = serve_load.Client(f"http://127.0.0.1:{server.server_address[1]}")
    assert c.post(b'{"a": 1}') == 200
    first = c.sock
    assert c.post(b'{"bad": 1}') == 422
    assert c.sock is first                      # kept alive
    assert c.post(b'{"close": 1}') == 200       # the server closes after this answer
    assert c.post(b'{"a": 2}') == 200           # a new connection, transparently
    assert c.sock is not first
    c.close()
    first.close()
    assert [(p, t) for p, t, _ in _Handler.seen] == [("/v1/score", "application/json")] * 4
    assert [b for _, _, b in _Handler.seen] == [b'{"a": 1}', b'{"bad": 1}', b'{"close": 1}', b'{"a": 2}']


def test_a_service_that_is_gone_counts_as_an_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                   # nothing listens there
    assert serve_load.Client(f"http://127.0.0.1:{port}").post(b"{}") == 599


def test_the_throughput_windows_alternate_between_the_services(monkeypatch):
    calls = []

    def fake(url, payloads, seconds, clients):
        calls.append((url, seconds, clients))
        rate = 100.0 if url == "A" else 20.0
        return {"requests_per_second": rate, "errors": 0, "ok": int(rate * seconds), "seconds_measured": seconds}

    monkeypatch.setattr(serve_load, "closed_loop", fake)
    got = serve_load.alternate({"batched": "A", "single": "B"}, [], 8.0, 4, 16)
    assert [u for u, _, _ in calls] == ["A", "B", "B", "A", "A", "B", "B", "A"]
    assert {s for _, s, _ in calls} == {2.0} and {c for _, _, c in calls} == {16}
    assert got["batched"] == {"requests_per_second": 100.0, "errors": 0, "by_round": [100.0] * 4}
    assert got["single"]["requests_per_second"] == 20.0


def test_the_sustained_rate_stops_at_the_first_rate_missed_and_says_whether_the_ceiling_was_reached():
    def w(rate, p99, errors=0):
        return {"rate": rate, "p99_ms": p99, "errors": errors}

    got = serve_load.sustained_rates([w(50, 3), w(200, 9), w(400, 30), w(800, 12)], 25)
    assert got == {"rates_held_p99_under_target": [50, 200, 800], "highest_rate_p99_under_target": 200,
                   "ceiling_reached": True}
    got = serve_load.sustained_rates([w(50, 3), w(200, 9, errors=1)], 25)
    assert got["highest_rate_p99_under_target"] == 50 and got["ceiling_reached"]
    got = serve_load.sustained_rates([w(50, 3), w(200, 9)], 25)
    assert got["highest_rate_p99_under_target"] == 200 and not got["ceiling_reached"]   # every rate held
    got = serve_load.sustained_rates([w(50, None, errors=5)], 25)
    assert got["highest_rate_p99_under_target"] is None and got["ceiling_reached"]
