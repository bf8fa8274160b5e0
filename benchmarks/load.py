"""Serving under load: N concurrent predictions against one passive party over real gRPC.

    python benchmarks/load.py                          # 64 concurrent clients, 500 predictions
    python benchmarks/load.py --concurrency 8 --predictions 40 --rows 300 --rounds 2   # a quick check

Steps, on 127.0.0.1 (plaintext, ``--insecure``; the figures are about serving, not TLS):

1. synthetic data (``--rows`` rows, 2 active and 4 passive features), written to CSV files;
2. one ``vfl party passive`` **process** and one ``vfl party active`` process train a model
   (``--mode``, default he with a ``--key-bits`` 1024-bit key; ``--rounds``, ``--depth``);
3. **reference**: one client, ``--reference`` predictions one after the other;
4. **load**: ``--concurrency`` client threads in this process, each with its own gRPC channel,
   share ``--predictions`` predictions of ``--batch-rows`` rows each (alternating node-by-node and
   one-round prediction), all started at once.

Prints one JSON object: latency percentiles (p50/p90/p99/max, seconds) of the reference and of
the load run, their p50 ratio, throughput, failures (with the first messages), how often the
server answered "busy, retry" (client retries), whether every prediction equals the
reference's, and the passive process's resident memory (VmRSS, MB) after training, after the
reference and after the load run, with its growth per 100 predictions.
"""
from __future__ import annotations

import argparse
import json
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from parties.active import ActiveParty  # noqa: E402
from parties.network import load_active_model  # noqa: E402
from protocols.grpc_client import GrpcTransport  # noqa: E402
from protocols.grpc_security import Security  # noqa: E402


def cli(*args):
    return [sys.executable, "-m", "cli", *map(str, args)]


def make_data(tmp: Path, rows: int, seed: int) -> tuple[Path, Path, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, 6))
    y = (X[:, 0] + X[:, 2] - X[:, 4] + 0.5 * X[:, 3] * X[:, 5] + 0.3 * rng.normal(size=rows) > 0).astype(int)
    ids = np.arange(rows)
    active = pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    passive = pd.DataFrame({"id": ids, **{f"p{j}": X[:, 2 + j] for j in range(4)}})
    a, p = tmp / "active.csv", tmp / "passive.csv"
    active.to_csv(a, index=False)
    passive.to_csv(p, index=False)
    return a, p, active.drop(columns=["y"])


