"""Time per tree against cores (issue 24): the synthetic training at 1, 2, 4, ... workers per party.

    python benchmarks/cores.py                       # 250k x (10 + 50), 1024 bits, 1 tree, up to all cores
    python benchmarks/cores.py --rows 2000 --features 2 4 --workers 1 2 --rounds 2    # quick
    python benchmarks/cores.py --model               # the many-core model: simulated workers, any machine

Each worker count runs in its own child process: both parties (the active party and one passive
party, in one process over the in-memory transport, as ``vfl simulate``) get their own local pool
of that many worker processes. Prints one JSON object ``{"runs": [...]}``, one entry per count:

* ``workers``: worker processes per party; ``seconds_per_round``: the mean of the rounds' ``total``
  stage (a round, from its gradients to its scores; ``train_seconds`` adds the setup: key, bins);
* ``stages``: the mean seconds per round of every stage of the active party's timing records
  (``gradients``: encryption, stream and intake; ``histograms``; ``encrypt``: the encryption on the
  critical path; ...);
* ``speedup``: seconds per round of the smallest count over this one's; ``efficiency``: speedup per
  added worker (``speedup * smallest / workers``);
* ``driver_cpu_share``: the CPU seconds of the drivers (this child process: both parties' drivers,
  their transport, their lane threads) per round, as a share of the round's total CPU (drivers and
  every worker's reported CPU): the serial part. With two or more rounds it is measured from the end
  of the first round to the end of the last (setup excluded); with one round it includes the setup.

``--model`` runs the same table on :class:`crypto.sim_executor.SimulatedExecutor` (simulated
workers whose tasks sleep for their counted work; a plain round of ``--model-rows`` rows, costs of
``tests/parties/test_many_cores.py``): ``seconds_per_round`` is then the modelled round, ``ideal``
its work over the workers, and ``driver_cpu_share`` is left out (the model's CPU is not the real one).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import _common
import numpy as np
import pandas as pd

from crypto import parallel, shards
from crypto.executor import LocalExecutor
from crypto.sim_executor import SimCosts, SimulatedExecutor
from datasets import make_synthetic
from vfl.api import ActiveParty, Federation, PassiveParty, simulate
from vfl.core.params import TrainParams

#: the model's costs (as tests/parties/test_many_cores.py): ~30 additions per encryption
MODEL_COSTS = SimCosts(encrypt=1.6e-3, add=5e-5, move=2e-6, decrypt=1.6e-3)


def _mean_stages(timings) -> dict:
    keys = sorted({k for t in timings for k, v in t.items() if isinstance(v, (int, float))})
    n = max(1, len(timings))
    return {k: round(sum(float(t.get(k, 0.0)) for t in timings) / n, 4) for k in keys}


def run_one(workers: int, args) -> dict:
    """One training on ``workers`` worker processes per party (in this process)."""
    _common.quiet_keys()
    n = int(round(args.rows / 0.8))
    frames = make_synthetic(n, list(args.features), seed=0)
    pools = {pf.name: LocalExecutor(workers, name=f"{pf.name}:{workers}") for pf in frames}
    marks = []           # (process CPU, workers' CPU) at the end of each round

    def on_round(_r, _info):
        marks.append((time.process_time(), sum(p.cpu_seconds for p in pools.values())))
    params = TrainParams(n_estimators=args.rounds, max_depth=args.depth, key_bits=args.bits, mode=args.mode)
    start = (time.process_time(), 0.0)
    try:
        fed, result, _, _ = simulate(frames, params, test_size=0.2, seed=0, on_round=on_round,
                                     executor_for=lambda name: pools[name])
    finally:
        for p in pools.values():
            p.close()
    stages = _mean_stages(fed.active.timings)
    first, last = (marks[0], marks[-1]) if len(marks) >= 2 else (start, marks[-1] if marks else start)
    driver, work = last[0] - first[0], last[1] - first[1]
    return {"workers": workers, "seconds_per_round": stages.get("total"), "stages": stages,
            "train_seconds": round(result["train_seconds"], 3),
            "driver_cpu_share": round(driver / (driver + work), 4) if driver + work > 0 else None,
            "driver_cpu_seconds_per_round": round(driver / max(1, len(marks) - 1 if len(marks) >= 2 else 1), 4),
            "worker_cpu_seconds_per_round": round(work / max(1, len(marks) - 1 if len(marks) >= 2 else 1), 4),
            "n_rounds": len(fed.active.timings), "n_trees": result["n_trees"], "rows": args.rows,
            "features": list(args.features), "bits": args.bits,
            "mode": args.mode}


def model_one(workers: int, args) -> dict:
    """The model's round on ``workers`` simulated workers per party (see the module doc)."""
    shards.MIN_STREAM_SHARD_BYTES = 1                     # plain values: messages of as few rows as real ones
    parallel.POLICY = parallel.ParallelPolicy(reduce=0)    # thresholds are for real sizes
    rng = np.random.default_rng(0)
    n, f = args.model_rows, 4
    X = rng.normal(size=(n, 2 + f))
    y = (X[:, 0] + X[:, 2] - X[:, 3] > 0).astype(int)
    a = pd.DataFrame({"id": np.arange(n), "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": np.arange(n), **{f"b{j}": X[:, 2 + j] for j in range(f)}})
    ex_a = SimulatedExecutor(workers, MODEL_COSTS, name="bank")
    ex_p = SimulatedExecutor(workers, MODEL_COSTS, name="telco")
    try:
        fed = Federation(ActiveParty("bank", a, executor=ex_a), [PassiveParty("telco", b, executor=ex_p)])
        fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=3, learning_rate=0.5))
    finally:
        ex_a.close()
        ex_p.close()
    (timing,) = fed.active.timings
    ideal = (ex_a.work_seconds() + ex_p.work_seconds()) / workers
    return {"workers": workers, "seconds_per_round": round(timing["total"], 4), "ideal": round(ideal, 4),
            "over_ideal": round(timing["total"] / ideal, 3), "stages": _mean_stages([timing]),
            "rows": n, "model": True}


