"""The re-probe's two "done when" checks of issue 36, as repeatable runs (prints JSON):

* ``predict``: N concurrent ``vfl predict`` processes against one passive party over mutual TLS
  (a federation file, real processes); how many of N succeeded in each run, and every failure's
  ``Error:`` line.
* ``dask``: ``vfl simulate --dask local:2`` with one Dask worker of the active or the passive party
  killed (SIGKILL) during training; whether each run ended within its timeout, its exit code, its
  ``Error:`` line and how long it took.

    python benchmarks/reprobe_checks.py predict --clients 64 --runs 3
    python benchmarks/reprobe_checks.py dask --runs 10 --side active --side passive

Run from the repository root (the children are ``python -m cli``).
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import cli as vfl_cli  # noqa: E402  (the CLI under test, from this checkout)


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "cli", *map(str, args)]


def _frames(n: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    y = (X[:, 0] + X[:, 2] + 0.3 * rng.normal(size=n) > 0).astype(int)
    ids = np.arange(n)
    return (pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]}),
            pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]}))


def start_passive(args, err_path: Path, timeout: float = 120.0):
    """Start ``vfl party passive ARGS`` and return (process, its address) once it listens."""
    with open(err_path, "w") as err:
        p = subprocess.Popen(cli("party", "passive", *args), cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"the passive party exited: {err_path.read_text()}")
        ready, _, _ = select.select([p.stdout], [], [], 0.2)
        if ready and "listening on" in (line := p.stdout.readline()):
            return p, line.strip().rsplit(" ", 1)[1]
    p.kill()
    raise RuntimeError(f"the passive party did not start: {err_path.read_text()}")


def error_line(text: str) -> str | None:
    lines = [ln for ln in text.splitlines() if ln.startswith("Error: ")]
    return lines[-1] if lines else None


# -- predict: N concurrent clients ---------------------------------------------------------------------
def setup_prediction(work: Path):
    """Certificates, a federation file, one passive party serving, a trained model: what each client needs."""
    a, b = _frames()
    a.to_csv(work / "a.csv", index=False)
    b.to_csv(work / "b.csv", index=False)
    r = subprocess.run(cli("certs", "--out", work / "certs", "--party", "bank", "--party", "telco"), cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise RuntimeError(r.stderr)
    proc, addr = start_passive(["--name", "telco", "--listen", "127.0.0.1:0", "--data", work / "b.csv",
                                "--model-dir", work / "mt", "--tls-dir", work / "certs", "--allow-client", "bank"],
                               work / "telco.err")
    fed = work / "federation.toml"
    fed.write_text(f'[federation]\nactive = "bank"\n[parties.bank]\n[parties.telco]\naddress = "{addr}"\n')
    r = subprocess.run(cli("party", "active", "--name", "bank", "--data", work / "a.csv", "--peer", f"telco={addr}",
                           "--model-dir", work / "mb", "--tls-dir", work / "certs", "--mode", "plain", "--rounds", 2,
                           "--depth", 2, "--quiet"), cwd=ROOT, capture_output=True, text=True, timeout=300)
    if r.returncode:
        proc.kill()
        raise RuntimeError(r.stderr)
    return proc, addr


def concurrent_predictions(work: Path, addr: str, clients: int, run: int, timeout: float = 300.0) -> dict:
    """``clients`` `vfl predict` processes at once; each must finish within its --connect-timeout and
    --timeout (and a margin for starting Python)."""
    procs = []
    for i in range(clients):
        out = work / f"p{run}_{i}.csv"
        procs.append(subprocess.Popen(
            cli("predict", "--model-dir", work / "mb", "--data", work / "a.csv", "--peer", f"telco={addr}",
                "--tls-dir", work / "certs", "--out", out, "--timeout", timeout, "--connect-timeout", timeout),
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    t0 = time.monotonic()
    errors = []
    ok = 0
    for i, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=max(1.0, 3 * timeout + 120 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            errors.append(f"client {i}: did not finish")
            continue
        if p.returncode == 0 and (work / f"p{run}_{i}.csv").exists():
            ok += 1
        else:
            errors.append(f"client {i}: exit {p.returncode}: {error_line(err) or err[-300:]}")
    return {"clients": clients, "succeeded": ok, "seconds": round(time.monotonic() - t0, 1), "errors": errors}


def check_predict(clients: int, runs: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        proc, addr = setup_prediction(work)
        try:
            results = [concurrent_predictions(work, addr, clients, r) for r in range(runs)]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        return {"check": "concurrent predictions", "runs": results,
                "all_succeeded": all(r["succeeded"] == clients for r in results)}


# -- dask: a killed worker never hangs a run ---------------------------------------------------------
def dask_child(side: str, kill_round: int, rounds: int) -> None:
    """In a child process: `vfl simulate --dask local:2 ...` through the CLI itself, with the first
    Dask worker of ``side`` SIGKILLed when round ``kill_round`` ends (a hook around the simulation)."""

    real = vfl_cli.simulate_federation

    def simulate_with_a_kill(*args, executor_for=None, on_round=None, **kw):
        executors = {}

        def executor_for_recorded(name):
            executors[name] = executor_for(name)
            return executors[name]

        def on_round_killing(r, info):
            if r + 1 == kill_round:
                ex = executors[next(n for n in executors if (n == "active") == (side == "active"))]
                pid = ex.pids[0]
                print(f"killing Dask worker {pid} of {ex.name}", file=sys.stderr, flush=True)
                os.kill(pid, signal.SIGKILL)
            on_round(r, info)

        return real(*args, executor_for=executor_for_recorded, on_round=on_round_killing, **kw)

    vfl_cli.simulate_federation = simulate_with_a_kill
    vfl_cli.main(["simulate", "--dask", "local:2", "--mode", "plain", "--rounds", str(rounds), "--depth", "3",
              "--quiet"])


def killed_worker_run(side: str, rounds: int = 20, kill_round: int = 3, limit: float = 240.0) -> dict:
    """One `vfl simulate --dask local:2` with a worker of ``side`` (active or passive) SIGKILLed after
    round ``kill_round``; ``limit``: the wall-clock bound the run must end within."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "dask-child", "--side", side,
                          "--kill-round", str(kill_round), "--rounds", str(rounds)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=limit)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)        # the run and its Dask workers (they hold its pipes)
        out, err = p.communicate()
        hung = True
    return {"side": side, "exit": p.returncode, "hung": hung, "seconds": round(time.monotonic() - t0, 1),
            "killed": "killing Dask worker" in err, "error": error_line(err), "finished": "train time" in out,
            "error_lines": len([ln for ln in err.splitlines() if ln.startswith("Error: ")]),
            "traceback": "Traceback" in err}


def check_dask(runs: int, sides, limit: float = 240.0) -> dict:
    results = [killed_worker_run(side, limit=limit) for side in sides for _ in range(runs)]
    return {"check": "killed Dask worker", "limit_s": limit, "runs": results,
            "none_hung": not any(r["hung"] for r in results)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="check", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    d = sub.add_parser("dask")
    d.add_argument("--runs", type=int, default=10)
    d.add_argument("--side", action="append", choices=("active", "passive"))
    d.add_argument("--limit", type=float, default=240.0, help="Seconds a run must end within.")
    c = sub.add_parser("dask-child")
    c.add_argument("--side", choices=("active", "passive"), required=True)
    c.add_argument("--kill-round", type=int, default=3)
    c.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args(argv)
    if a.check == "dask-child":
        return dask_child(a.side, a.kill_round, a.rounds)
    if a.check == "predict":
        doc = check_predict(a.clients, a.runs)
    else:
        doc = check_dask(a.runs, a.side or ["active", "passive"], a.limit)
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
