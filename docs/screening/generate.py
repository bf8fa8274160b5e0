"""Regenerate docs/screening/default_credit_iv.png (the IV chart of docs/screening.md):

    python docs/screening/generate.py [--mode plain|he] [--key-bits 2048]

default_credit from ../shared/datasets (or VFL_DATASETS): every feature of both parties screened, the
chart drawn by `vfl screen`'s own function. The committed figure was made in mode plain: WOE and IV are
the same in mode he (lossless; tests/parties/test_screening.py), only slower to compute on a laptop.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from datasets import load_named  # noqa: E402
from vfl.api import ScreenParams, federation_from_frames  # noqa: E402
from vfl.commands.screen import iv_chart  # noqa: E402
from vfl.core.files import write_bytes_atomic  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="plain", choices=("plain", "he"))
    ap.add_argument("--key-bits", type=int, default=2048)
    args = ap.parse_args()
    fed = federation_from_frames(load_named("default_credit"))
    for p in fed.passives.values():
        p.screen_allowed = True
    res = fed.screen(ScreenParams(mode=args.mode, key_bits=args.key_bits, monotone=True, min_share=0.05))
    png = iv_chart(res, f"default_credit: IV by feature ({res.n_rows} rows; monotone WOE, bins >= 5% of rows)")
    out = Path(__file__).resolve().parent / "default_credit_iv.png"
    write_bytes_atomic(out, png, mode=0o644)
    for f in sorted(res.features, key=lambda f: -f.iv):
        print(f"{f.party}:{f.feature}\t{f.iv:.4f}\t{len(f.groups) - 1} bins")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
