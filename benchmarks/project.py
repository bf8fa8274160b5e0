"""The projection of docs/scale.md (issue 11): time per tree and memory per worker for a large table on many
cores, computed from the per-core throughput measured by ``benchmarks/scale.py``.

    python benchmarks/scale.py > scale.json
    python benchmarks/project.py scale.json                       # 10M x 500 on 16, 64 and 256 cores
    python benchmarks/project.py scale.json --rows 5e6 --features 200 --cores 32

It takes the run with the most rows (Dask preferred, else the local pool) and assumes one worker per
core, work spread evenly and linear scaling: encryption ~ rows, histograms ~ rows x passive features,
the rest (compression, decryption, split search: per histogram bin) ~ features and divided over the
cores; worker memory ~ the measured peak per (row x feature) (passive: bins and raw rows; an upper
bound, it includes each worker's fixed start-up memory) and per row (active: ciphertexts), a fixed
part per worker plus a part per row fitted on two or more row counts (one row count: no fixed part,
an upper bound). Key size
as measured (1024 bits) unless ``--key-factor`` (e.g. ~7 for 2048-bit Paillier encryption, and
ciphertexts twice as large: use ``--memory-factor 2``). Prints a Markdown table and, with ``--json``,
the numbers.
"""
from __future__ import annotations

import argparse
import json
import sys


def pick(doc: dict) -> dict:
    """The run the projection is made from: the most rows, Dask before the local pool."""
    runs = [r for r in doc.get("results", []) if "throughput" in r]
    if not runs:
        raise SystemExit("no successful run with throughput in this JSON (run benchmarks/scale.py)")
    return max(runs, key=lambda r: (r["rows"], r["executor"] == "dask"))


def _workers(run: dict, party: str) -> list[float]:
    return [w["peak_mb"] for w in run["worker_peak_rss_mb"]
            if w["role"].startswith(party) and "scheduler" not in w["role"]]


def memory_model(runs: list[dict], party: str) -> tuple[float, float, bool]:
    """``(fixed MB per worker, MB per row summed over the workers, fitted)``: a line through the
    runs' mean worker peak against rows (two or more row counts), else no fixed part (an upper
    bound)."""
    pts = sorted({r["rows"]: r for r in runs}.items())
    if len(pts) >= 2:
        (n1, r1), (n2, r2) = pts[0], pts[-1]
        w1, w2 = _workers(r1, party), _workers(r2, party)
        m1, m2 = sum(w1) / len(w1), sum(w2) / len(w2)
        per_row = max(m2 - m1, 0.0) * len(w2) / (n2 - n1)
        return max(m1 - per_row * n1 / len(w1), 0.0), per_row, True
    (n, r), = pts
    return 0.0, sum(_workers(r, party)) / n, False


def project(run: dict, rows: float, features: int, cores: int, key_factor: float = 1.0,
            memory_factor: float = 1.0, measured_features: int = 50, runs: list[dict] | None = None) -> dict:
    tp = run["throughput"]
    runs = runs or [run]
    p_fixed, p_row, fitted = memory_model(runs, "passive")
    a_fixed, a_row, _ = memory_model(runs, "active")
    encrypt = tp["encrypt_core_s_per_row"] * rows * key_factor / cores
    histogram = tp["histogram_core_s_per_row_feature"] * rows * features * key_factor / cores
    other = tp["other_s"] * (features / measured_features) * run["workers_per_party"] / cores * key_factor
    return {"cores": cores, "encrypt_s": encrypt, "histogram_s": histogram, "other_s": other,
            "seconds_per_tree": encrypt + histogram + other,
            "passive_worker_mb": p_fixed + p_row * rows * (features / measured_features) / cores,
            "active_worker_mb": a_fixed + a_row * rows * memory_factor / cores, "memory_fitted": fitted}


def table(run: dict, rows: float, features: int, cores: list[int], key_factor: float, memory_factor: float,
          measured_features: int, doc_runs: list[dict]) -> tuple[str, list[dict]]:
    runs = [r for r in doc_runs if r.get("executor") == run["executor"] and "worker_peak_rss_mb" in r]
    out = [project(run, rows, features, c, key_factor, memory_factor, measured_features, runs) for c in cores]
    head = (f"Projection for {rows:,.0f} rows x {features} passive features, one tree of depth 3, from the "
            f"{run['executor']} run at {run['rows']:,} rows ({run['workers_per_party']} workers per party)"
            + (f", key factor {key_factor}" if key_factor != 1 else "") + ":\n\n")
    lines = ["| cores per party | encrypt (s) | histograms (s) | rest (s) | time per tree | passive worker memory "
             "| active worker memory |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for p in out:
        lines.append(f"| {p['cores']} | {p['encrypt_s']:,.0f} | {p['histogram_s']:,.0f} | {p['other_s']:,.0f} | "
                     f"{p['seconds_per_tree'] / 60:,.1f} min | {p['passive_worker_mb']:,.0f} MB | "
                     f"{p['active_worker_mb']:,.0f} MB |")
    note = ("\n\nWorker memory: a fixed part plus a part per row, fitted on the runs' mean worker peaks at "
            f"{len({r['rows'] for r in runs})} row counts." if out[0]["memory_fitted"] else
            "\n\nWorker memory: one row count measured, so no fixed part is separated (an upper bound).")
    return head + "\n".join(lines) + note, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scale_json", help="the output of benchmarks/scale.py ('-': stdin)")
    ap.add_argument("--rows", type=float, default=10_000_000)
    ap.add_argument("--features", type=int, default=500, help="passive features")
    ap.add_argument("--cores", type=int, action="append", help="cores per party (repeatable; default 16, 64, 256)")
    ap.add_argument("--key-factor", type=float, default=1.0, help="time factor of the key size vs the measured one")
    ap.add_argument("--memory-factor", type=float, default=1.0, help="ciphertext size factor vs the measured one")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON after the table")
    args = ap.parse_args(argv)
    if args.scale_json == "-":
        doc = json.load(sys.stdin)
    else:
        with open(args.scale_json) as f:
            doc = json.load(f)
    run = pick(doc)
    text, rows = table(run, args.rows, args.features, args.cores or [16, 64, 256], args.key_factor,
                       args.memory_factor, int(doc.get("features", [10, 50])[1]), doc.get("results", []))
    print(text)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
