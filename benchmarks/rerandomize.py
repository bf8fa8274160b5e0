"""The cost of a passive party's re-randomisation (issues 22 and 31), JSON on stdout.

Issue 31 replaced the short fixed-base obfuscator ``hs^a`` (the key holder's base, a 2 * security-bit
exponent) by ``r^n`` from the passive party's own uniform ``r`` (OU: ``y^n``). This script measures,
in the same run:

* ``per_obfuscator``: seconds per obfuscator, old (``hs^a``, OU ``h^r``) and new (``r^n``, ``y^n``),
  and their ratio, at ``--bits``;
* ``training``: a real ``he`` training of ``--data`` (default_credit) with ``--rounds`` rounds of
  depth ``--depth``: the mean tree time, the passive parties' re-randomisation on the critical path
  (``rerandomize``) and in the background (``rerandomize_bg``, made while they waited), both also as
  a share of a tree, and the ciphertexts per tree.

    python benchmarks/rerandomize.py --bits 2048 --rounds 5      # the issue's setting
    python benchmarks/rerandomize.py --bits 1024 --rounds 1 --rows 2000   # a quick check
"""
from __future__ import annotations

import argparse
import json
import time

import _common  # puts the repository on sys.path

from crypto import ou, schemes
from crypto.paillier import Encryptor
from datasets import load_shared
from vfl.api import TrainParams, federation_from_frames


def _per(fn, count: int) -> float:
    t0 = time.perf_counter()
    fn(count)
    return (time.perf_counter() - t0) / count


def per_obfuscator(bits: int, count: int) -> dict:
    pk, sk = schemes.generate_keypair(bits)
    holder = Encryptor(pk, sk, "fast")
    old = Encryptor(pk, None, "fast", _hs=holder.hs)
    old.tables
    new = schemes.reply_encryptor(pk)
    opub, _ = schemes.generate_keypair(bits, scheme=schemes.OU)
    ou_old = ou.Encryptor(opub, None, "fast")
    ou_old.tables
    ou_new = schemes.reply_encryptor(opub)
    out = {"paillier_hs_short_s": _per(old.obfuscators, count), "paillier_r_n_s": _per(new.obfuscators, count),
           "ou_h_short_s": _per(ou_old.obfuscators, count), "ou_y_n_s": _per(ou_new.obfuscators, count)}
    out["paillier_ratio"] = out["paillier_r_n_s"] / out["paillier_hs_short_s"]
    out["ou_ratio"] = out["ou_y_n_s"] / out["ou_h_short_s"]
    return {k: round(v, 7) for k, v in out.items()}


def training(data: str, bits: int, rounds: int, depth: int, rows: int | None, scheme: str) -> dict:
    frames = load_shared(data)
    if rows:
        for f in frames:
            f.frame = f.frame.iloc[:rows]
    fed = federation_from_frames(frames)
    t0 = time.perf_counter()
    fed.fit(TrainParams(mode="he", key_bits=bits, n_estimators=rounds, max_depth=depth, scheme=scheme))
    total = time.perf_counter() - t0
    tm = fed.active.timings
    per_tree = sum(t.get("total", 0.0) for t in tm) / max(1, len(tm))
    fg = sum(t.get("rerandomize", 0.0) for t in tm) / max(1, len(tm))
    bg = sum(t.get("rerandomize_bg", 0.0) for t in tm) / max(1, len(tm))
    return {"data": data, "scheme": scheme, "bits": bits, "rounds": rounds, "depth": depth,
            "training_s": round(total, 3), "tree_s": round(per_tree, 4),
            "rerandomize_s_per_tree": round(fg, 5), "rerandomize_share_of_tree": round(fg / per_tree, 5),
            "rerandomize_bg_s_per_tree": round(bg, 5), "rerandomize_bg_share_of_tree": round(bg / per_tree, 5),
            "first_tree_rerandomize_s": round(tm[0].get("rerandomize", 0.0), 5) if tm else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=2048)
    ap.add_argument("--count", type=int, default=40, help="obfuscators per method")
    ap.add_argument("--data", default="default_credit")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--rows", type=int, default=None, help="first rows only (a quick check)")
    ap.add_argument("--scheme", default="paillier", choices=schemes.SCHEMES)
    a = ap.parse_args()
    _common.quiet_keys()
    out = {"per_obfuscator": per_obfuscator(a.bits, a.count)}
    if a.rounds:
        out["training"] = training(a.data, a.bits, a.rounds, a.depth, a.rows, a.scheme)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
