"""One writer at a time for a passive party's ledgers (issue 31, finding 8).

The DP ledger (:mod:`parties.dp_ledger`) and the reveal budget (:mod:`parties.reveal_budget`) are
read, checked and rewritten for every charge; two trainings (two server processes serving the same
dataset, or a training and a prediction in one process) charging at once must not both read the
old total and each write their own. :func:`locked` holds an exclusive ``fcntl.flock`` on a lock
file beside the ledger (``FILE.lock``, mode 0600, never removed: removing it would let two
processes lock different inodes) for the whole read-modify-write; the ledger itself is still
replaced atomically, so a reader without the lock sees the old or the new file, never half of one.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from datasets.errors import InputError

# flock is per open file description: each call opens its own descriptor, so threads of one process
# are serialised by it as well as processes


@contextlib.contextmanager
def locked(path, what: str):
    """Hold the exclusive lock of ledger ``path`` (``what`` names it in errors)."""
    lock = Path(str(path) + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise InputError(f"{what}: cannot open its lock file {str(lock)!r}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)        # releases the lock
