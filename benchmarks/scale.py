"""Scale benchmark (issue 11): one tree of depth 3 at growing row counts, each party its own process.

For every N (training rows) of ``--rows`` (default 250k, 1M, 2M) x (10 active + 50 passive
features), 1024-bit keys, mode ``he``:

1. the synthetic tables are written **in chunks** as one Parquet directory per party (the
   benchmark process never holds a whole table): ``active/`` (id, y, a0..a9), ``passive/``
   (id, p0..p49), and ``score/`` (the first ``--score-rows`` ids and the active features, to
   predict);
2. for each executor kind (``local``: each party on its local worker pool, the reference;
   ``dask``: each party on its own cluster of ``--dask-workers`` ``dask worker`` processes and one
   ``dask scheduler``, all on 127.0.0.1) it starts ``vfl party passive`` (the passive workers read
   its Parquet pieces: issue 11's bounded driver) and runs ``vfl party active`` against it over
   gRPC on loopback, then ``vfl predict --batch-rows`` on the score rows;
3. every process of the run (drivers, local workers, Dask scheduler and workers) is watched: its
   peak RSS (``VmHWM``) is sampled until it exits.

It prints one JSON object: per run the time per tree and its stages (the active party's
timings), **each driver's own peak RSS** (``active_driver_peak_rss_mb``,
``passive_driver_peak_rss_mb``), every worker's peak RSS, bytes sent, and a fingerprint of the
model (the passive lookup table and the predictions of the score rows, to the last bit); per N
the ratio dask/local and whether the models are identical; and ``throughput``: per-core
seconds of encryption per row and of histograms per (row x passive feature), what
``benchmarks/project.py`` turns into the projection of docs/scale.md. Targets (issue 11): Dask within
1.15x of the local pool at 1M rows; driver RSS flat in N and <= 1 GB at 2M rows; identical models.

    python benchmarks/scale.py > scale.json                  # the full run (an hour or more on 2 cores)
    python benchmarks/scale.py --rows 20000 --executor local  # a smoke run
    python benchmarks/project.py scale.json                  # the projection table of docs/scale.md
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repository on sys.path)
import numpy as np

ROOT = _common.ROOT
FEATURES = (10, 50)
DEFAULT_ROWS = (250_000, 1_000_000, 2_000_000)
STAGES = ("encrypt", "histogram", "compress", "decrypt", "split_search", "total")
CHUNK_ROWS = 100_000


# --- data, written chunk by chunk -----------------------------------------------------------------
def write_tables(root: Path, n: int, score_rows: int, chunk_rows: int = CHUNK_ROWS, seed: int = 0) -> dict:
    """The parties' Parquet directories; one chunk of rows in memory at a time."""
    import pandas as pd

    na, np_ = FEATURES
    w_rng = np.random.default_rng(seed)
    wa, wp = w_rng.normal(size=na) * (w_rng.random(na) < 0.5), w_rng.normal(size=np_) * (w_rng.random(np_) < 0.2)
    dirs = {k: root / k for k in ("active", "passive", "score")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    for i, start in enumerate(range(0, n, chunk_rows)):
        m = min(chunk_rows, n - start)
        rng = np.random.default_rng([seed, i])
        ids = np.arange(start, start + m, dtype=np.int64)
        xa = rng.normal(size=(m, na)).round(3)
        xp = rng.normal(size=(m, np_)).round(3)
        xp[rng.random((m, np_)) < 0.01] = np.nan
        logit = xa @ wa + np.nan_to_num(xp) @ wp + rng.normal(size=m)
        y = (logit > 0).astype(np.int8)
        a = pd.DataFrame({"id": ids, "y": y, **{f"a{j}": xa[:, j] for j in range(na)}})
        p = pd.DataFrame({"id": ids, **{f"p{j}": xp[:, j] for j in range(np_)}})
        a.to_parquet(dirs["active"] / f"part-{i:05d}.parquet", index=False, row_group_size=50_000)
        p.to_parquet(dirs["passive"] / f"part-{i:05d}.parquet", index=False, row_group_size=50_000)
        if start < score_rows:
            a.drop(columns="y").iloc[:score_rows - start].to_parquet(dirs["score"] / f"part-{i:05d}.parquet",
                                                                     index=False)
    return dirs


# --- processes and their peak memory -------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            out.setdefault(ppid, []).append(int(d))
    return out


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _hwm_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Watch:
    """Samples the peak RSS (VmHWM) of named processes and all their descendants until stopped."""

    def __init__(self, every: float = 0.5):
        self.roots: dict[int, str] = {}
        self.peaks: dict[int, dict] = {}
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, pid: int, role: str) -> None:
        self.roots[pid] = role

    def sample(self) -> None:
        kids = _children()
        for root, role in list(self.roots.items()):
            todo, depth = [(root, 0)], {}
            while todo:
                pid, d = todo.pop()
                depth[pid] = d
                todo.extend((c, d + 1) for c in kids.get(pid, ()))
            for pid, d in depth.items():
                kb = _hwm_kb(pid)
                if kb is None:
                    continue
                rec = self.peaks.setdefault(pid, {"pid": pid, "role": role if d == 0 else f"{role}/worker",
                                                  "peak_kb": 0, "cpu": 0.0})
                rec["peak_kb"] = max(rec["peak_kb"], kb)
                rec["cpu"] = max(rec["cpu"], _cpu_seconds(pid) or 0.0)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def start(self) -> "Watch":
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self.sample()
        self._stop.set()
        self._thread.join()
        return [{"role": r["role"], "pid": r["pid"], "peak_mb": round(r["peak_kb"] / 1024, 1),
                 "cpu_seconds": round(r["cpu"], 1)} for r in self.peaks.values()]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _spawn(args, env=None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *map(str, args)], env=_env() | (env or {}), cwd=ROOT, **kw)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class DaskCluster:
    """``dask scheduler`` + ``n`` single-thread ``dask worker`` processes on 127.0.0.1 (one party's)."""

    def __init__(self, n: int, watch: Watch, role: str, stock: bool = False):
        """``stock``: Dask's default settings, not :data:`crypto.dask_executor.LEAN_CONFIG`."""
        from crypto.dask_executor import lean_environment

        env = {} if stock else lean_environment()
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.procs = [_spawn(["-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", self.port,
                              "--dashboard-address", "127.0.0.1:0"], env=env, **quiet)]
        watch.add(self.procs[0].pid, f"{role}/dask-scheduler")
        for _ in range(n):
            self.procs.append(_spawn(["-m", "distributed.cli.dask_worker", self.address, "--nthreads", "1",
                                      "--no-nanny", "--host", "127.0.0.1", "--no-dashboard"], env=env, **quiet))
            watch.add(self.procs[-1].pid, f"{role}/dask-worker")
        import distributed

        with distributed.Client(self.address, timeout=120) as c:
            c.wait_for_workers(n, timeout=300)

    def stop(self) -> None:
        for p in reversed(self.procs):
            _stop(p)


