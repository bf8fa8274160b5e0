"""Human-readable byte counts (next to the transports' byte counters) and the one check of a
duration option (seconds), for every floor above."""
from __future__ import annotations

import math

from datasets.errors import InputError

#: the longest duration any option (a call's timeout, a wait) may ask for: one day. A larger value
#: (inf, 1e12) would make a stuck peer hang the caller for good.
MAX_SECONDS = 86400.0


def check_seconds(value, what: str, maximum: float = MAX_SECONDS) -> float:
    """``value`` as seconds: a finite number, more than 0 and at most ``maximum``; else an
    :class:`InputError` naming the option ``what`` (e.g. ``"--timeout"``)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a number of seconds, got {value!r}") from None
    if math.isnan(v) or not 0 < v <= maximum:
        raise InputError(f"{what} must be more than 0 and at most {maximum:g} seconds, got {value!r}")
    return v


def format_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 MiB``, ``1.0 GiB``: powers of 1024 named as such (IEC units,
    the one convention of every output: ``--max-message-mb`` counts MiB too); GiB is the largest."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
