"""Issue 36, the re-probe's last three items, with real processes and real gRPC + mutual TLS: two
processes training with one certificate (item 7: the newer session takes over, the older one is told),
a passive server whose certificate carries another party's names (item 9: refused by the active
party), stalled uploads of members without a session (item 5: capped per connection and in all, an
honest training completes)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from support import cli_command, small_frames, start_passive  # noqa: E402

from protocols.certs import _load_ca, issue_party_cert  # noqa: E402
from protocols.grpc_client import GrpcTransport  # noqa: E402
from protocols.grpc_security import Security  # noqa: E402

pytestmark = pytest.mark.slow   # real sockets, servers and party processes

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, timeout=300):
    return subprocess.run(cli_command(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    r = _run("certs", "--out", d / "certs", "--party", "bank", "--party", "telco", "--party", "scorer")
    assert r.returncode == 0, r.stderr
    return d


def _stop_all(children):
    for p in children:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
        for f in (p.stdout, p.stderr):
            if f is not None:
                f.close()


def _wait_line(proc, text: str, limit: float = 120.0) -> str:
    """Read ``proc``'s stderr until a line holds ``text`` (a bounded wait: fails after ``limit`` s)."""
    seen = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            if text in line:
                return line
    raise AssertionError(f"no line with {text!r} within {limit:g} s; got: {''.join(seen)[-2000:]}")


