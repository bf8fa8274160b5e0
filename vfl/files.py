"""Writing files: the one atomic, private writer every file of the toolkit goes through.

A file is written to a fresh temporary file in the same directory (created with
``O_EXCL`` and mode 0600, never following a link), flushed to disk, renamed over
the target and the directory entry flushed too: a crash or a full disk leaves
either the old file or the new one, never half of one, and no other local user
can read thresholds, salts or models.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

FILE_MODE = 0o600


def write_bytes_atomic(path, data: bytes, mode: int = FILE_MODE) -> Path:
    """Write ``data`` to ``path`` atomically with permissions ``mode``; returns the path."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


@contextlib.contextmanager
def atomic_text_writer(path, mode: int = FILE_MODE):
    """A text file written piece by piece (``with atomic_text_writer(p) as fh: fh.write(...)``),
    with the guarantees of :func:`write_bytes_atomic`: the target appears, complete, only when the
    block ends without an error; on an error the temporary file is removed and the target is
    untouched. Text is UTF-8, written as given (no newline translation)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def write_text_atomic(path, text: str, mode: int = FILE_MODE) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"), mode)


def write_json_atomic(path, data, indent: int | None = 1, mode: int = FILE_MODE, **dump_kwargs) -> Path:
    """Write JSON atomically (see :func:`write_bytes_atomic`)."""
    return write_text_atomic(path, json.dumps(data, indent=indent, **dump_kwargs), mode)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:       # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:       # pragma: no cover
        pass
    finally:
        os.close(fd)
