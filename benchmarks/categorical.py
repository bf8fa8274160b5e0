"""Native categorical features vs one-hot encoding on a 200-category column (issue 15).

default_credit's active party's column x7 is bucketed into 200 quantile buckets with shuffled labels
("segment_137"), held by a passive party; the active party holds only the label. The same
federation is trained with the column as one native categorical feature and as 200 one-hot
columns, in the same run (the reference is measured alongside). Prints JSON: train seconds,
bytes and test AUC of each, and their ratios.

    python benchmarks/categorical.py [--mode he|plain] [--rounds 10] [--depth 3] [--key-bits 1024]
        [--max-cat N (default: TrainParams' default)] [--kinds categorical,one_hot]
"""
from __future__ import annotations

import argparse
import json
import time

import _common  # noqa: F401  (puts the repository on sys.path)
import numpy as np
import pandas as pd
from _common import cores, quiet_keys

from datasets import load_shared
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core import metrics


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="he", choices=("he", "plain"))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--key-bits", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=30000)
    ap.add_argument("--categories", type=int, default=200)
    ap.add_argument("--max-cat", type=int, default=TrainParams.default("max_cat"),
                    help="category bins of the native feature (the rarer categories are pooled)")
    ap.add_argument("--kinds", default="categorical,one_hot", help="which encodings to train, comma-separated")
    args = ap.parse_args()
    quiet_keys()
    frame = load_shared("default_credit")[0].frame.iloc[:args.rows]
    rng = np.random.default_rng(0)
    buckets = pd.qcut(frame["x7"].rank(method="first"), args.categories, labels=False).to_numpy()
    labels = np.array([f"segment_{k:03d}" for k in rng.permutation(args.categories)])[buckets]
    ids, y = frame["id"].to_numpy(), frame["y"].to_numpy()
    train = np.arange(len(ids)) < int(0.8 * len(ids))
    params = TrainParams(mode=args.mode, n_estimators=args.rounds, max_depth=args.depth, key_bits=args.key_bits,
                         max_cat=args.max_cat)
    out = {"benchmark": "categorical", "mode": args.mode, "rows": int(len(ids)), "categories": args.categories,
           "max_cat": args.max_cat, "n_rounds": args.rounds, "depth": args.depth, "key_bits": args.key_bits,
           "cores": cores()}
    kinds = args.kinds.split(",")
    encodings = {"categorical": lambda: pd.DataFrame({"segment": labels}),
                 "one_hot": lambda: pd.get_dummies(pd.Series(labels), dtype=float)}
    for kind in kinds:
        feats = encodings[kind]()
        passive = pd.concat([pd.DataFrame({"id": ids}), feats.reset_index(drop=True)], axis=1)
        fed = Federation(ActiveParty("bank", pd.DataFrame({"id": ids[train], "y": y[train]})),
                         [PassiveParty("shop", passive[train])])
        t0 = time.perf_counter()
        fed.fit(params)
        seconds = time.perf_counter() - t0
        p = fed.predict_proba({"bank": pd.DataFrame({"id": ids[~train]}), "shop": passive[~train]})
        out[kind] = {"features": int(feats.shape[1]), "train_seconds": round(seconds, 3),
                     "train_bytes": int(fed.transport.total_bytes()),
                     "test_auc": round(metrics.auc(y[~train].astype(float), p), 4)}
    if len(kinds) == 2:
        out["speedup"] = round(out["one_hot"]["train_seconds"] / out["categorical"]["train_seconds"], 2)
        out["bytes_ratio"] = round(out["one_hot"]["train_bytes"] / out["categorical"]["train_bytes"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
