"""PSI alignment against hash alignment (the reference), measured in the same run.

    python benchmarks/bench_psi.py [--n 20000] [--passives 2] [--overlap 0.8]

Each party holds ``n`` ids, a fraction ``overlap`` of them shared by all. Prints
one JSON object: seconds and bytes of each alignment and their ratios.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from parties.active import ActiveParty  # noqa: E402
from parties.passive import PassiveParty  # noqa: E402
from protocols import alignment  # noqa: E402
from protocols.transport import InMemoryTransport, frame_handler  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--passives", type=int, default=2)
    ap.add_argument("--overlap", type=float, default=0.8)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n, shared = args.n, int(args.n * args.overlap)
    common = [f"c{i}" for i in range(shared)]

    def ids(tag):
        return np.array(common + [f"{tag}{i}" for i in range(n - shared)], dtype=object)[rng.permutation(n)]

    active_frame = pd.DataFrame({"id": ids("a"), "y": rng.integers(0, 2, n), "a0": rng.normal(size=n)})
    passive_frames = {f"p{j}": pd.DataFrame({"id": ids(f"p{j}_"), "x": rng.normal(size=n)})
                      for j in range(args.passives)}
    out = {"benchmark": "psi_alignment", "n_ids_per_party": n, "n_passives": args.passives,
           "n_common": shared}
    rows = {}
    salt = alignment.new_salt()
    for method in ("hash", "psi"):
        active = ActiveParty("active", active_frame)
        passives = [PassiveParty(name, f) for name, f in passive_frames.items()]
        tr = InMemoryTransport("active", {p.name: frame_handler(p.handle) for p in passives})
        t0 = time.perf_counter()
        rows[method] = (active.align if method == "hash" else active.align_psi)(tr, [p.name for p in passives],
                                                                               salt, "bench")
        out[f"{method}_seconds"] = round(time.perf_counter() - t0, 3)
        out[f"{method}_bytes"] = tr.total_bytes()
    out["same_rows_and_order"] = bool(np.array_equal(rows["hash"], rows["psi"]))
    out["psi_over_hash_seconds"] = round(out["psi_seconds"] / max(out["hash_seconds"], 1e-9), 1)
    out["psi_over_hash_bytes"] = round(out["psi_bytes"] / out["hash_bytes"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
