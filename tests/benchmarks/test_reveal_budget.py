"""benchmarks/reveal_budget.py at a tiny size: one JSON object, the charge and its reference timed,
the budget file holding one count per row."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import reveal_budget as bench  # noqa: E402


def test_tiny_run(capsys):
    out = bench.main(["--rows", "50", "--records", "5", "--repeats", "2"])
    assert json.loads(capsys.readouterr().out) == out
    assert out["charge_splits_s"] > 0 and out["model_file_write_s"] > 0 and out["ratio_to_model_file_write"] > 0
    assert out["budget_file_bytes"] > 4 * 50 * 4 / 3         # base64 of 50 uint32 counts, at least
