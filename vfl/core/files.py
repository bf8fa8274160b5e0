"""Writing files: the one atomic, private writer every file of the toolkit goes through.

It lives on the bottom floor, :mod:`datasets.files` (so that ``protocols.certs`` writes keys
through it too); this module re-exports it for the learner core, the parties and the CLI.
"""
from __future__ import annotations

from datasets.files import (
    FILE_MODE,
    REPORT_MODE,
    atomic_text_writer,
    check_writable_dir,
    fsync_dir,
    json_bytes,
    write_bytes_atomic,
    write_files_atomic,
    write_json_atomic,
    write_text_atomic,
)

__all__ = ["FILE_MODE", "REPORT_MODE", "atomic_text_writer", "check_writable_dir", "fsync_dir", "json_bytes",
           "write_bytes_atomic", "write_files_atomic", "write_json_atomic", "write_text_atomic"]
