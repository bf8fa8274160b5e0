"""Writing files: the one atomic, private writer every file of the toolkit goes through.

A file is written to a fresh temporary file in the same directory (created with
``O_EXCL`` and mode 0600, never following a link), flushed to disk, renamed over
the target and the directory entry flushed too: a crash or a full disk leaves
either the old file or the new one, never half of one, and no other local user
can read thresholds, salts, keys or models.

:func:`write_files_atomic` writes a *set* of files in two phases: every file is
first written and flushed under a temporary name (a full disk fails here and
changes nothing), then all are renamed into place, the last one (a manifest)
last. A failure leaves no temporary file and raises
:class:`datasets.errors.WriteError` naming the file.

It sits on the bottom floor (it imports nothing of the toolkit but the error
vocabulary) so that every floor writes through it: ``protocols.certs`` (keys),
the learner core (``vfl.core.files`` re-exports it), the parties and the CLI.
"""
from __future__ import annotations

import contextlib
import errno as _errno
import json
import os
import secrets
from pathlib import Path

from datasets.errors import WriteError

FILE_MODE = 0o600
#: outputs meant to be shared that hold no secret and no row of anyone's data: reports (the
#: ``--output-json`` summaries, ``vfl compare``'s CSV/JSON) and figures. Keys, models, checkpoints,
#: ledgers and predictions keep :data:`FILE_MODE`.
REPORT_MODE = 0o644
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _describe(exc: OSError) -> str:
    if exc.errno == _errno.ENOSPC:
        return "no space left on the device"
    if exc.errno in (_errno.EROFS,):
        return "the file system is read-only"
    if exc.errno in (_errno.EACCES, _errno.EPERM):
        return "permission denied"
    return exc.strerror or str(exc)


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def _write_error(path: Path, exc: OSError) -> WriteError:
    return WriteError(f"cannot write {path}: {_describe(exc)}", path, exc.errno)


def _open_temp(path: Path, mode: int) -> tuple[Path, int]:
    """A new temporary file beside ``path`` (O_EXCL, no link followed, exactly ``mode`` whatever
    the umask): its name and an open descriptor."""
    tmp = _temp_name(path)
    try:
        fd = os.open(tmp, _FLAGS, mode)
    except OSError as exc:
        raise _write_error(path, exc) from None
    try:
        os.fchmod(fd, mode)
    except OSError as exc:
        os.close(fd)
        _unlink_quietly(tmp)
        raise _write_error(path, exc) from None
    return tmp, fd


def _stage(path: Path, data: bytes, mode: int) -> Path:
    """Write ``data`` to a new temporary file beside ``path`` (see :func:`_open_temp`) and flush
    it to disk; its name. Nothing is left behind on failure."""
    tmp, fd = _open_temp(path, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        _unlink_quietly(tmp)
        if isinstance(exc, OSError):
            raise _write_error(path, exc) from None
        raise
    return tmp


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_files_atomic(files, mode: int = FILE_MODE) -> list[Path]:
    """Write several files (``{path: bytes}`` or pairs, in order) so that either all are replaced
    or (on a failure while writing) none is: all are staged first, then renamed in the given
    order, so the last one (a manifest naming the others) appears last. Returns the paths."""
    items = [(Path(p), bytes(d)) for p, d in (files.items() if isinstance(files, dict) else files)]
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in items:
            staged.append((_stage(path, data, mode), path))
        for i, (tmp, path) in enumerate(staged):
            try:
                os.replace(tmp, path)
            except OSError as exc:
                for t, _ in staged[i:]:
                    _unlink_quietly(t)
                staged = []
                raise _write_error(path, exc) from None
        staged = []
    finally:
        for tmp, _ in staged:
            _unlink_quietly(tmp)
    for d in sorted({p.parent for p, _ in items}):
        _fsync_dir(d)
    return [p for p, _ in items]


def write_bytes_atomic(path, data: bytes, mode: int = FILE_MODE) -> Path:
    """Write ``data`` to ``path`` atomically with permissions ``mode``; returns the path."""
    return write_files_atomic([(path, data)], mode)[0]


def write_text_atomic(path, text: str, mode: int = FILE_MODE) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"), mode)


@contextlib.contextmanager
def atomic_text_writer(path, mode: int = FILE_MODE):
    """A text file written piece by piece (``with atomic_text_writer(p) as fh: fh.write(...)``),
    with the guarantees of :func:`write_bytes_atomic`: the target appears, complete, only when the
    block ends without an error; on an error the temporary file is removed and the target is
    untouched. Text is UTF-8, written as given (no newline translation)."""
    path = Path(path)
    tmp, fd = _open_temp(path, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _unlink_quietly(tmp)
        if isinstance(exc, OSError):
            raise _write_error(path, exc) from None
        raise
    _fsync_dir(path.parent)


def json_bytes(data, indent: int | None = 1, **dump_kwargs) -> bytes:
    return json.dumps(data, indent=indent, **dump_kwargs).encode("utf-8")


def write_json_atomic(path, data, indent: int | None = 1, mode: int = FILE_MODE, **dump_kwargs) -> Path:
    """Write JSON atomically (see :func:`write_bytes_atomic`)."""
    return write_bytes_atomic(path, json_bytes(data, indent, **dump_kwargs), mode)


def check_writable_dir(directory, what: str = "directory") -> Path:
    """Refuse up front a directory the toolkit could not write its files to (read-only file
    system, no permission, a path under a file): creates it if missing, then writes and removes a
    probe file through the same path the real files take."""
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise WriteError(f"{what} {d} is not a directory", d)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(f"cannot create {what} {d}: {_describe(exc)}", d, exc.errno) from None
    probe = d / ".vfl-write-probe"
    try:
        tmp = _stage(probe, b"", FILE_MODE)
    except WriteError as exc:
        raise WriteError(f"{what} {d} is not writable: {str(exc).split(': ', 1)[-1]}", d, exc.errno) from None
    _unlink_quietly(tmp)
    return d


def fsync_dir(directory) -> None:
    """Flush a directory's entries (after a rename or an unlink) to disk."""
    _fsync_dir(Path(directory))


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
