"""Benchmark: plain vs HE vs DP (several epsilons) on the same splits; prints one JSON object.

Calls the same code as ``vfl compare`` (:func:`vfl.compare.run_comparison`),
writes its CSV/JSON/PNG files to ``--out-dir`` and prints a JSON summary in
which the ``plain`` run of the same invocation is the reference: every other
mode's training seconds and bytes are also given relative to it.

    python benchmarks/compare_modes.py --dataset default_credit --seeds 3 --he-seeds 1 --out-dir docs
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datasets.errors import VFLError  # noqa: E402
from vfl.compare import CompareConfig, run_comparison  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", action="append", default=[], help="repeatable; default as in vfl compare")
    ap.add_argument("--modes", default="plain,he,dp,local,xgboost")
    ap.add_argument("--epsilons", default="0.5,1,2,4,8,inf")
    ap.add_argument("--epsilon-scope", choices=["party", "feature"], default="party")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--he-seeds", type=int, default=1)
    ap.add_argument("--trees", type=int, default=10)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--learning-rate", type=float, default=0.3)
    ap.add_argument("--max-bin", type=int, default=32)
    ap.add_argument("--key-bits", type=int, default=1024)
    ap.add_argument("--out-dir", default="compare_results")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    cfg = CompareConfig(datasets=tuple(a.dataset), modes=tuple(x for x in a.modes.split(",") if x),
                        epsilons=a.epsilons, epsilon_scope=a.epsilon_scope, seeds=a.seeds, he_seeds=a.he_seeds,
                        n_estimators=a.trees, max_depth=a.depth, learning_rate=a.learning_rate,
                        max_bin=a.max_bin, key_bits=a.key_bits, plots=not a.no_plots)
    try:
        doc = run_comparison(cfg, a.out_dir, progress=lambda s: print(s, file=sys.stderr))
    except VFLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = {"benchmark": "compare_modes", "reference": "plain (same data, splits and hyperparameters)",
           "settings": doc["settings"], "notes": doc["notes"], "files": doc["files"], "datasets": {}}
    for ds, s in doc["summary"].items():
        ref = next((e for e in s["entries"] if e["mode"] == "plain"), None)
        rows = []
        for e in s["entries"]:
            row = {k: e[k] for k in ("mode", "epsilon", "n_runs", "auc_mean", "auc_std",
                                     "train_seconds_mean", "train_bytes_mean")}
            if ref is not None:
                row["seconds_vs_plain"] = e["train_seconds_mean"] / ref["train_seconds_mean"]
                row["train_bytes_vs_plain"] = e["train_bytes_mean"] / ref["train_bytes_mean"]
                row["auc_minus_plain"] = (e["auc_mean"] - ref["auc_mean"]) if e["auc_mean"] is not None else None
            rows.append(row)
        out["datasets"][ds] = {"he_equals_plain": s["he_equals_plain"], "modes": rows}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
