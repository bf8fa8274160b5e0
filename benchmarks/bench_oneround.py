"""One-round (leaf masks) against node-by-node prediction (the reference), same run.

    python benchmarks/bench_oneround.py [--n 20000] [--rounds 10] [--depth 4] [--parties 3]

Trains a plain-mode model on synthetic data (training time is not the subject),
then predicts ``n`` new rows both ways. Prints one JSON object: seconds, bytes and
round trips (requests from the active party) of each method, and whether the
scores are identical.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from datasets import make_synthetic  # noqa: E402
from vfl.api import federation_from_frames  # noqa: E402
from vfl.core.params import TrainParams  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000, help="rows to predict")
    ap.add_argument("--n-train", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--parties", type=int, default=3)
    args = ap.parse_args()
    frames = make_synthetic(args.n_train + args.n, [4] * args.parties, seed=0, missing_rate=0.05)
    train = [type(pf)(pf.name, pf.frame.iloc[:args.n_train], pf.id_col, pf.label_col) for pf in frames]
    new = {pf.name: pf.frame.iloc[args.n_train:] for pf in frames}
    fed = federation_from_frames(train)
    fed.fit(TrainParams(mode="plain", n_estimators=args.rounds, max_depth=args.depth))
    out = {"benchmark": "one_round_prediction", "n_rows": args.n, "n_rounds": args.rounds, "depth": args.depth,
           "parties": args.parties}
    raw = {}
    for method in ("node", "one-round"):
        fed.predict_raw(new, prediction=method)          # warm-up (loads prediction data)
        tr = fed.transport
        b0, m0 = tr.total_bytes(), sum(tr.messages_sent.values())
        t0 = time.perf_counter()
        raw[method] = fed.predict_raw(new, prediction=method)
        key = method.replace("-", "_")
        out[f"{key}_seconds"] = round(time.perf_counter() - t0, 3)
        out[f"{key}_bytes"] = tr.total_bytes() - b0
        out[f"{key}_requests"] = (sum(tr.messages_sent.values()) - m0) // 2
    out["identical_scores"] = bool(np.array_equal(raw["node"], raw["one-round"]))
    out["one_round_over_node_seconds"] = round(out["one_round_seconds"] / max(out["node_seconds"], 1e-9), 2)
    out["one_round_over_node_bytes"] = round(out["one_round_bytes"] / out["node_bytes"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
