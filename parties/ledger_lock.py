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
import threading
from pathlib import Path

from datasets.errors import InputError

# flock is per open file description. Each process keeps one descriptor per lock file (opening,
# creating its folder and closing it for every charge cost more than the charge itself under online
# scoring), and a thread lock serialises this process's threads on it; the flock then serialises the
# processes. A lock file replaced or removed under a held descriptor (a folder deleted and made anew)
# is noticed after the flock is taken (the descriptor's inode is no longer the path's) and opened anew.
# A forked child starts with none: the parent's descriptors share their open file descriptions (and so
# their flocks) with it, and unlocking one would unlock the parent's; they are left alone, never used.
_FDS: dict[str, tuple[threading.Lock, list]] = {}
_FDS_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    global _FDS, _FDS_LOCK
    _FDS, _FDS_LOCK = {}, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _open(lock: Path, what: str) -> int:
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        return os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise InputError(f"{what}: cannot open its lock file {str(lock)!r}: {exc.strerror or exc}") from None


def _same_file(fd: int, lock: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(lock, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextlib.contextmanager
def locked(path, what: str):
    """Hold the exclusive lock of ledger ``path`` (``what`` names it in errors): against this
    process's other threads and against other processes."""
    lock = Path(os.path.abspath(str(path) + ".lock"))
    with _FDS_LOCK:
        entry = _FDS.get(str(lock))
        if entry is None:
            entry = _FDS[str(lock)] = (threading.Lock(), [None])
    mutex, slot = entry
    with mutex:
        while True:
            if slot[0] is None:
                slot[0] = _open(lock, what)
            fcntl.flock(slot[0], fcntl.LOCK_EX)
            if _same_file(slot[0], lock):
                break
            os.close(slot[0])            # the file at the path is another one now (or none): lock that one
            slot[0] = None
        try:
            yield
        finally:
            fcntl.flock(slot[0], fcntl.LOCK_UN)
