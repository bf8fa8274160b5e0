"""User-given public bins (``--dp-bins``): reading and checking the file, and the edges and
columns it gives a party (no privacy budget is spent on them).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from datasets.errors import InputError


# the symmetric log scale of DP bounds and public lo/hi edges: sign(x) log1p(|x|)
def _symlog(x):
    return np.sign(x) * np.log1p(np.abs(x))


def _symexp(z):
    return np.sign(z) * np.expm1(np.abs(z))


# --------------------------------------------------------------------------- user-given public bins
def read_dp_bins(path) -> dict:
    """A ``--dp-bins`` file: JSON ``{column: {"lo": x, "hi": y} | {"edges": [...]}}`` of public
    bounds or bin edges, checked (:func:`check_dp_bins`); errors name the file (line, column of a
    JSON syntax error) and the column."""
    where = f"--dp-bins file {str(path)!r}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: cannot be read ({exc})") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply") from None
    return check_dp_bins(spec, where)


def _finite_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def check_dp_bins(spec, where: str = "dp_bins") -> dict:
    """Public bins per column, checked and normalised: ``{column: {"lo": float, "hi": float}}``
    (public bounds, ``lo < hi``: the edges are then placed as the DP ones, equally spaced on the
    symmetric log scale) or ``{column: {"edges": [floats]}}`` (strictly increasing, finite; a value
    ``x <= edges[i]`` falls in bin ``i`` or lower). Mode dp also reads an optional ``"missing": false``
    (the public schema says the column is never missing: its release has no missing slot), alone or
    beside the bounds or edges; a released model ignores it."""
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise InputError(f"{where}: expected an object {{column: {{\"lo\": x, \"hi\": y}} or {{\"edges\": [...]}}}}, "
                         f"got {type(spec).__name__}")
    out = {}
    for col, entry in spec.items():
        at = f"{where}, column {col!r}"
        if not isinstance(col, str) or not col:
            raise InputError(f"{where}: column names must be non-empty strings, got {col!r}")
        keys = set(entry) - {"missing"} if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or keys not in ({"lo", "hi"}, {"edges"}, set()) or not entry:
            raise InputError(f"{at}: expected {{\"lo\": x, \"hi\": y}} or {{\"edges\": [...]}} (and optionally "
                             f"\"missing\": false), got {entry!r}")
        if "missing" in entry and not isinstance(entry["missing"], bool):
            raise InputError(f"{at}: \"missing\" must be true or false, got {entry['missing']!r}")
        flag = {"missing": entry["missing"]} if "missing" in entry else {}
        if not keys:
            out[col] = flag
            continue
        if "edges" in entry:
            edges = entry["edges"]
            if not isinstance(edges, (list, tuple)) or not edges:
                raise InputError(f"{at}: \"edges\" must be a non-empty list of numbers, got {edges!r}")
            bad = [e for e in edges if not _finite_number(e)]
            if bad:
                raise InputError(f"{at}: \"edges\" must be finite numbers, got {bad[0]!r}")
            e = np.asarray(edges, dtype=np.float64)
            if np.any(np.diff(e) <= 0):
                i = int(np.flatnonzero(np.diff(e) <= 0)[0])
                raise InputError(f"{at}: \"edges\" must be strictly increasing ({edges[i]!r} then {edges[i + 1]!r})")
            out[col] = {"edges": [float(x) for x in e], **flag}
            continue
        lo, hi = entry["lo"], entry["hi"]
        if not (_finite_number(lo) and _finite_number(hi)):
            raise InputError(f"{at}: \"lo\" and \"hi\" must be finite numbers, got {lo!r} and {hi!r}")
        if not lo < hi:
            raise InputError(f"{at}: \"lo\" must be below \"hi\", got {lo!r} and {hi!r}")
        out[col] = {"lo": float(lo), "hi": float(hi), **flag}
    return out


def public_thresholds(entry: dict, max_bin: int, where: str = "dp_bins") -> np.ndarray:
    """The bin edges of one column's public bins (:func:`check_dp_bins`): the given edges (at most
    ``max_bin - 1``), or ``max_bin - 1`` edges equally spaced on the symmetric log scale between the
    public bounds (as :func:`dp_thresholds` between DP ones). No data, no budget."""
    if "edges" in entry:
        e = np.asarray(entry["edges"], dtype=np.float64)
        if e.size > max_bin - 1:
            raise InputError(f"{where}: {e.size} edges make {e.size + 1} bins, more than max_bin = {max_bin}")
        return e
    lo, hi = _symlog(np.float64(entry["lo"])), _symlog(np.float64(entry["hi"]))
    return np.unique(_symexp(np.linspace(lo, hi, max_bin + 1)[1:-1]))


def public_columns(spec: dict, feature_names: list, party: str, hint: str = "") -> dict:
    """``{feature index: entry}`` of a party's public bins; a column the party does not hold is an error."""
    unknown = [c for c in spec if c not in feature_names]
    if unknown:
        raise InputError(f"dp_bins: column {unknown[0]!r} is not a feature column of party {party!r}{hint}")
    return {feature_names.index(c): e for c, e in spec.items()}
