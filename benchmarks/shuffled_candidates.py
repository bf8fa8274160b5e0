"""The cost of shuffled split candidates (issue 31, item 1) per tree.

    python benchmarks/shuffled_candidates.py --rounds 2                                  # the added work only
    git worktree add /tmp/before31 a36226f        # the code before issue 31 (per-bin sums), once
    python benchmarks/shuffled_candidates.py --reference-tree /tmp/before31              # old vs new, same run

Trains default_credit at 2048 bits (``end_to_end.py``'s ``default_credit_2048``: 24,000 rows, 13 + 10
features, depth 3; ``--rounds`` overrides its 30 rounds; ``--config`` another of its configurations) in
child processes, one per code tree, and prints one JSON object:

* ``new``: this tree's run: seconds per tree, and the passive party's added work per tree, the stage
  ``candidates`` (siblings derived from the parent's ciphertexts, running sums of the bins, both
  missing sides, the permutation), with ``added_share_of_tree`` = that / seconds per tree (the target:
  at most 0.05);
* ``reference`` (with ``--reference-tree``): the same configuration on that tree (per-bin sums and the
  active party's own subtraction, pre-shifted copies by the cost model), and ``ratio`` = new / reference
  seconds per tree. The new exchange sends no pre-shifted copies (running sums need every bin's own sum),
  so its Horner ``compress`` stage is part of the difference too; both are listed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import _common

from datasets import shared_datasets_dir

HERE = Path(__file__).resolve().parent
STAGES = ("encrypt", "histogram", "candidates", "compress", "rerandomize", "rerandomize_bg", "decrypt", "split_search",
          "total")


def _run(tree: Path, config: str, rounds: int, mode: str) -> dict:
    """``end_to_end.py``'s child run of ``config`` with the code of ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    shared = shared_datasets_dir()
    if shared is not None:          # the same data for a tree checked out elsewhere
        env.setdefault("VFL_SHARED_DATASETS", str(shared))
    cmd = [sys.executable, str(tree / "benchmarks" / "end_to_end.py"), "--child", "--config", config,
           "--rounds", str(rounds), "--mode", mode]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-3:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    per_round = out["per_round"]
    n = max(1, len(per_round))
    trees = n * 1       # binary: one tree per round
    stages = {k: round(sum(r.get(k, 0.0) for r in per_round) / trees, 4) for k in STAGES}
    return {"tree": str(tree), "seconds_per_tree": round(out["train_seconds"] / trees, 4), "stages_per_tree": stages,
            "shifts": out["shifts"], "test_auc": out["test_auc"], "total_bytes": out["total_bytes"],
            "n_rounds": out["n_rounds"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default_credit_2048",
                    help="a configuration of benchmarks/end_to_end.py (default: default_credit_2048)")
    ap.add_argument("--rounds", type=int, default=0, help="override its number of boosting rounds")
    ap.add_argument("--mode", choices=["he", "plain"], default="he")
    ap.add_argument("--reference-tree", type=Path, default=None,
                    help="a checkout of the code before issue 31 (per-bin sums), measured in the same run")
    args = ap.parse_args(argv)
    new = _run(HERE.parent, args.config, args.rounds, args.mode)
    result = {"cores": _common.cores(), "config": args.config, "mode": args.mode, "new": new}
    if "error" not in new:
        added = new["stages_per_tree"]["candidates"]
        new["added_seconds_per_tree"] = added
        new["added_share_of_tree"] = round(added / new["seconds_per_tree"], 4) if new["seconds_per_tree"] else None
    if args.reference_tree is not None:
        ref = _run(args.reference_tree.resolve(), args.config, args.rounds, args.mode)
        result["reference"] = ref
        if "error" not in ref and "error" not in new and ref["seconds_per_tree"]:
            result["ratio"] = round(new["seconds_per_tree"] / ref["seconds_per_tree"], 4)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
