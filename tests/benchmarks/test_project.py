"""benchmarks/project.py: the projection of docs/scale.md from scale.py's JSON (linear scaling, memory fitted)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import project  # noqa: E402
import scale  # noqa: E402


def _run(rows, executor="dask", passive_mb=(100.0, 100.0), active_mb=(50.0, 50.0)):
    res = {"rows": rows, "executor": executor, "workers_per_party": 2,
           "stages": {"encrypt": 2e-5 * rows, "histogram": 1e-6 * rows * 50, "compress": 1.0, "decrypt": 1.0,
                      "split_search": 0.5, "total": 2e-5 * rows + 1e-6 * rows * 50 + 2.5},
           "worker_peak_rss_mb": [{"role": "passive/dask-worker", "pid": 1, "peak_mb": passive_mb[0]},
                                  {"role": "passive/dask-worker", "pid": 2, "peak_mb": passive_mb[1]},
                                  {"role": "passive/dask-scheduler", "pid": 3, "peak_mb": 999.0},
                                  {"role": "active/dask-worker", "pid": 4, "peak_mb": active_mb[0]},
                                  {"role": "active/dask-worker", "pid": 5, "peak_mb": active_mb[1]}]}
    res["throughput"] = scale.throughput(res)
    return res


def test_throughput_is_per_core_and_the_projection_scales_linearly():
    r = _run(1_000_000)
    tp = r["throughput"]
    assert tp["encrypt_core_s_per_row"] == pytest.approx(4e-5)          # 2 workers
    assert tp["histogram_core_s_per_row_feature"] == pytest.approx(2e-6)
    assert tp["other_s"] == pytest.approx(2.5)
    p16 = project.project(r, 10_000_000, 500, 16)
    p64 = project.project(r, 10_000_000, 500, 64)
    assert p16["encrypt_s"] == pytest.approx(4e-5 * 1e7 / 16)
    assert p16["histogram_s"] == pytest.approx(2e-6 * 1e7 * 500 / 16)
    assert p16["seconds_per_tree"] == pytest.approx(4 * p64["seconds_per_tree"])
    assert not p16["memory_fitted"] and p16["passive_worker_mb"] == pytest.approx(200 / 1e6 * 1e7 * 10 / 16)


def test_worker_memory_is_a_fixed_part_plus_a_part_per_row_fitted_on_two_row_counts(capsys, tmp_path):
    small, big = _run(250_000, passive_mb=(60, 60)), _run(1_000_000, passive_mb=(90, 90))
    local_big = _run(1_000_000, executor="local")
    doc = {"features": [10, 50], "results": [small, local_big, big]}
    assert project.pick(doc) is big                           # the most rows, Dask before the local pool
    assert project.pick({"results": [small, local_big]}) is local_big
    fixed, per_row, fitted = project.memory_model([small, big], "passive")
    assert fitted and per_row == pytest.approx(60 / 750_000) and fixed == pytest.approx(50.0)
    got = project.project(big, 1_000_000, 50, 2, runs=[small, big])
    assert got["passive_worker_mb"] == pytest.approx(90.0)     # the measured point itself
    path = tmp_path / "scale.json"
    path.write_text(json.dumps(doc))
    project.main([str(path), "--cores", "16"])
    out = capsys.readouterr().out
    assert "| 16 |" in out and "fitted on the runs' mean worker peaks at 2 row counts" in out


def test_pick_refuses_a_json_without_a_successful_run():
    with pytest.raises(SystemExit, match="no successful run"):
        project.pick({"results": [{"rows": 5, "executor": "dask", "error": "boom"}]})