# --- one run -------------------------------------------------------------------------------------
def _fingerprint(passive_dir: Path, predictions: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(passive_dir.glob("*.json")):
        d = json.loads(f.read_text())
        h.update(repr([(r["feature"], r["threshold"], r["default_left"]) for r in d.get("records", [])]).encode())
    lines = predictions.read_text().splitlines()
    h.update("\n".join(lines).encode())
    return h.hexdigest()[:16]


def run_one(dirs: dict, n: int, executor: str, workers: int, work: Path, batch_rows: int,
            via_scheduler: bool = False, stock_dask: bool = False) -> dict:
    watch = Watch().start()
    clusters, passive = [], None
    model_dir, passive_models = work / f"{executor}-active", work / f"{executor}-passive"
    model_dir.mkdir()
    passive_models.mkdir()
    summary, pred_json, preds = work / f"{executor}-train.json", work / f"{executor}-predict.json", \
        work / f"{executor}-predictions.csv"
    try:
        dask = {}
        if executor == "dask":
            for role in ("active", "passive"):
                clusters.append(DaskCluster(workers, watch, role, stock_dask))
                dask[role] = ["--dask-scheduler", clusters[-1].address, "--dask-insecure"] + \
                    (["--dask-via-scheduler"] if via_scheduler else [])
        passive = _spawn(["-m", "cli", "party", "passive", "--name", "passive", "--listen", "127.0.0.1:0",
                          "--data", dirs["passive"], "--model-dir", passive_models, "--insecure",
                          "--log-level", "warning", *dask.get("passive", [])],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        watch.add(passive.pid, "passive")
        line = ""
        while "listening on" not in line:
            line = passive.stdout.readline()
            if not line:
                raise RuntimeError("the passive party did not start (see vfl party passive)")
        peer = "passive=" + line.rsplit(" ", 1)[1].strip()
        threading.Thread(target=passive.stdout.read, daemon=True).start()     # drain its output
        t0 = time.perf_counter()
        active = _spawn(["-m", "cli", "party", "active", "--name", "active", "--data", dirs["active"], "--peer", peer,
                         "--model-dir", model_dir, "--mode", "he", "--key-bits", "1024", "--rounds", "1",
                         "--depth", "3", "--insecure", "--quiet", "--timeout", "7200", "--connect-timeout", "120",
                         "--output-json", summary, "--log-level", "warning", *dask.get("active", [])],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        watch.add(active.pid, "active")
        err = active.communicate()[1]
        wall = time.perf_counter() - t0
        if active.returncode != 0:
            raise RuntimeError(f"vfl party active failed: {err.strip().splitlines()[-3:]}")
        p = _spawn(["-m", "cli", "predict", "--model-dir", model_dir, "--data", dirs["score"], "--peer", peer,
                    "--out", preds, "--batch-rows", batch_rows, "--insecure", "--output-json", pred_json,
                    "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        err = p.communicate()[1]
        if p.returncode != 0:
            raise RuntimeError(f"vfl predict failed: {err.strip().splitlines()[-3:]}")
    finally:
        watch.sample()
        if passive is not None:
            _stop(passive)
        for c in clusters:
            c.stop()
        peaks = watch.stop()
    result = json.loads(summary.read_text())
    timing = result["timings"][0] if result.get("timings") else {}
    drivers = {r["role"]: r["peak_mb"] for r in peaks if r["role"] in ("active", "passive")}
    cpu: dict[str, float] = {}          # CPU seconds by role (drivers, schedulers, workers summed)
    for r in peaks:
        cpu[r["role"]] = round(cpu.get(r["role"], 0.0) + r["cpu_seconds"], 1)
    worker_peaks = [r for r in peaks if r["role"] not in ("active", "passive")]
    return {"rows": n, "executor": executor,
            "workers_per_party": workers if executor == "dask" else _common.cores(),
            "seconds_per_round": round(float(result["train_seconds"]), 3),
            "stages": {k: round(float(timing.get(k, 0.0)), 3) for k in STAGES},
            "active_driver_peak_rss_mb": drivers.get("active"), "passive_driver_peak_rss_mb": drivers.get("passive"),
            "worker_peak_rss_mb": worker_peaks, "cpu_seconds_by_role": cpu, "bytes_sent": result.get("bytes_sent"),
            "predict_seconds": json.loads(pred_json.read_text()).get("predict_seconds"),
            "model": _fingerprint(passive_models, preds), "wall_seconds_train": round(wall, 2)}


def throughput(res: dict) -> dict:
    """Per-core seconds: encryption per row, histograms per (row x passive feature), both for one
    tree of depth 3 (what benchmarks/project.py scales)."""
    cores = res["workers_per_party"]
    n, f = res["rows"], FEATURES[1]
    st = res["stages"]
    return {"encrypt_core_s_per_row": st["encrypt"] * cores / n,
            "histogram_core_s_per_row_feature": st["histogram"] * cores / (n * f),
            "other_s": round(st["total"] - st["encrypt"] - st["histogram"], 3),
            "passive_worker_mb_per_row_feature": sum(w["peak_mb"] for w in res["worker_peak_rss_mb"]
                                                     if w["role"].startswith("passive") and "scheduler" not in
                                                     w["role"]) / (n * f),
            "active_worker_mb_per_row": sum(w["peak_mb"] for w in res["worker_peak_rss_mb"]
                                            if w["role"].startswith("active") and "scheduler" not in w["role"]) / n}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, action="append", help="training rows (repeatable; default 250k, 1M, 2M)")
    ap.add_argument("--dask-workers", type=int, default=2, help="workers of each party's Dask cluster")
    ap.add_argument("--executor", action="append", choices=["local", "dask"], help="default: both")
    ap.add_argument("--score-rows", type=int, default=20_000, help="rows predicted for the fingerprint")
    ap.add_argument("--batch-rows", type=int, default=10_000, help="vfl predict --batch-rows")
    ap.add_argument("--workdir", help="where the Parquet tables go (default: a temporary directory, removed)")
    ap.add_argument("--write-only", action="store_true", help="write the tables and stop (a dry run of the data)")
    ap.add_argument("--dask-stock-config", action="store_true",
                    help="start the Dask schedulers and workers with Dask's default settings (profiler on, "
                         "20 ms watchdog), not crypto.dask_executor.LEAN_CONFIG")
    ap.add_argument("--dask-via-scheduler", action="store_true",
                    help="Dask runs relay payloads and results through the scheduler (the pre-direct transport)")
    args = ap.parse_args(argv)
    rows = args.rows or list(DEFAULT_ROWS)
    kinds = args.executor or ["local", "dask"]
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="vfl-scale-"))
    results, summary = [], []
    try:
        for n in rows:
            work = base / f"n{n}"
            if work.exists():
                shutil.rmtree(work)
            t0 = time.perf_counter()
            dirs = write_tables(work / "data", n, min(args.score_rows, n))
            write_s = round(time.perf_counter() - t0, 1)
            if args.write_only:
                results.append({"rows": n, "write_seconds": write_s})
                continue
            by_kind = {}
            for kind in kinds:
                try:
                    res = run_one(dirs, n, kind, args.dask_workers, work, args.batch_rows, args.dask_via_scheduler,
                                  args.dask_stock_config)
                    res["throughput"] = throughput(res)
                except Exception as exc:            # report and go on with the next run
                    res = {"rows": n, "executor": kind, "error": str(exc)}
                res["write_seconds"] = write_s
                results.append(res)
                by_kind[kind] = res
            loc, dsk = by_kind.get("local", {}), by_kind.get("dask", {})
            if "seconds_per_round" in loc and "seconds_per_round" in dsk:
                ratio = round(dsk["seconds_per_round"] / loc["seconds_per_round"], 3)
                summary.append({"rows": n, "dask_over_local": ratio,
                                "identical_model": loc["model"] == dsk["model"],
                                "passive_driver_peak_rss_mb": {k: r["passive_driver_peak_rss_mb"]
                                                               for k, r in by_kind.items()},
                                "active_driver_peak_rss_mb": {k: r["active_driver_peak_rss_mb"]
                                                              for k, r in by_kind.items()}})
            shutil.rmtree(work / "data", ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"cores": _common.cores(), "features": list(FEATURES), "key_bits": 1024, "depth": 3,
                      "dask_via_scheduler": args.dask_via_scheduler,
                      "dask_config": "stock" if args.dask_stock_config else "lean",
                      "results": results, "summary": summary}))


if __name__ == "__main__":
    main()
