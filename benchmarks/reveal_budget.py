"""The cost of the passive party's lifetime reveal budget on the split path (issue 31).

Before answering each ``SplitRequest`` the passive party charges its reveal budget
(:meth:`parties.reveal_budget.RevealBudget.charge_splits`: read, check and write the file under
its lock, fsynced). The reference, measured in the same run on the same disk: what the server
already writes at each split, the model file with the lookup table (``write_json_atomic`` of a
passive model dict of ``--records`` records). Prints one JSON object.

    python benchmarks/reveal_budget.py --rows 30000 --repeats 30      # default_credit's size
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (sys.path)
import numpy as np

from datasets.files import write_json_atomic
from parties.passive_limits import Limits
from parties.reveal_budget import RevealBudget


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=30000, help="rows of the dataset (default_credit: 30000)")
    ap.add_argument("--records", type=int, default=300, help="records of the lookup table written per split")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    d = Path(tempfile.mkdtemp(prefix="vfl-reveal-"))
    budget = RevealBudget(d / "ledgers" / "reveal-budget.json", Limits(lifetime_split_answers_per_row=1 << 31))
    rows = np.arange(args.rows)
    budget.charge_splits("fp", args.rows, rows)          # the file exists, as after the first split
    model = {"format": "vfl-passive-model", "records": [
        {"record_id": i, "round": i // 7, "tree": 0, "node_id": i % 7, "feature_idx": 3, "feature": "f3",
         "threshold": 0.5 + i, "default_left": True} for i in range(args.records)]}
    charge = _median(lambda: budget.charge_splits("fp", args.rows, rows), args.repeats)
    reference = _median(lambda: write_json_atomic(d / "model.json", model), args.repeats)
    out = {"rows": args.rows, "records": args.records, "repeats": args.repeats,
           "charge_splits_s": round(charge, 5), "model_file_write_s": round(reference, 5),
           "ratio_to_model_file_write": round(charge / reference, 3) if reference else None,
           "budget_file_bytes": (d / "ledgers" / "reveal-budget.json").stat().st_size}
    shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
