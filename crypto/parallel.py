"""How much parallelism: the worker count and THE inline-or-workers rule.

Every kernel that can run on an :class:`crypto.executor.Executor` asks
:func:`on_workers` whether a batch is worth shipping; the sizes below which work
stays in the calling process live in one :class:`ParallelPolicy` object,
:data:`POLICY` (measured at 1024-bit keys: below them the frames and the
scheduling cost more than the workers save). Tests replace :data:`POLICY` with
:meth:`ParallelPolicy.always` to run the worker paths on tiny data.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from datasets.errors import InputError

MAX_WORKERS = 256

#: the kernels that ask :func:`on_workers`; each names a minimum field of :class:`ParallelPolicy`
Kernel = Literal["histogram", "compress", "encrypt", "decrypt", "reduce"]


@dataclass(frozen=True)
class ParallelPolicy:
    """Work below which a batch runs inline, per kernel. (A level's histograms run on the workers
    holding the shards, :mod:`crypto.shards`; ``histogram`` decides whether a passive party starts
    worker processes at all; issue 24 removed the per-request histogram units and their ``unit``.)"""

    histogram: int = 60_000    # additions of one histogram over all rows (~75 ms at 1024 bits): own workers
    compress: int = 40_000     # squarings of one compression batch (values * shift bits)
    encrypt: int = 256         # plaintexts of one encryption batch
    decrypt: int = 16          # ciphertexts of one decryption batch
    reduce: int = 8_000        # additions of a reduction of partial sums (~10 ms at 1024 bits; Executor.sum_parts)

    @classmethod
    def always(cls) -> "ParallelPolicy":
        """Every batch on the workers (tests: worker paths on tiny data)."""
        return cls(histogram=0, compress=0, encrypt=0, decrypt=0, reduce=0)

    def on_workers(self, executor, kernel: Kernel, work: int) -> bool:
        """Run ``work`` of ``kernel`` on ``executor``'s workers (else inline)?"""
        return executor is not None and executor.n_workers > 1 and work >= getattr(self, kernel)


#: the policy in force (one object: replace it, do not edit the kernels' thresholds)
POLICY = ParallelPolicy()


def on_workers(executor, kernel: Kernel, work: int) -> bool:
    """THE decision of every kernel: ``True`` to send ``work`` to the executor's workers."""
    return POLICY.on_workers(executor, kernel, work)


def all_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:       # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def check_n_jobs(n_jobs: int | None) -> int | None:
    """``n_jobs`` if it is ``None`` or an integer from 0 (all cores) to :data:`MAX_WORKERS`, else an
    InputError (the environment's ``VFL_N_JOBS`` is parsed by :class:`parties.settings.Settings`)."""
    if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int)
                               or not 0 <= n_jobs <= MAX_WORKERS):
        raise InputError(f"n_jobs must be an integer from 0 (all cores) to {MAX_WORKERS}, got {n_jobs!r}")
    return n_jobs


def resolve_workers(n_jobs: int | None) -> int:
    """``None`` or ``0``: all cores (:func:`all_cores`); else ``n_jobs`` processes (``1``: everything
    runs in the calling process). Reads no environment: a party hands over its settings' count."""
    return check_n_jobs(n_jobs) or all_cores()
