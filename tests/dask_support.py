"""Dask clusters of the tests: ``dask scheduler`` and ``dask worker`` commands as separate processes
on 127.0.0.1 (shared by the Dask executor tests and the recovery tests)."""
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import distributed

from crypto.dask_executor import lean_environment

ROOT = Path(__file__).resolve().parents[1]


def dask_env():
    env = dict(os.environ) | lean_environment()       # as docs/dask.md tells a cluster's owner
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """``dask scheduler`` and ``dask worker`` commands as separate processes on 127.0.0.1."""

    def __init__(self, n_workers=2, tls=()):
        self.port = free_port()
        self.tls = list(tls)
        self.address = f"{'tls' if tls else 'tcp'}://127.0.0.1:{self.port}"
        self.procs = [self._spawn("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                  "--dashboard-address", "127.0.0.1:0",
                                  *(["--protocol", "tls", *self.tls] if tls else []))]
        self.workers = [self.add_worker() for _ in range(n_workers)]

    def wait(self, n_workers, security=None):
        with distributed.Client(self.address, timeout=60, security=security) as c:
            c.wait_for_workers(n_workers, timeout=120)
        return self

    def _spawn(self, module, *args):
        p = subprocess.Popen([sys.executable, "-m", module, *args], env=dask_env(), cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p) if hasattr(self, "procs") else None
        return p

    def add_worker(self):
        return self._spawn("distributed.cli.dask_worker", self.address, "--nthreads", "1", "--no-nanny",
                           "--host", "127.0.0.1", "--no-dashboard", *self.tls)

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