# -- item 7: two processes training with the same certificate --------------------------------------------
def test_item7_a_second_process_with_the_same_certificate_takes_over(pki, tmp_path):
    """Process A trains as bank; while it is stopped (SIGSTOP) after its first round, process B starts a
    training with the same certificate: B proceeds at once and completes; A, continued, is told that its
    session was taken over by a newer session (one `Error:` line naming the party, exit code 1)."""
    a, b, _ = small_frames(n=120)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    children = []
    try:
        addr = start_passive(children, tmp_path, "telco", "--data", tmp_path / "b.csv", "--model-dir",
                             tmp_path / "mt", "--tls-dir", pki / "certs", "--allow-client", "bank")
        common = ("--tls-dir", pki / "certs", "--name", "bank", "--peer", f"telco={addr}", "--data",
                  tmp_path / "a.csv", "--mode", "plain", "--depth", 2, "--timeout", 600, "--connect-timeout", 60)
        first = subprocess.Popen(cli_command("party", "active", *common, "--model-dir", tmp_path / "m1",
                                             "--rounds", 500), cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        children.append(first)
        _wait_line(first, "| 1/500 [")
        os.kill(first.pid, signal.SIGSTOP)
        try:
            r = _run("party", "active", *common, "--model-dir", tmp_path / "m2", "--rounds", 2, "--quiet")
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert r.returncode == 0, r.stderr
        assert "saved model" in r.stdout
        out, err = first.communicate(timeout=300)
        assert first.returncode == 1, err[-3000:]
        errors = [line for line in err.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, err[-3000:]
        assert "party 'telco'" in errors[0] and "was taken over by a newer session" in errors[0], errors
        assert "Traceback" not in err and "restart the failed party" not in errors[0]
        assert "taken over" in (tmp_path / "telco.err").read_text()
    finally:
        _stop_all(children)


# -- item 9: the active party checks that a passive server's certificate carries only its own names ------
def _rogue_certs(pki, out: Path, hosts: tuple[str, ...]) -> Path:
    """A copy of the federation's CA and bank's files, with a telco certificate issued by that CA that
    also carries ``hosts`` (e.g. bank's or scorer's name)."""
    out.mkdir()
    for f in ("ca.pem", "ca.key", "bank.pem", "bank.key"):
        (out / f).write_bytes((pki / "certs" / f).read_bytes())
    (out / "bank.key").chmod(0o600)
    (out / "ca.key").chmod(0o600)
    ca_cert, ca_key = _load_ca(out)
    issue_party_cert(out, "telco", ca_cert, ca_key, hosts=hosts)
    return out


@pytest.mark.parametrize("extra", [("scorer",), ("bank", "127.0.0.1")])
def test_item9_a_server_certificate_carrying_another_partys_name_is_refused(pki, tmp_path, extra):
    """telco serves with a certificate of the federation's CA that also carries scorer's (or bank's)
    name: the active party refuses it before training, one `Error:` line naming telco and the rule;
    the same training against telco's own certificate succeeds."""
    a, b, _ = small_frames(n=60)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    rogue = _rogue_certs(pki, tmp_path / "rogue", extra)
    children = []
    try:
        for tls_dir, ok in ((rogue, False), (pki / "certs", True)):
            addr = start_passive(children, tmp_path, "telco", "--data", tmp_path / "b.csv", "--model-dir",
                                 tmp_path / f"mt{ok}", "--tls-dir", tls_dir, "--allow-client", "bank")
            r = _run("party", "active", "--tls-dir", pki / "certs", "--name", "bank", "--peer", f"telco={addr}",
                     "--data", tmp_path / "a.csv", "--model-dir", tmp_path / f"mb{ok}", "--mode", "plain",
                     "--rounds", 1, "--depth", 2, "--quiet", "--connect-timeout", 60)
            if ok:
                assert r.returncode == 0, r.stderr
                continue
            assert r.returncode == 1, r.stdout + r.stderr
            errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
            assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
            assert "party 'telco'" in errors[0] and "rule 'own names'" in errors[0], errors
            assert repr(extra[0]) in errors[0], errors
            assert not (tmp_path / "mbFalse").exists() or not any((tmp_path / "mbFalse").glob("*.json"))
    finally:
        _stop_all(children)


# -- item 5: members without a session stalling uploads cannot hold the server --------------------------
class _Stalls:
    """``n`` request streams of member ``name`` (one connection) that send a few bytes and then
    nothing, renewed as soon as one ends (cut by the read watch, or answered "busy")."""

    def __init__(self, name: str, addr: str, security: Security, n: int):
        self.transport = GrpcTransport(name, {"telco": addr}, security, timeout=120)
        self.stub = self.transport._exchange_stubs["telco"]
        self.release, self.stopped = threading.Event(), threading.Event()
        self.calls = [self._open() for _ in range(n)]
        self.thread = threading.Thread(target=self._renew, daemon=True)
        self.thread.start()

    def _stalled(self):
        yield b"VFL1"
        self.release.wait(120)

    def _open(self):
        return self.stub(self._stalled(), timeout=120, metadata=self.transport._metadata())

    def _renew(self):
        while not self.stopped.wait(0.1):
            for i, c in enumerate(self.calls):
                if c.done():
                    self.calls[i] = self._open()

    def stop(self):
        self.stopped.set()
        self.thread.join(10)
        self.release.set()
        for c in self.calls:
            c.cancel()
        self.transport.close()


def test_item5_stalled_uploads_of_members_without_a_session_cannot_hold_the_server(pki, tmp_path):
    """scorer and shop, members that may predict at telco but hold no session, keep 16 stalled uploads
    each open (renewed as soon as one ends). Before: they held all 16 workers (8 each, the per-client
    cap) and an honest training waited on them past its --timeout. Now: calls without a session are
    capped per connection and in all ("busy, retry", named), so bank trains within its --timeout."""
    r = _run("certs", "--out", pki / "certs", "--party", "shop")
    assert r.returncode == 0 or "already exist" in r.stderr, r.stderr
    a, b, _ = small_frames(n=80)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    fed = tmp_path / "federation.toml"
    fed.write_text('[federation]\nactive = "bank"\n[parties.bank]\n[parties.telco]\naddress = "127.0.0.1:1"\n'
                   'predict = ["bank", "scorer", "shop"]\n[parties.scorer]\n[parties.shop]\n')
    children, stalls = [], []
    try:
        addr = start_passive(children, tmp_path, "telco", "--data", tmp_path / "b.csv", "--model-dir",
                             tmp_path / "mt", "--tls-dir", pki / "certs", "--federation", fed)
        fed.write_text(fed.read_text().replace("127.0.0.1:1", addr))
        stalls = [_Stalls(who, addr, Security.from_options(who, pki / "certs"), 16) for who in ("scorer", "shop")]
        r = _run("party", "active", "--federation", fed, "--tls-dir", pki / "certs", "--data", tmp_path / "a.csv",
                 "--model-dir", tmp_path / "mb", "--mode", "plain", "--rounds", 2, "--depth", 2, "--quiet",
                 "--timeout", 15, "--connect-timeout", 60)
        assert r.returncode == 0, r.stderr
        assert "saved model" in r.stdout
    finally:
        for s in stalls:
            s.stop()
        _stop_all(children)
    log = (tmp_path / "telco.err").read_text()
    for who in ("scorer", "shop"):
        assert any(f"{who} (certificate {who}" in line and "holds no session and 2 calls without a session" in line
                   for line in log.splitlines()), log[-3000:]