def start_passive(data: Path, model_dir: Path, log_path: Path):
    err = open(log_path, "w")
    p = subprocess.Popen(cli("party", "passive", "--name", "passive", "--listen", "127.0.0.1:0", "--data", data,
                             "--model-dir", model_dir, "--insecure"),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    err.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"the passive party exited: {log_path.read_text()[-2000:]}")
        if select.select([p.stdout], [], [], 0.2)[0]:
            line = p.stdout.readline()
            if "listening on" in line:
                return p, int(line.strip().rsplit(":", 1)[1])
    p.kill()
    raise RuntimeError("the passive party did not start")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def percentiles(lat: list[float]) -> dict:
    if not lat:
        return {}
    a = np.asarray(lat)
    out = {f"p{q}": round(float(np.percentile(a, q)), 4) for q in (50, 90, 99)}
    return {"n": int(a.size), **out, "max": round(float(a.max()), 4), "mean": round(float(a.mean()), 4)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=64, help="Client threads at once.")
    ap.add_argument("--predictions", type=int, default=500, help="Predictions of the load run, in all.")
    ap.add_argument("--reference", type=int, default=20, help="Sequential predictions of the reference run.")
    ap.add_argument("--batch-rows", type=int, default=100, help="Rows per prediction.")
    ap.add_argument("--rows", type=int, default=2000, help="Rows of the synthetic data set.")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--mode", default="he", choices=["he", "plain"])
    ap.add_argument("--key-bits", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=120.0, help="Seconds any single call may take.")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="vfl-load-") as tmpdir:
        tmp = Path(tmpdir)
        a_csv, p_csv, active_frame = make_data(tmp, args.rows, args.seed)
        proc, port = start_passive(p_csv, tmp / "m_passive", tmp / "passive.err")
        try:
            t0 = time.perf_counter()
            r = subprocess.run(cli("party", "active", "--name", "active", "--data", a_csv, "--peer",
                                   f"passive=127.0.0.1:{port}", "--model-dir", tmp / "m_active", "--insecure",
                                   "--mode", args.mode, "--key-bits", args.key_bits, "--rounds", args.rounds,
                                   "--depth", args.depth, "--quiet", "--timeout", args.timeout),
                               cwd=ROOT, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"training failed:\n{r.stderr[-4000:]}")
            train_seconds = time.perf_counter() - t0
            model = load_active_model(tmp / "m_active")
            rng = np.random.default_rng(args.seed + 1)
            batch = active_frame.iloc[np.sort(rng.choice(len(active_frame), min(args.batch_rows, len(active_frame)),
                                                         replace=False))].reset_index(drop=True)
            addr = {"passive": f"127.0.0.1:{port}"}
            rss = {"after_training": rss_mb(proc.pid)}

            def predict_once(transport, prediction):
                party = ActiveParty.from_model(model)
                return party.predict_proba(transport, batch, prediction=prediction)[1]

            # reference: one client, one prediction after the other
            ref_lat, want = [], {}
            with GrpcTransport("active", addr, Security(), timeout=args.timeout) as t:
                for i in range(args.reference):
                    prediction = "node" if i % 2 else "one-round"
                    s = time.perf_counter()
                    want[prediction] = predict_once(t, prediction)
                    ref_lat.append(time.perf_counter() - s)
            rss["after_reference"] = rss_mb(proc.pid)

            # load: N threads share M predictions
            counter = iter(range(args.predictions))
            lock = threading.Lock()
            lat, failures, busy, mismatches = [], [], [0], [0]
            barrier = threading.Barrier(args.concurrency)

            def worker():
                with GrpcTransport("active", addr, Security(), timeout=args.timeout) as t:
                    barrier.wait()
                    while True:
                        with lock:
                            i = next(counter, None)
                        if i is None:
                            break
                        prediction = "node" if i % 2 else "one-round"
                        s = time.perf_counter()
                        try:
                            out = predict_once(t, prediction)
                        except Exception as exc:   # counted and reported
                            with lock:
                                failures.append(f"{type(exc).__name__}: {exc}")
                            continue
                        dt = time.perf_counter() - s
                        with lock:
                            lat.append(dt)
                            if not np.array_equal(out, want[prediction]):
                                mismatches[0] += 1
                    with lock:
                        busy[0] += t.busy_waits.get("passive", 0)

            t0 = time.perf_counter()
            threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            load_seconds = time.perf_counter() - t0
            rss["after_load"] = rss_mb(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    ref, load = percentiles(ref_lat), percentiles(lat)
    out = {
        "config": {k: getattr(args, k) for k in ("concurrency", "predictions", "reference", "batch_rows", "rows",
                                                  "rounds", "depth", "mode", "key_bits")},
        "train_seconds": round(train_seconds, 2),
        "reference_latency_s": ref,
        "load_latency_s": load,
        "p50_ratio_load_to_reference": round(load["p50"] / ref["p50"], 2) if load and ref else None,
        "load_seconds": round(load_seconds, 2),
        "predictions_per_second": round(len(lat) / load_seconds, 2) if load_seconds else None,
        "failures": len(failures),
        "first_failures": failures[:3],
        "busy_retries": busy[0],
        "all_identical_to_reference": mismatches[0] == 0 and not failures,
        "server_rss_mb": rss,
        "server_rss_growth_mb_per_100_predictions":
            round((rss["after_load"] - rss["after_reference"]) / max(1, len(lat)) * 100, 2),
    }
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