def _counts(limit: int) -> list[int]:
    out, w = [], 1
    while w < limit:
        out.append(w)
        w *= 2
    return out + [limit]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=250_000, help="training rows")
    ap.add_argument("--features", type=int, nargs=2, default=[10, 50], metavar=("ACTIVE", "PASSIVE"))
    ap.add_argument("--bits", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--mode", choices=["he", "plain"], default="he")
    ap.add_argument("--workers", type=int, nargs="+", help="worker counts (default: 1, 2, 4, ... all cores)")
    ap.add_argument("--model", action="store_true", help="the many-core model instead (simulated workers)")
    ap.add_argument("--model-rows", type=int, default=16384)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(model_one(args.child, args) if args.model else run_one(args.child, args)))
        return
    counts = args.workers or (_counts(64) if args.model else _counts(_common.cores()))
    runs = []
    for w in counts:
        cmd = [sys.executable, __file__, "--child", str(w), "--rows", str(args.rows), "--bits", str(args.bits),
               "--rounds", str(args.rounds), "--depth", str(args.depth), "--mode", args.mode,
               "--model-rows", str(args.model_rows), "--features", *map(str, args.features)]
        cmd += ["--model"] if args.model else []
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            runs.append({"workers": w, "error": proc.stderr.strip().splitlines()[-1:]})
            continue
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), file=sys.stderr)
    done = [r for r in runs if "error" not in r]
    if done:
        base = min(done, key=lambda r: r["workers"])
        for r in done:
            r["speedup"] = round(base["seconds_per_round"] / r["seconds_per_round"], 3)
            r["efficiency"] = round(r["speedup"] * base["workers"] / r["workers"], 3)
    print(json.dumps({"benchmark": "cores", "cores": _common.cores(), "model": args.model, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
