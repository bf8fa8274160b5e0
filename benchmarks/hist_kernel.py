"""One encrypted histogram over all rows, on all cores, against a raw gmpy2 loop.

    python benchmarks/hist_kernel.py --bits 1024 --rows 50000 --features 10 --bins 32

Measures the path training runs (issue 24): the rows cut into shards on the passive party's
workers (:class:`crypto.shards.ShardSet`, bins placed, encrypted gradients written as the intake
writes them), then one root-level :meth:`crypto.shards.ShardSet.histograms` request (one task per
worker over its shards, the partials summed in slices on the workers).

Prints one JSON object: ``seconds`` (the kernel, ciphertexts already in the
worker processes as they are after a round's gradient stream; ``shards`` of them),
``additions`` (the homomorphic additions the kernel performed; with joint
bins fewer than ``textbook_additions`` = rows x features - non-empty bins),
``correct`` (every bin decrypts to the plaintext sum), and for
reference, measured in the same run: ``raw_loop_seconds`` (a bare gmpy2
``acc * c % n^2`` loop over rows x features products on one core, the
textbook histogram's cost, timed on a sample and extrapolated) and
``floor_seconds`` = that / cores. Also the sharing (``share_seconds``: bins placed;
``fill_seconds``: gradients written), the Horner compression and decryption of the result,
the joint bin plan, and peak memory.
"""
from __future__ import annotations

import argparse
import json
import time

import _common  # noqa: F401  (sys.path)
import gmpy2
import numpy as np

from crypto.compress import compress
from crypto.executor import LocalExecutor
from crypto.histogram import plan_groups
from crypto.intcodec import int_width, ints_to_bytes
from crypto.keys import generate_keypair
from crypto.packing import PackingLayout, decode_sums, pack
from crypto.paillier import Decryptor, Encryptor
from crypto.shards import ShardedGradients, ShardSet
from vfl.core.fixedpoint import encode_fixed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--features", type=int, default=10)
    ap.add_argument("--bins", type=int, default=32, help="ordinary bins per feature (plus one missing bin)")
    ap.add_argument("--workers", type=int, default=0, help="worker processes (0: all cores)")
    ap.add_argument("--joint", default="auto", help="auto, 1 (no joint bins), 2 or 3")
    ap.add_argument("--sample", type=int, default=100_000, help="products timed for the raw reference")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    joint = args.joint if args.joint == "auto" else int(args.joint)
    _common.quiet_keys()

    rng = np.random.default_rng(args.seed)
    N, F, B = args.rows, args.features, args.bins + 1
    g = encode_fixed(rng.uniform(-1, 1, (N, 1)), 32)
    h = encode_fixed(rng.uniform(0, 0.25, (N, 1)), 32)
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=N)
    plain = pack(g, h, layout)
    bins = rng.integers(0, args.bins, (N, F)).astype(np.uint16)   # the missing-value slot stays empty
    offsets = np.arange(F + 1, dtype=np.int64) * B
    pub, priv = generate_keypair(args.bits)
    n2 = gmpy2.mpz(pub.nsquare)
    enc, dec = Encryptor(pub, priv), Decryptor(priv)
    out = {"bits": args.bits, "rows": N, "features": F, "bins": args.bins, "cores": _common.cores()}

    with LocalExecutor(None, "active") as active_pool:
        t0 = time.perf_counter()
        cts = enc.encrypt(plain, executor=active_pool)
        out["encrypt_seconds"] = time.perf_counter() - t0

        # reference: the bare loop, one core, same ciphertexts
        k = min(args.sample, N * F)
        sample = [cts[i % N] for i in range(k)]
        t0 = time.perf_counter()
        acc = gmpy2.mpz(1)
        for v in sample:
            acc = acc * v % n2
        raw = (time.perf_counter() - t0) / k * N * F
        out["raw_loop_seconds"] = raw
        out["raw_loop_us_per_mulmod"] = raw / (N * F) * 1e6

        with LocalExecutor(args.workers or None, "passive") as pool:
            out["workers"] = pool.n_workers
            pool.broadcast({"op": "ping"})
            shards = ShardSet(pool, N, prefix="bench/")
            out["shards"] = len(shards)
            t0 = time.perf_counter()
            shards.place_array("bins", bins)
            out["share_seconds"] = time.perf_counter() - t0
            w = int_width(n2)
            grads = ShardedGradients(0, True, layout, 1, 1, 1, w, False, np.zeros(N, dtype=bool))
            t0 = time.perf_counter()
            shards.forward(grads, 0, N, ints_to_bytes(cts, w), format(int(n2), "x"))
            out["fill_seconds"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            cpu0 = pool.cpu_seconds
            sums, header = shards.histograms(grads, np.zeros((1, N), dtype=np.int64), [0], [0], [B] * F, n2,
                                             joint=joint)
            out["seconds"] = time.perf_counter() - t0
            out["worker_cpu_seconds"] = pool.cpu_seconds - cpu0
            stats = {"additions": int(header.get("additions", 0))}
            hist = list(sums)
            per = layout.values_per_plaintext(args.bits)
            t0 = time.perf_counter()
            packed = compress(hist, layout.value_bits, per, n2, executor=pool)
            out["compress_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        got_g, got_h = decode_sums(dec.decrypt_signed(packed, executor=active_pool), layout, per, len(hist))
        out["decrypt_seconds"] = time.perf_counter() - t0
        out["ciphertexts_decrypted"] = len(packed)

    # plaintext sums per (feature, bin)
    flat = (bins.astype(np.int64) + offsets[:-1][None, :]).ravel()
    exp_g = np.bincount(flat, np.repeat(g[:, 0].astype(np.float64), F), minlength=F * B)
    exp_h = np.bincount(flat, np.repeat(h[:, 0].astype(np.float64), F), minlength=F * B)
    gi = [int(x) for x in np.asarray(g[:, 0]).tolist()]
    hi = [int(x) for x in np.asarray(h[:, 0]).tolist()]
    exact_g = [0] * (F * B)
    exact_h = [0] * (F * B)
    for f in range(F):
        for i, b in enumerate(bins[:, f].tolist()):
            exact_g[f * B + b] += gi[i]
            exact_h[f * B + b] += hi[i]
    out["correct"] = bool([int(x) for x in got_g[:, 0]] == exact_g and [int(x) for x in got_h[:, 0]] == exact_h
                          and np.allclose(exp_g, exact_g) and np.allclose(exp_h, exact_h))
    out["additions"] = stats["additions"]
    out["textbook_additions"] = N * F - int(sum(np.count_nonzero(np.bincount(bins[:, f], minlength=B))
                                                for f in range(F)))
    groups = plan_groups(bins, [B] * F, joint)
    out["joint_groups"] = {str(k): sum(len(gr) == k for gr in groups) for k in (1, 2, 3)}
    out["floor_seconds"] = raw / out["cores"]
    out["speedup_vs_raw_loop"] = raw / out["seconds"]
    out["peak_memory"] = _common.peak_memory()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
