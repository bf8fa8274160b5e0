"""A party process gives the memory it frees back to the system (issue 11: bounded drivers).

A party's driver lives for a whole training and allocates in bursts from several threads (gRPC
handlers, the gradient intake, the encryption stream): with glibc's default settings each thread
gets its own malloc arena and freed blocks stay in the process, so its peak RSS counts memory it
no longer uses. :func:`return_freed_memory` sets what Dask's nanny sets for its workers through
``MALLOC_TRIM_THRESHOLD_`` and a little more: two arenas, blocks from 64 KiB up mapped on their
own (given back when freed), the heap's free top trimmed from 64 KiB; Arrow (Parquet reads)
allocates from that malloc too instead of its own pool. The ``vfl party`` and
``vfl predict`` commands call it; a library caller decides for its own process. Settings the user
gives in the environment (``MALLOC_ARENA_MAX``, ``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_MMAP_THRESHOLD_``, ``ARROW_DEFAULT_MEMORY_POOL``) win. Elsewhere than glibc on Linux it does nothing.
"""
from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8       # glibc's mallopt parameters
ENV = {M_ARENA_MAX: "MALLOC_ARENA_MAX", M_TRIM_THRESHOLD: "MALLOC_TRIM_THRESHOLD_",
       M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_"}


def return_freed_memory(threshold: int = 64 * 1024, arenas: int = 2) -> dict[str, int | str]:
    """Apply the settings to this process; returns those applied (``{}`` where malloc is not glibc's)."""
    if not sys.platform.startswith("linux"):
        return {}
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return {}
    applied = {}
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ and "pyarrow" not in sys.modules:
        # Arrow's buffers (a Parquet read) from malloc too, so they are given back the same way
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
        applied["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    for param, value in ((M_ARENA_MAX, arenas), (M_TRIM_THRESHOLD, threshold), (M_MMAP_THRESHOLD, threshold)):
        if ENV[param] in os.environ:
            continue
        if mallopt(ctypes.c_int(param), ctypes.c_int(int(value))) == 1:
            applied[ENV[param]] = int(value)
    return applied
