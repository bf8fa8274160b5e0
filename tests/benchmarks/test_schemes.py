"""benchmarks/schemes.py at a tiny size: one JSON object with the issue's keys, every scheme's
histogram checked against the plaintext sums (the script exits otherwise)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import schemes as bench  # noqa: E402

KEYS = {"encrypt_us_per_value", "hist_us_per_addition", "decrypt_us_per_value"}


def test_tiny_run_has_the_issues_keys(capsys):
    out = bench.main(["--bits", "1024", "--rows", "60", "--features", "3", "--bins", "5", "--phe-sample", "3",
                      "--only", "paillier", "ou", "phe", "heu_ou", "--e2e-trees", "0"])
    assert set(out) == {"schemes", "end_to_end", "equal_work"} and out["end_to_end"] == {}
    eq = out["equal_work"]                        # our OU at HEU's 80-bit exponent (1024-bit keys)
    assert eq["ou_exponent_bits"] == 80 and eq["ou_encrypt_us_per_value"] > 0
    assert ("heu_ou_encrypt_us_per_value" in eq) == (bench.hnp is not None)
    names = {"paillier", "ou", "phe"} | ({"heu_ou"} if bench.hnp is not None else set())
    assert set(out["schemes"]) == names
    assert all(set(rec) == KEYS and all(v > 0 for v in rec.values()) for rec in out["schemes"].values())
    if bench.hnp is None:
        assert "HEU is not installed" in capsys.readouterr().err
