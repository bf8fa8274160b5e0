"""Shared helpers of the benchmark scripts (run from the repository root or anywhere)."""
from __future__ import annotations

import os
import resource
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from crypto.executor import LocalExecutor  # noqa: E402
from crypto.keys import WeakKeyWarning  # noqa: E402


def quiet_keys() -> None:
    """1024-bit keys warn by design; benchmarks use them on purpose."""
    warnings.filterwarnings("ignore", category=WeakKeyWarning)


def peak_memory() -> dict:
    """Peak resident memory in MB: this process, the largest finished child, and the sum of
    this process and every worker peak of the closed local executors
    (:meth:`crypto.executor.LocalExecutor.closed_peaks`; an upper bound of the simultaneous total)."""
    self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    workers_mb = sum((w["peak_kb"] or 0) for w in LocalExecutor.closed_peaks()) / 1024
    return {"self_mb": round(self_mb, 1), "largest_child_mb": round(child_mb, 1),
            "workers_mb": round(workers_mb, 1), "total_mb_upper_bound": round(self_mb + workers_mb, 1)}


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
