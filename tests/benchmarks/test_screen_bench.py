"""benchmarks/screen.py: the projection to SecretFlow's setup scales each stage by what it grows with."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import screen  # noqa: E402


def test_the_projection_scales_cells_rows_and_cores():
    to = {"rows": 800, "features_per_party": 30, "vcpu": 4}
    base = screen.project({"setup": 1.0, "histograms": 2.0}, 100, 10, 5, 2, to)
    assert base == pytest.approx(3.0 * (800 * 30 / 1000) / 2)
    assert screen.project({"events": 1.0, "key": 1.0, "align": 1.0}, 100, 10, 5, 2, to) == pytest.approx(3 * 8 / 2)
    assert screen.project({"own_features": 1.0}, 100, 10, 5, 4, to) == pytest.approx(800 * 30 / 500)
