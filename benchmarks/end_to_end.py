"""End-to-end training: per-tree time breakdown, bytes and peak memory.

    python benchmarks/end_to_end.py                      # every configuration below
    python benchmarks/end_to_end.py --config breast --rounds 2   # a small run

Configurations (the issue's targets on 2 cores in brackets):

* ``breast``: FATE's breast split (active party 10 + passive party 20 features), 455
  training rows, 10 rounds depth 4, 1024 bits [<= 3 s training].
* ``default_credit_1024`` / ``default_credit_2048``: 24,000 training rows,
  13 + 10 features, 30 rounds depth 3 [<= 4 s / <= 15 s per round].
* ``synthetic``: 100,000 training rows x (30 active + 300 passive features),
  one tree depth 3, 1024 bits [<= 60 s per tree, <= 4 GB].

Each configuration runs in its own child process (so peak memory is its own)
and all are printed as one JSON object: per configuration the training time,
mean seconds per tree, the per-tree breakdown (encrypt, histogram, compress,
decrypt, split_search, bytes_sent, total), test AUC, bytes, and peak memory
(this process, and the sum with every worker process's peak).
Datasets come from ``../shared/datasets`` (``datasets.shared_datasets_dir()``).
``--preshift on|off`` forces or forbids pre-shifted gradient copies (default:
the cost model), ``--mode plain`` gives the unencrypted baseline.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import _common

from datasets import load_shared, make_synthetic, shared_datasets_dir
from parties.active import ActiveParty
from vfl.api import simulate
from vfl.core.params import TrainParams

CONFIGS = {
    "breast": dict(data="breast", rounds=10, depth=4, bits=1024),
    "default_credit_1024": dict(data="default_credit", rounds=30, depth=3, bits=1024),
    "default_credit_2048": dict(data="default_credit", rounds=30, depth=3, bits=2048),
    "synthetic": dict(data="synthetic", rounds=1, depth=3, bits=1024),
}
STAGES = ("encrypt", "histogram", "compress", "decrypt", "split_search", "total")


def _frames(data: str, rows: int, features: tuple[int, int], test_size: float):
    if data == "synthetic":
        n = int(round(rows / (1 - test_size)))
        return make_synthetic(n, list(features), seed=0)
    root = shared_datasets_dir()
    if root is None:
        raise SystemExit("../shared/datasets is not available")
    return load_shared(data, root)


def run_one(name: str, args) -> dict:
    _common.quiet_keys()
    ActiveParty.preshift = {"auto": "auto", "on": True, "off": False}[args.preshift]
    cfg = dict(CONFIGS[name])
    if args.rounds:
        cfg["rounds"] = args.rounds
    frames = _frames(cfg["data"], args.synthetic_rows, tuple(args.synthetic_features), 0.2)
    params = TrainParams(n_estimators=cfg["rounds"], max_depth=cfg["depth"], key_bits=cfg["bits"], mode=args.mode)
    t0 = time.perf_counter()
    fed, result, _, _ = simulate(frames, params, test_size=0.2, seed=0)
    wall = time.perf_counter() - t0
    per_round = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in t.items()}
                for t in fed.active.timings]
    n = max(1, len(per_round))
    mean = {k: sum(t.get(k, 0.0) for t in per_round) / n for k in (*STAGES, "bytes_sent")}
    return {"config": name, "dataset": cfg["data"], "mode": args.mode, "bits": cfg["bits"],
            "preshift": args.preshift, "shifts": fed.active.channel.current.shifts if fed.active.channel else 1,
            "n_rounds": cfg["rounds"], "depth": cfg["depth"], "n_train": result["n_train"],
            "features": {p: len(f.feature_names) for p, f in zip(result["parties"], frames)},
            "train_seconds": result["train_seconds"], "seconds_per_round": result["train_seconds"] / n,
            "mean_round": mean, "per_round": per_round, "test_auc": result["test_auc"],
            "total_bytes": result["total_bytes"], "wall_seconds_incl_predict": wall,
            "peak_memory": _common.peak_memory()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", choices=sorted(CONFIGS),
                    help="run only this configuration (repeatable; default: all)")
    ap.add_argument("--rounds", type=int, default=0, help="override the number of boosting rounds")
    ap.add_argument("--synthetic-rows", type=int, default=100_000, help="training rows of 'synthetic'")
    ap.add_argument("--synthetic-features", type=int, nargs=2, default=[30, 300], metavar=("ACTIVE", "PASSIVE"))
    ap.add_argument("--mode", choices=["he", "plain"], default="he")
    ap.add_argument("--preshift", choices=["auto", "on", "off"], default="auto",
                    help="pre-shifted gradient copies instead of Horner compression (default: cost model)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = args.config or list(CONFIGS)
    if args.child:
        print(json.dumps(run_one(names[0], args)))
        return
    results = []
    for name in names:
        cmd = [sys.executable, __file__, "--child", "--config", name, "--rounds", str(args.rounds),
               "--synthetic-rows", str(args.synthetic_rows), "--mode", args.mode, "--preshift", args.preshift,
               "--synthetic-features", *map(str, args.synthetic_features)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            results.append({"config": name, "error": proc.stderr.strip().splitlines()[-1:]})
            continue
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(json.dumps({"cores": _common.cores(), "results": results}))


if __name__ == "__main__":
    main()
