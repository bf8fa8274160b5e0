"""Issue 36, the re-probe, with real processes and real gRPC + mutual TLS: handshakes cut short under
load are retried (item 4; 64 concurrent `vfl predict` processes), the federation file's predict-only
party is never trained with (item 9), simulation with a partial overlap (item 1)."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from support import cli_command, small_frames, start_passive  # noqa: E402

from protocols.grpc_client import GrpcTransport, tls_refusal  # noqa: E402
from protocols.grpc_security import Security  # noqa: E402
from protocols.grpc_server import PartyServer  # noqa: E402
from vfl.core.errors import PeerError  # noqa: E402

pytestmark = pytest.mark.slow   # real sockets, servers and party processes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import reprobe_checks  # noqa: E402


def _run(*args, timeout=300):
    return subprocess.run(cli_command(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    for out in ("certs", "other"):
        r = _run("certs", "--out", d / out, "--party", "bank", "--party", "telco", "--party", "scorer")
        assert r.returncode == 0, r.stderr
    return d


class CuttingProxy:
    """A TCP relay to ``target`` that cuts its first ``cut`` connections after the client's first
    bytes (a TLS ClientHello): what a server too loaded to finish handshakes does to its clients."""

    def __init__(self, target: tuple[str, int], cut: int):
        self.target, self.cut, self.accepted = target, cut, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted <= self.cut:
                conn.recv(100)
                conn.close()
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self):
        self.sock.close()


@pytest.fixture
def telco_server(pki):
    srv = PartyServer("telco", lambda frame, who=None: frame, "127.0.0.1:0",
                      Security.from_options("telco", pki / "certs", allowed_clients=("bank",)))
    port = srv.start()
    yield port
    srv.stop(grace=None)


def test_item4_handshakes_cut_short_are_retried_not_called_a_wrong_ca(pki, telco_server):
    proxy = CuttingProxy(("127.0.0.1", telco_server), cut=3)
    client = GrpcTransport("bank", {"telco": proxy.address}, Security.from_options("bank", pki / "certs"), timeout=10)
    try:
        assert client.connect(timeout=60)["telco"]["party"] == "telco"
        assert proxy.accepted > 3
    finally:
        client.close()
        proxy.close()


def test_item4_a_wrong_ca_is_still_refused_at_once(pki, telco_server):
    proxy = CuttingProxy(("127.0.0.1", telco_server), cut=0)
    client = GrpcTransport("bank", {"telco": proxy.address}, Security.from_options("bank", pki / "other"), timeout=10)
    try:
        with pytest.raises(PeerError, match=r"TLS handshake with party 'telco' .* failed \(wrong CA") as err:
            client.connect(timeout=60)
        assert tls_refusal(str(err.value))
        assert proxy.accepted <= 2      # one handshake (and one plaintext probe): a refusal is not retried
    finally:
        client.close()
        proxy.close()


def test_item4_64_concurrent_predictions_succeed(tmp_path):
    """64 `vfl predict` processes at once against one passive party over mutual TLS (one run here;
    `python benchmarks/reprobe_checks.py predict --runs 3` repeats it)."""
    proc, addr = reprobe_checks.setup_prediction(tmp_path)
    try:
        res = reprobe_checks.concurrent_predictions(tmp_path, addr, 64, 0, timeout=300)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
    assert res["succeeded"] == 64, res["errors"]


# -- item 9: a predict-only party is not trained with; the active party's table takes no address -------
def test_item9_the_active_party_trains_only_with_the_parties_that_serve(pki, tmp_path):
    a, b, _ = small_frames(n=80)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    children = []
    try:
        fed = tmp_path / "federation.toml"
        fed.write_text('[federation]\nactive = "bank"\n[parties.bank]\n[parties.telco]\naddress = "127.0.0.1:1"\n'
                       'predict = ["bank", "scorer"]\npredict_training_rows = true\n[parties.scorer]\n')
        addr = start_passive(children, tmp_path, "telco", "--data", tmp_path / "b.csv", "--model-dir",
                             tmp_path / "mt", "--tls-dir", pki / "certs", "--federation", fed)
        fed.write_text(fed.read_text().replace("127.0.0.1:1", addr))
        r = _run("party", "active", "--federation", fed, "--tls-dir", pki / "certs", "--data", tmp_path / "a.csv",
                 "--model-dir", tmp_path / "mb", "--mode", "plain", "--rounds", 1, "--depth", 2, "--quiet",
                 "--connect-timeout", 60)
        assert r.returncode == 0, r.stderr
        assert "aligned telco: 80 of 80 rows kept" in r.stdout and "scorer" not in r.stdout + r.stderr
        # the predict-only party scores with the model through the passive party that allows it
        r = _run("predict", "--federation", fed, "--tls-dir", pki / "certs", "--model-dir", tmp_path / "mb",
                 "--data", tmp_path / "a.csv", "--out", tmp_path / "p.csv")
        assert r.returncode == 0, r.stderr
        assert len(pd.read_csv(tmp_path / "p.csv")) == 80
    finally:
        for p in children:
            p.kill()
            p.wait(timeout=10)
            p.stdout.close()


# -- item 3: a killed Dask worker never hangs a run ------------------------------------------------------
@pytest.mark.parametrize("side", ["active", "passive"])
def test_item3_a_killed_dask_worker_ends_the_simulation_with_one_error(side):
    """`vfl simulate --dask local:2` with one Dask worker of ``side`` SIGKILLed after round 3 of 20
    (the CLI itself, in a child process: benchmarks/reprobe_checks.py dask-child): it ends, with exit
    code 1 and one `Error:` line naming the worker and advising a new run (simulate has no --resume).
    `python benchmarks/reprobe_checks.py dask --runs 10` repeats it ten times on each side."""
    pytest.importorskip("distributed")
    res = reprobe_checks.killed_worker_run(side, limit=600)
    assert not res["hung"] and res["killed"], res
    assert res["exit"] == 1 and res["error_lines"] == 1 and not res["traceback"], res
    assert "Dask worker" in res["error"] and "run the simulation again" in res["error"], res
    assert "--resume" not in res["error"], res


# -- item 5: membership at the transport, before a worker is given -------------------------------------
def test_item5_non_members_are_refused_by_the_transport(pki, tmp_path):
    """A certificate of the federation's CA whose party may neither train nor predict at telco (and
    one naming no federation party) is refused at the transport, at once, before any stream is read
    (it held the server's workers until a session refused it); members are still served."""
    _, b, _ = small_frames(n=40)
    b.to_csv(tmp_path / "b.csv", index=False)
    r = _run("certs", "--out", pki / "certs", "--party", "mallory")        # the same CA, not in the federation
    assert r.returncode == 0, r.stderr
    fed = tmp_path / "federation.toml"
    fed.write_text('[federation]\nactive = "bank"\n[parties.bank]\n[parties.telco]\naddress = "127.0.0.1:1"\n'
                   '[parties.scorer]\naddress = "127.0.0.1:2"\n')
    children = []
    try:
        addr = start_passive(children, tmp_path, "telco", "--data", tmp_path / "b.csv", "--model-dir",
                             tmp_path / "mt", "--tls-dir", pki / "certs", "--federation", fed)
        for who, rule in (("scorer", "federation members"), ("mallory", "federation identity")):
            client = GrpcTransport(who, {"telco": addr}, Security.from_options(who, pki / "certs"), timeout=30)
            try:
                with pytest.raises(PeerError, match=f"refused our credentials: party 'telco': rule '{rule}'"):
                    client.connect(timeout=30)
                with pytest.raises(PeerError, match=f"rule '{rule}'"):
                    client._exchange("telco", b"VFL1garbage")
            finally:
                client.close()
        client = GrpcTransport("bank", {"telco": addr}, Security.from_options("bank", pki / "certs"), timeout=30)
        try:
            assert client.connect(timeout=30)["telco"]["party"] == "telco"
        finally:
            client.close()
        assert "rule 'federation members'" in (tmp_path / "telco.err").read_text()
    finally:
        for p in children:
            p.kill()
            p.wait(timeout=10)
            p.stdout.close()
