"""Federated screening (WOE/IV, issue 33) against its reference, measured in the same run; one JSON object.

    python benchmarks/screen.py credit [--key-bits 2048] [--schemes paillier,ou] [--rows N]
    python benchmarks/screen.py scale --rows 1000000 --features 500 [--key-bits 1024]

``credit``: default_credit (``../shared/datasets``, or ``VFL_DATASETS``), every feature of both parties
screened in mode he, beside the reference: one root-level round of training on the same data (a
``max_depth=1``, one-round training: the same alignment, binning, key, encrypted round and root
histogram; the issue's target is screening <= 1.2x of it). Both start from the same federation, both
generate their key.

``scale``: synthetic rows x passive features (``--rows``, ``--features``) screened at ``--key-bits``;
the measured seconds by stage and a projection to SecretFlow's published setup (800k rows x 1,500
features per party, 32 vCPU, 434 s): the stages that grow with rows x passive features (the passive
party's binning and histogram) and with rows (encryption, alignment) scaled by those, the active party's
own features by its rows x features, all divided by the cores ratio (32 / this machine's cores,
assuming the kernels scale with cores as they do on the workers). A projection, not a measurement:
the full-size command is printed in the output as ``full_command``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from _common import cores, peak_memory, quiet_keys

from datasets import load_named, make_synthetic  # noqa: E402
from vfl.api import ScreenParams, federation_from_frames  # noqa: E402
from vfl.core.params import TrainParams  # noqa: E402

SECRETFLOW = {"rows": 800_000, "features_per_party": 1500, "vcpu": 32, "seconds": 434.0,
              "source": "SecretFlow vert_woe_binning benchmark (HEU), as cited in issue 33"}


def _federation(frames):
    fed = federation_from_frames(frames)
    for p in fed.passives.values():
        p.screen_allowed = True
    return fed


def credit(args) -> dict:
    frames = load_named("default_credit")
    if args.rows:
        frames = [type(pf)(pf.name, pf.frame.iloc[:args.rows], pf.id_col, pf.label_col) for pf in frames]
    out = {"benchmark": "screening_default_credit", "key_bits": args.key_bits, "cores": cores(),
           "rows": int(len(frames[0].frame)), "features": {pf.name: len(pf.feature_names) for pf in frames},
           "schemes": {}}
    for scheme in args.schemes.split(","):
        fed = _federation(frames)
        t0 = time.perf_counter()
        res = fed.screen(ScreenParams(mode="he", scheme=scheme, key_bits=args.key_bits, max_bin=args.bins))
        screen_s = time.perf_counter() - t0
        fed = _federation(frames)
        t0 = time.perf_counter()
        fed.fit(TrainParams(mode="he", scheme=scheme, key_bits=args.key_bits, n_estimators=1, max_depth=1,
                            max_bin=args.bins))
        train_s = time.perf_counter() - t0
        out["schemes"][scheme] = {
            "screen_seconds": round(screen_s, 3), "root_round_training_seconds": round(train_s, 3),
            "screen_over_training": round(screen_s / train_s, 3), "target": "<= 1.2",
            "screen_stages": {k: round(v, 3) for k, v in res.seconds.items()},
            "training_stages": {k: round(v, 3) for k, v in fed.active.timings[0].items()
                                if isinstance(v, (int, float))},
            "top_iv": sorted(((f.party, f.feature, round(f.iv, 4)) for f in res.features), key=lambda t: -t[2])[:5]}
    out["memory"] = peak_memory()
    return out


def project(stages: dict, rows: int, features: int, active_features: int, n_cores: int, to: dict = SECRETFLOW) -> float:
    """Seconds projected to ``to``'s rows, features per party and vCPUs from the measured stages: the passive
    party's (setup: binning; histograms) by the rows x features ratio, the row stages (alignment, key,
    encrypted events) by the rows ratio, the active party's own work (its features, decryption, WOE) by its
    rows x features ratio; all divided by the cores ratio."""
    cell = to["rows"] * to["features_per_party"] / (rows * features)
    row = to["rows"] / rows
    own = to["rows"] * to["features_per_party"] / (rows * max(active_features, 1))
    per_cells = stages.get("setup", 0.0) + stages.get("histograms", 0.0)
    per_rows = stages.get("align", 0.0) + stages.get("key", 0.0) + stages.get("events", 0.0)
    own_s = stages.get("own_features", 0.0) + stages.get("woe", 0.0) + stages.get("decrypt", 0.0)
    return (per_cells * cell + per_rows * row + own_s * own) / (to["vcpu"] / n_cores)


def scale(args) -> dict:
    n, F = args.rows, args.features
    frames = make_synthetic(n, [args.active_features, F], seed=0, missing_rate=0.05)
    fed = _federation(frames)
    t0 = time.perf_counter()
    res = fed.screen(ScreenParams(mode="he", scheme=args.scheme, key_bits=args.key_bits, max_bin=args.bins))
    total = time.perf_counter() - t0
    st = res.seconds
    projected = project(st, n, F, args.active_features, cores())
    return {"benchmark": "screening_scale", "rows": n, "passive_features": F, "active_features": args.active_features,
            "key_bits": args.key_bits, "scheme": args.scheme, "cores": cores(), "seconds": round(total, 3),
            "stages": {k: round(v, 3) for k, v in st.items()},
            "projection": {"to": SECRETFLOW, "seconds": round(projected, 1),
                           "method": "passive stages x (rows x features) ratio, row stages x rows ratio, the active "
                                     "party's own features x its (rows x features) ratio, / (32 / cores here)"},
            "full_command": "python benchmarks/screen.py scale --rows 1000000 --features 500 --key-bits 1024",
            "memory": peak_memory()}


def main():
    quiet_keys()
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("credit", "scale"))
    ap.add_argument("--key-bits", type=int, default=None)
    ap.add_argument("--schemes", default="paillier,ou")
    ap.add_argument("--scheme", default="paillier")
    ap.add_argument("--bins", type=int, default=32)
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--features", type=int, default=500)
    ap.add_argument("--active-features", type=int, default=10)
    args = ap.parse_args()
    if args.what == "credit":
        args.key_bits = args.key_bits or 2048
        out = credit(args)
    else:
        args.key_bits = args.key_bits or 1024
        args.rows = args.rows or 1_000_000
        out = scale(args)
    out["n_jobs"] = os.environ.get("VFL_N_JOBS")
    print(json.dumps(out, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
