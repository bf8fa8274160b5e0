"""Benchmark: plain vs HE vs DP (several epsilons) on the same splits; prints one JSON object.

Calls the same code as ``vfl compare`` (:func:`vfl.compare.run_comparison`),
writes its CSV/JSON/PNG files to ``--out-dir`` and prints a JSON summary in
which the ``plain`` run of the same invocation is the reference: every other
mode's training seconds and bytes are also given relative to it.

    python benchmarks/compare_modes.py --dataset default_credit --seeds 3 --he-seeds 1 --out-dir docs
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datasets.errors import VFLError  # noqa: E402
from vfl.commands.compare import compare as compare_command  # noqa: E402
from vfl.commands.compare import config_from_command  # noqa: E402
from vfl.compare import run_comparison  # noqa: E402


def main(argv=None) -> int:
    """Takes exactly the options of ``vfl compare`` (parsed by that command itself)."""
    try:
        ctx = compare_command.make_context(Path(__file__).name, list(sys.argv[1:] if argv is None else argv))
    except click.exceptions.Exit as exc:          # --help
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return 2
    options = dict(ctx.params)
    out_dir = options.pop("out_dir")
    options.pop("quiet")                          # the progress lines always go to stderr here
    try:
        doc = run_comparison(config_from_command(**options), out_dir,
                             progress=lambda s: print(s, file=sys.stderr))
    except (VFLError, click.UsageError) as exc:
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
