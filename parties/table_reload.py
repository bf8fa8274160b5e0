"""A running passive party sees its table's current rows: the table file is watched and read
again when it changes (or on SIGHUP), then swapped in at once (:meth:`PassiveServer.reload_table`).

Prediction sessions and scoring requests already under way finish on the rows they started with;
new ones see the new table. A file is reloaded once it has stopped changing (the same size and
modification time at two polls in a row), so a file being written is not read half-way; replacing
it atomically (write another file, then rename it over the table) is the safe way to update it. A
table that cannot be read or does not fit the models is refused with a logged error and the table
in use stays.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

from datasets.errors import VFLError

log = logging.getLogger("vfl.passive")


def table_signature(path) -> tuple | None:
    """What changes when the table changes: ``(mtime_ns, size)`` of the file, or of every file of a
    directory (a Parquet dataset); None if it cannot be read now."""
    p = Path(path)
    try:
        if p.is_dir():
            return tuple(sorted((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in p.iterdir()))
        st = p.stat()
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return None


class TableWatcher:
    """Reload ``server``'s table from ``path`` with ``load()`` when the file changes (polled every
    ``interval`` s; 0: only on :meth:`request`, e.g. SIGHUP); ``after(version)`` runs after each
    reload (e.g. rebuilding the online id index)."""

    def __init__(self, server, path, load, interval: float = 1.0, after=None, metrics=None):
        self.server, self.path, self.load = server, Path(path), load
        self.interval, self.after, self.metrics = float(interval), after, metrics
        self._signature = table_signature(self.path)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._forced = False
        self._thread: threading.Thread | None = None
        self.reloads = 0
        self.failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"vfl-table-{self.server.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def request(self) -> None:
        """Reload now (whatever the file's signature): SIGHUP."""
        self._forced = True
        self._wake.set()

    def _run(self) -> None:
        pending = None
        while not self._stop.is_set():
            self._wake.wait(self.interval if self.interval > 0 else None)
            self._wake.clear()
            if self._stop.is_set():
                return
            sig = table_signature(self.path)
            if self._forced:
                self._forced, pending = False, None
                self.reload(sig)
                continue
            if sig is None or sig == self._signature:
                pending = None
                continue
            if sig != pending:          # changed since the last poll: wait until it holds still
                pending = sig
                continue
            pending = None
            self.reload(sig)

    def reload(self, signature=None) -> bool:
        """Read the table and swap it in; False (logged, the table in use kept) if it cannot be."""
        try:
            frame = self.load()
            version = self.server.reload_table(frame, str(self.path))
        except (VFLError, OSError, ValueError) as exc:
            self.failures += 1
            self._signature = signature if signature is not None else self._signature
            log.error("%s: the table %s could not be reloaded; the table in use is kept: %s", self.server.name,
                      self.path, exc)
            if self.metrics is not None:
                self.metrics.reloads.labels("failed").inc()
            return False
        self._signature = signature if signature is not None else table_signature(self.path)
        self.reloads += 1
        if self.metrics is not None:
            self.metrics.reloads.labels("ok").inc()
        if self.after is not None:
            self.after(version)
        return True
