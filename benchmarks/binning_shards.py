"""Bin edges across shards vs the local Binner, and batched reading of a Parquet directory.

For N rows x F features (normal, integer-valued and NaN-holding columns) cut into S shards:
the local ``Binner.fit`` (the reference, measured in the same run), the one-round approximate
edges (``fit_sharded_binner(exact=False)``) and the exact refinement (``ExactEdges`` rounds), with
their times, rounds, the largest message a shard sends (points per column) and whether the edges
equal the reference. Then the same matrix written as a directory of S Parquet files is read whole
(``read_party_table``) and in batches (``iter_party_batches``), with times. Prints one JSON object.

    python benchmarks/binning_shards.py --rows 1000000 --features 20 --shards 8 --max-bin 32
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repository on sys.path)
import numpy as np
import pandas as pd

from datasets.loaders import iter_party_batches, read_party_table
from vfl.core.bin_summaries import DEFAULT_SUMMARY_POINTS, binner_from_summaries, merge_shard_summaries, summarize_shard
from vfl.core.binning import Binner
from vfl.core.sharded_binning import DEFAULT_BRACKET_POINTS, ExactEdges, answer_edge_query, merge_edge_answers


def matrix(rows: int, features: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cols = []
    for j in range(features):
        kind = j % 3
        if kind == 0:
            c = rng.normal(size=rows)
        elif kind == 1:
            c = rng.integers(0, 1000, rows).astype(np.float64)
        else:
            c = np.where(rng.random(rows) < 0.2, np.nan, rng.exponential(size=rows))
        cols.append(c)
    return np.column_stack(cols)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--features", type=int, default=6)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--max-bin", type=int, default=32)
    ap.add_argument("--max-points", type=int, default=DEFAULT_SUMMARY_POINTS)
    ap.add_argument("--bracket-points", type=int, default=DEFAULT_BRACKET_POINTS)
    ap.add_argument("--batch-rows", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    X = matrix(args.rows, args.features, args.seed)
    shards = np.array_split(X, args.shards)

    t0 = time.perf_counter()
    local = Binner(args.max_bin).fit(X)
    local_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    summaries = [summarize_shard(s, args.max_points) for s in shards]
    merged = merge_shard_summaries(summaries, args.max_points)
    approx = binner_from_summaries(merged, args.max_bin)
    approx_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    plan = ExactEdges(merged, args.max_bin, args.bracket_points)
    largest_answer = 0
    while not plan.done:
        query = plan.query()
        answers = [answer_edge_query(s, query, args.bracket_points) for s in shards]
        largest_answer = max(largest_answer, max(sum(len(a[1].values) for a in per) for ans in answers
                                                 for per in ans.values()))
        plan.update(query, merge_edge_answers(answers, args.bracket_points))
    exact = plan.binner()
    refine_s = time.perf_counter() - t0

    def equal(b):
        return all(np.array_equal(x, y) for x, y in zip(b.thresholds_, local.thresholds_))

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "table"
        d.mkdir()
        names = [f"f{j}" for j in range(args.features)]
        start = 0
        for i, s in enumerate(shards):
            frame = pd.DataFrame(s, columns=names)
            frame.insert(0, "id", np.arange(start, start + len(s)))
            frame.to_parquet(d / f"part.{i}.parquet", index=False)
            start += len(s)
        read_party_table(d / "part.0.parquet", "p", "id")       # warm up: pyarrow's first import
        t0 = time.perf_counter()
        n = sum(len(b.frame) for b in iter_party_batches(d, "p", "id", batch_rows=args.batch_rows))
        batches_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        whole = read_party_table(d, "p", "id")
        whole_s = time.perf_counter() - t0
        assert n == len(whole.frame) == args.rows

    print(json.dumps({
        "rows": args.rows, "features": args.features, "shards": args.shards, "max_bin": args.max_bin,
        "max_points": args.max_points, "bracket_points": args.bracket_points,
        "local_binner_s": round(local_s, 3),
        "one_round_s": round(approx_s, 3), "one_round_equal": equal(approx),
        "summaries_exact": sum(s.exact for s in merged),
        "refine_s": round(refine_s, 3), "refine_rounds": plan.rounds, "refined_equal": equal(exact),
        "largest_answer_points_per_column": largest_answer,
        "parquet_batches_s": round(batches_s, 3), "parquet_whole_s": round(whole_s, 3),
    }, indent=1))


if __name__ == "__main__":
    main()
