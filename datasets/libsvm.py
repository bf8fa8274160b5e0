"""Parsing LIBSVM files (``label index:value ...``) into labels and a dense feature matrix,
every malformed line named by file and line number.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from datasets.errors import InputError

from .csv_tables import PathLike

_LABELS = {"0": 0, "+1": 1, "1": 1, "-1": 0}


def _parse_label(token: str, path: Path, lineno: int) -> int:
    label = _LABELS.get(token)
    if label is not None:
        return label
    try:
        value = float(token)
    except ValueError:
        value = None
    if value in (0.0, -1.0):
        return 0
    if value == 1.0:
        return 1
    raise InputError(f"LIBSVM file {str(path)!r}, line {lineno}: label {token!r} is not one of 0, +1, -1")


def parse_libsvm(path: PathLike, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """Parse a LIBSVM file into ``(labels int64 0/1, dense float32 matrix n x n_features)``.

    Feature ``k`` (1-based) goes to column ``k - 1``; absent entries are 0
    (LIBSVM's sparse convention, not missing values). Labels 0/-1 -> 0, +1 -> 1.
    Trailing blank lines are ignored; any other malformed line raises
    :class:`InputError` naming the file and line.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="ascii")
    except FileNotFoundError:
        raise InputError(f"LIBSVM file {str(p)!r} does not exist") from None
    except UnicodeDecodeError:
        raise InputError(f"LIBSVM file {str(p)!r} is not ASCII text") from None
    except OSError as exc:
        raise InputError(f"cannot read LIBSVM file {str(p)!r}: {exc.strerror or exc}") from None
    lines = text.rstrip().split("\n") if text.strip() else []
    if not lines:
        raise InputError(f"LIBSVM file {str(p)!r} is empty")
    labels = np.empty(len(lines), dtype=np.int64)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for i, line in enumerate(lines):
        parts = line.split()
        if not parts:
            raise InputError(f"LIBSVM file {str(p)!r}, line {i + 1}: blank line")
        labels[i] = _parse_label(parts[0], p, i + 1)
        seen: set[int] = set()
        for tok in parts[1:]:
            idx_s, sep, val_s = tok.partition(":")
            try:
                idx = int(idx_s)
                val = float(val_s)
            except ValueError:
                idx = val = None
            if not sep or idx is None:
                raise InputError(f"LIBSVM file {str(p)!r}, line {i + 1}: bad token {tok!r} (expected index:value)")
            if not 1 <= idx <= n_features:
                raise InputError(
                    f"LIBSVM file {str(p)!r}, line {i + 1}: feature index {idx} outside 1..{n_features}"
                )
            if idx in seen:         # (indices need not be increasing: a repeat anywhere is refused)
                raise InputError(f"LIBSVM file {str(p)!r}, line {i + 1}: feature index {idx} repeated")
            seen.add(idx)
            if not np.isfinite(val):
                raise InputError(f"LIBSVM file {str(p)!r}, line {i + 1}: feature {idx} has value {val_s!r}")
            rows.append(i)
            cols.append(idx - 1)
            vals.append(val)
    dense = np.zeros((len(lines), n_features), dtype=np.float32)
    dense[np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)] = np.asarray(vals, dtype=np.float32)
    return labels, dense
