"""Human-readable byte counts (next to the transports' byte counters), for every floor above."""
from __future__ import annotations


def format_bytes(n: float) -> str:
    """``512 B``, ``1.5 KB``, ``3.2 MB``, ``1.0 GB`` (powers of 1024; GB is the largest unit)."""
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
