"""The two schemes side by side: our Paillier, our Okamoto-Uchiyama (OU), phe, and HEU's OU and
ZPaillier, on the same data in the same run; then default_credit end to end with both our schemes.

    python benchmarks/schemes.py                                  # the issue's run (2048 bits)
    python benchmarks/schemes.py --bits 1024 --rows 300 --e2e-trees 1 --e2e-rows 2000   # a tiny run
    python benchmarks/schemes.py --secretflow                     # also SecretFlow's SGB workload

Prints one JSON object (notes, e.g. a skipped HEU, go to stderr)::

    {"schemes": {NAME: {"encrypt_us_per_value", "hist_us_per_addition", "decrypt_us_per_value"}},
     "end_to_end": {NAME: {"train_seconds", "test_auc", "bytes_sent"}},
     "equal_work": {"ou_exponent_bits", "ou_encrypt_us_per_value", "heu_ou_encrypt_us_per_value"}}

``equal_work``: our OU encryption again, at HEU's exponent length (110 bits at 2048-bit keys, about
the security level; we ship ``2 * security`` = 230 bits), so that the implementations are compared
at equal work; never what training runs.

NAME among ``paillier``, ``ou`` (ours), ``phe``, ``heu_ou``, ``heu_zpaillier``. Per scheme, on one
core, ``--rows`` packed (g, h) values (binary logloss bounds, 32 fractional bits) are encrypted
(ours: fixed base, short exponent, CRT, no obfuscator stock; phe: ``PaillierPublicKey.encrypt`` on
``--phe-sample`` values); one histogram of all rows over ``--features`` x ``--bins`` buckets is summed
(ours: :func:`crypto.histogram.block_sums`, the joint-bins kernel a worker runs for a shard in
training; phe: ``EncryptedNumber`` additions; HEU: ``Evaluator.batch_feature_wise_bucket_sum``, the
call SecretFlow's SGB makes) and reported per textbook addition (rows x features); the buckets are
decrypted (per value). Every scheme's sums are checked against the plaintext sums.

``end_to_end``: ``default_credit`` (``../shared/datasets`` or ``$VFL_SHARED_DATASETS``), ``--e2e-trees``
trees depth ``--e2e-depth`` at ``--bits``, mode he, for ``paillier`` and ``ou`` (the trees are the
same: identical AUC); ``bytes_sent`` counts every message both ways. ``--e2e-trees 0`` skips it.

``--secretflow`` adds ``"secretflow_workload"``: a synthetic table of the shape of SecretFlow's SGB
benchmark (bank marketing: 45,211 rows x 16 features split 8 + 8 between 2 parties, 100 rounds,
depth 5, OU), trained with both schemes (``--sf-rows`` / ``--sf-rounds`` shrink it; 80% of the rows
train, as everywhere here), with seconds and core-seconds (seconds x cores of this machine, both
parties sharing them) beside SecretFlow's published figure: 136 s on 8 cores per party on a LAN --
**their hardware and their data**.

HEU is the optional, benchmark-only extra ``heu`` (``pip install .[heu]``, ``sf-heu``); where it does
not import (or ``$VFL_HEU_PATH`` names a ``pip install --target`` directory holding it) it is
skipped with a note.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

import _common
import gmpy2
import numpy as np
from phe import EncryptedNumber

if os.environ.get("VFL_HEU_PATH"):
    sys.path.insert(0, os.environ["VFL_HEU_PATH"])
try:
    from heu import numpy as hnp
    from heu import phe as hphe
except ImportError as exc:          # the optional extra heu is not installed
    hnp = hphe = None
    HEU_MISSING = str(exc)
else:
    HEU_MISSING = None

from crypto import ou, schemes
from crypto.histogram import block_sums
from crypto.keys import generate_keypair
from crypto.packing import PackingLayout, pack
from crypto.paillier import Decryptor, Encryptor
from datasets import load_shared, make_synthetic, shared_datasets_dir
from vfl.api import simulate
from vfl.core.fixedpoint import encode_fixed
from vfl.core.params import TrainParams

#: SecretFlow's published SGB figure (their hardware, their data): bank marketing, 2 parties, OU
SECRETFLOW = {"rows": 45_211, "features": 16, "parties": 2, "rounds": 100, "depth": 5, "seconds": 136.0,
              "cores_per_party": 8, "note": "SecretFlow SGB benchmark, bank marketing, LAN: their hardware and data"}


def note(msg: str) -> None:
    print(f"note: {msg}", file=sys.stderr)


def problem(rows: int, features: int, bins: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    g = encode_fixed(rng.uniform(-1, 1, (rows, 1)), 32)
    h = encode_fixed(rng.uniform(0, 0.25, (rows, 1)), 32)
    layout = PackingLayout.for_bounds(1.0, 0.25, max_rows=rows)
    plain = pack(g, h, layout)
    order = rng.integers(0, bins, (rows, features)).astype(np.int8)
    expected = np.zeros(features * bins, dtype=object)
    for j in range(features):
        np.add.at(expected, j * bins + order[:, j].astype(np.int64), np.array(plain, dtype=object))
    return plain, order, expected.tolist()


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def ours(name: str, bits: int, plain, order, expected) -> dict:
    """Our Paillier or OU: encrypt, the joint-bins histogram of all rows, decrypt."""
    pub, priv = schemes.generate_keypair(bits, name)
    enc, dec = schemes.encryptor(pub, priv), schemes.decryptor(priv)
    enc.obfuscators(1)                           # the fixed-base tables, built once per key and process
    rows, features = order.shape
    bins = len(expected) // features
    cts, t_enc = _timed(lambda: enc.encrypt(plain))
    modulus = gmpy2.mpz(schemes.cipher_modulus(pub))
    sums, t_hist = _timed(lambda: block_sums(cts, order.astype(np.uint16), [bins] * features, modulus))
    got, t_dec = _timed(lambda: dec.decrypt_signed(sums))
    if got != expected:
        raise SystemExit(f"{name}: the decrypted histogram differs from the plaintext sums")
    return {"encrypt_us_per_value": t_enc / rows * 1e6, "hist_us_per_addition": t_hist / (rows * features) * 1e6,
            "decrypt_us_per_value": t_dec / len(sums) * 1e6}


#: HEU's OU exponent length by key size (``internal_params::kRandomBits*`` in HEU's ``ou/public_key.h``)
HEU_OU_EXPONENT_BITS = {1024: 80, 2048: 110, 3072: 128}


def equal_work(bits: int, plain) -> dict:
    """Our OU encryption at HEU's exponent length (about the security level, not the ``2 *
    security`` bits we ship: see :class:`crypto.ou.Encryptor`): the two implementations at the
    same work per value, to tell the implementation's speed from the parameter's."""
    r_bits = HEU_OU_EXPONENT_BITS.get(bits)
    if r_bits is None:
        return {}
    pub, priv = ou.generate_keypair(bits)
    enc = ou.Encryptor(pub, priv, exponent_bits=r_bits)
    enc.obfuscators(1)
    cts, t_enc = _timed(lambda: enc.encrypt(plain))
    if ou.Decryptor(priv).decrypt_signed(cts[:50]) != list(plain[:50]):
        raise SystemExit("ou at HEU's exponent length: decryption differs")
    return {"ou_exponent_bits": r_bits, "ou_encrypt_us_per_value": round(t_enc / len(plain) * 1e6, 3),
            "note": "ours at HEU's exponent length, for comparison only: training uses 2 x security bits"}


def phe_scheme(bits: int, plain, order, expected, sample: int) -> dict:
    """python-paillier objects: encrypt a sample, EncryptedNumber additions per bucket, decrypt."""
    pub, priv = generate_keypair(bits)
    rows, features = order.shape
    bins = len(expected) // features
    k = min(sample, rows)
    _, t_enc = _timed(lambda: [pub.encrypt(int(v)) for v in plain[:k]])
    raw = Encryptor(pub, priv).encrypt(plain)     # the same plaintexts as phe objects, made fast
    cts = [EncryptedNumber(pub, int(c), 0) for c in raw]

    def sums():
        out = [None] * (features * bins)
        for j in range(features):
            col = order[:, j].tolist()
            for i, b in enumerate(col):
                s = j * bins + b
                out[s] = cts[i] if out[s] is None else out[s] + cts[i]
        return out

    buckets, t_hist = _timed(sums)
    zero = pub.encrypt(0)
    buckets = [zero if b is None else b for b in buckets]
    got, t_dec = _timed(lambda: [priv.decrypt(b) for b in buckets])
    if got != expected:
        raise SystemExit("phe: the decrypted histogram differs from the plaintext sums")
    if Decryptor(priv).decrypt_signed([b.ciphertext(be_secure=False) for b in buckets[:1]]) != got[:1]:
        raise SystemExit("phe: raw decryption disagrees")
    return {"encrypt_us_per_value": t_enc / k * 1e6, "hist_us_per_addition": t_hist / (rows * features) * 1e6,
            "decrypt_us_per_value": t_dec / len(buckets) * 1e6}


def heu_scheme(schema: str, bits: int, plain, order, expected) -> dict:
    """HEU (sf-heu): encrypt an array, batch_feature_wise_bucket_sum, decrypt."""
    kit = hnp.setup(getattr(hphe.SchemaType, schema), bits)
    encryptor, evaluator, decryptor = kit.encryptor(), kit.evaluator(), kit.decryptor()
    encoder = kit.bigint_encoder()                 # packed values exceed 64 bits
    rows, features = order.shape
    bins = len(expected) // features
    pts = kit.array(np.array(plain, dtype=object).reshape(rows, 1), encoder)
    cts, t_enc = _timed(lambda: encryptor.encrypt(pts))
    subgroup = [np.ones((1, rows), dtype=np.int8)]
    (sums,), t_hist = _timed(lambda: evaluator.batch_feature_wise_bucket_sum(cts, subgroup, order, bins, False))
    out, t_dec = _timed(lambda: decryptor.decrypt(sums))
    got = [int(v) for v in np.asarray(out.to_numpy(encoder)).reshape(-1)]
    if got != expected:
        raise SystemExit(f"heu {schema}: the decrypted histogram differs from the plaintext sums")
    return {"encrypt_us_per_value": t_enc / rows * 1e6, "hist_us_per_addition": t_hist / (rows * features) * 1e6,
            "decrypt_us_per_value": t_dec / (features * bins) * 1e6}


def end_to_end(args) -> dict:
    root = shared_datasets_dir()
    if root is None:
        note("../shared/datasets is not available (set VFL_SHARED_DATASETS): end_to_end skipped")
        return {}
    frames = load_shared("default_credit", root)
    if args.e2e_rows:
        keep = frames[0].frame[frames[0].id_col].iloc[:args.e2e_rows]
        frames = [replace(pf, frame=pf.frame[pf.frame[pf.id_col].isin(keep)]) for pf in frames]
    out = {}
    for scheme in schemes.SCHEMES:
        params = TrainParams(mode="he", scheme=scheme, key_bits=args.bits, n_estimators=args.e2e_trees,
                             max_depth=args.e2e_depth)
        _, result, _, _ = simulate(frames, params, test_size=0.2, seed=0)
        out[scheme] = {"train_seconds": result["train_seconds"], "test_auc": result["test_auc"],
                       "bytes_sent": result["total_bytes"]}
    return out


def secretflow_workload(args) -> dict:
    rows, rounds = args.sf_rows, args.sf_rounds
    frames = make_synthetic(rows, [SECRETFLOW["features"] // 2] * 2, seed=0)
    out = {"theirs": SECRETFLOW, "rows": rows, "features": SECRETFLOW["features"], "rounds": rounds,
           "depth": SECRETFLOW["depth"], "cores": _common.cores(), "bits": args.bits}
    for scheme in schemes.SCHEMES:
        params = TrainParams(mode="he", scheme=scheme, key_bits=args.bits, n_estimators=rounds,
                             max_depth=SECRETFLOW["depth"])
        _, result, _, _ = simulate(frames, params, test_size=0.2, seed=0)
        sec = result["train_seconds"]
        out[scheme] = {"train_seconds": sec, "core_seconds": sec * _common.cores(),
                       "test_auc": result.get("test_auc"), "bytes_sent": result["total_bytes"]}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--features", type=int, default=10)
    ap.add_argument("--bins", type=int, default=32)
    ap.add_argument("--phe-sample", type=int, default=500, help="values phe encrypts (it is slow)")
    ap.add_argument("--only", nargs="*", default=None, help="scheme names to run (default: all)")
    ap.add_argument("--e2e-trees", type=int, default=10)
    ap.add_argument("--e2e-depth", type=int, default=4)
    ap.add_argument("--e2e-rows", type=int, default=0, help="default_credit rows to keep (0: all)")
    ap.add_argument("--secretflow", action="store_true", help="also SecretFlow's SGB workload (2 parties, 100 rounds)")
    ap.add_argument("--sf-rows", type=int, default=SECRETFLOW["rows"])
    ap.add_argument("--sf-rounds", type=int, default=SECRETFLOW["rounds"])
    args = ap.parse_args(argv)
    if not 2 <= args.bins <= 127:
        raise SystemExit("--bins must be 2..127 (HEU's bucket map is int8)")
    _common.quiet_keys()
    only = set(args.only or ("paillier", "ou", "phe", "heu_ou", "heu_zpaillier"))
    plain, order, expected = problem(args.rows, args.features, args.bins)
    out = {"schemes": {}, "end_to_end": {}}
    for name in ("paillier", "ou"):
        if name in only:
            out["schemes"][name] = ours(name, args.bits, plain, order, expected)
    if "phe" in only:
        out["schemes"]["phe"] = phe_scheme(args.bits, plain, order, expected, args.phe_sample)
    for name, schema in (("heu_ou", "OU"), ("heu_zpaillier", "ZPaillier")):
        if name not in only:
            continue
        if hnp is None:
            note(f"HEU is not installed ({HEU_MISSING}): {name} skipped (pip install .[heu])")
            continue
        out["schemes"][name] = heu_scheme(schema, args.bits, plain, order, expected)
    if "ou" in only and ("heu_ou" in only or hnp is None):
        out["equal_work"] = equal_work(args.bits, plain)
        heu = out["schemes"].get("heu_ou")
        if heu and out["equal_work"]:
            out["equal_work"]["heu_ou_encrypt_us_per_value"] = round(heu["encrypt_us_per_value"], 3)
    for rec in out["schemes"].values():
        for k, v in rec.items():
            rec[k] = round(v, 3)
    if args.e2e_trees > 0:
        out["end_to_end"] = end_to_end(args)
    if args.secretflow:
        out["secretflow_workload"] = secretflow_workload(args)
    print(json.dumps(out, indent=1))
    return out


def _json_only_stdout():
    """HEU's C++ logger writes to file descriptor 1: send that to stderr and keep Python's
    ``sys.stdout`` on a copy of the real stdout, so the script prints one JSON object and nothing else."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(saved, "w", closefd=True)


if __name__ == "__main__":
    _json_only_stdout()
    main()
