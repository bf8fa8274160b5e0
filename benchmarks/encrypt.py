"""Encrypting N packed gradient pairs: ours (all cores) against phe, same run.

    python benchmarks/encrypt.py --bits 1024 --rows 50000

Prints one JSON object: ``seconds`` (our default ``fast`` method: short
exponent, fixed-base table, CRT, all cores), ``phe_seconds`` (phe's
``PaillierPublicKey.encrypt`` on ``--phe-sample`` values, extrapolated to N),
``standard_seconds`` (our full-randomness method, all cores, measured on a
sample and extrapolated), ``single_core_seconds`` (fast, one process, on a
sample), a decryption check with phe's private key, and peak memory.
"""
from __future__ import annotations

import argparse
import json
import time

import _common  # noqa: F401  (sys.path)
import numpy as np

from crypto.executor import LocalExecutor
from crypto.keys import generate_keypair
from crypto.packing import PackingLayout, pack
from crypto.paillier import Decryptor, Encryptor
from vfl.core.fixedpoint import encode_fixed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--workers", type=int, default=0, help="worker processes (0: all cores)")
    ap.add_argument("--phe-sample", type=int, default=200)
    ap.add_argument("--sample", type=int, default=2000, help="values for the extrapolated variants")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    _common.quiet_keys()

    rng = np.random.default_rng(args.seed)
    N = args.rows
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=N)
    plain = pack(encode_fixed(rng.uniform(-1, 1, (N, 1)), 32), encode_fixed(rng.uniform(0, 0.25, (N, 1)), 32), layout)
    pub, priv = generate_keypair(args.bits)
    out = {"bits": args.bits, "rows": N, "cores": _common.cores()}

    fast, standard = Encryptor(pub, priv, "fast"), Encryptor(pub, priv, "standard")
    with LocalExecutor(args.workers or None, "active") as pool:
        out["workers"] = pool.n_workers
        pool.broadcast({"op": "ping"})
        t0 = time.perf_counter()
        pool.share("encryptor", fast, {"kind": "encryptor", "state": fast.state()})
        out["table_setup_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cts = fast.encrypt(plain, executor=pool)
        out["seconds"] = time.perf_counter() - t0
        s = min(args.sample, N)
        t0 = time.perf_counter()
        standard.encrypt(plain[:s], executor=pool)
        out["standard_seconds"] = (time.perf_counter() - t0) / s * N
    s = min(args.sample, N)
    fast.tables                     # built once per key (the workers built theirs above)
    t0 = time.perf_counter()
    fast.encrypt(plain[:s])
    out["single_core_seconds"] = (time.perf_counter() - t0) / s * N

    k = min(args.phe_sample, N)
    t0 = time.perf_counter()
    for v in plain[:k]:
        pub.encrypt(int(v))
    out["phe_seconds"] = (time.perf_counter() - t0) / k * N
    out["phe_sample"] = k
    idx = rng.choice(N, size=min(50, N), replace=False)
    dec = Decryptor(priv)
    out["decrypts_with_phe_key"] = all(priv.raw_decrypt(int(cts[i])) == plain[i] % pub.n for i in idx) and \
        dec.decrypt_signed([cts[i] for i in idx]) == [plain[i] for i in idx]
    out["speedup_vs_phe"] = out["phe_seconds"] / out["seconds"]
    out["peak_memory"] = _common.peak_memory()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
