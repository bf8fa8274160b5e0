"""The one atomic, private writer (datasets.files, re-exported by vfl.core.files): a full disk or a
failed rename changes nothing and leaves no temporary file; files are 0600 from the start; a set
of files is replaced all or nothing; unwritable directories are refused up front."""
from __future__ import annotations

import errno
import os
import stat

import pytest

from datasets import files as wf
from datasets.errors import InputError, WriteError
from vfl.core import files as vfl_files


def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


def _leftovers(d):
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".vfl"))


def test_vfl_files_re_exports_the_one_writer():
    assert vfl_files.write_json_atomic is wf.write_json_atomic
    assert vfl_files.write_files_atomic is wf.write_files_atomic


def test_written_files_are_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        p = wf.write_text_atomic(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert _mode(p) == 0o600 and p.read_text() == "{}"
    assert _mode(wf.write_bytes_atomic(tmp_path / "c.pem", b"x", mode=0o644)) == 0o644
    # replacing a world-readable file gives a private one
    (tmp_path / "old.json").write_text("old")
    os.chmod(tmp_path / "old.json", 0o644)
    assert _mode(wf.write_text_atomic(tmp_path / "old.json", "new")) == 0o600


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
def test_a_full_disk_keeps_the_previous_file_whole_and_leaves_no_temp_file(tmp_path, monkeypatch, fail_at):
    target = tmp_path / "model.json"
    wf.write_text_atomic(target, "previous good model " * 1000)
    before = target.read_bytes()
    calls = {"n": 0}

    def boom(*a, **k):
        calls["n"] += 1
        raise OSError(errno.ENOSPC, "No space left on device")

    real_write = os.write

    def write_some(fd, data):          # the first chunk lands, then the disk is full
        if calls["n"]:
            return boom()
        calls["n"] += 1
        return real_write(fd, bytes(data[:100]))

    monkeypatch.setattr(wf.os, {"write": "write", "fsync": "fsync", "replace": "replace"}[fail_at],
                        write_some if fail_at == "write" else boom)
    with pytest.raises(WriteError, match=r"cannot write .*model\.json: no space left on the device") as info:
        wf.write_text_atomic(target, "new model " * 5000)
    assert info.value.errno == errno.ENOSPC and str(info.value.path) == str(target)
    assert isinstance(info.value, InputError)
    monkeypatch.undo()
    assert target.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_a_set_of_files_is_replaced_all_or_nothing(tmp_path, monkeypatch):
    a, b, man = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "manifest.json"
    wf.write_files_atomic({a: b"A1", b: b"B1", man: b"M1"})
    real_open, seen = os.open, []

    def open_third_fails(path, flags, mode=0o777, **kw):
        seen.append(path)
        if len(seen) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(wf.os, "open", open_third_fails)
    with pytest.raises(WriteError, match=r"manifest\.json"):
        wf.write_files_atomic({a: b"A2", b: b"B2", man: b"M2"})
    monkeypatch.undo()
    assert (a.read_bytes(), b.read_bytes(), man.read_bytes()) == (b"A1", b"B1", b"M1")
    assert _leftovers(tmp_path) == []
    wf.write_files_atomic([(a, b"A3"), (b, b"B3"), (man, b"M3")])
    assert (a.read_bytes(), b.read_bytes(), man.read_bytes()) == (b"A3", b"B3", b"M3")


def test_the_temp_file_is_fresh_and_links_are_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    link = tmp_path / "model.json"
    link.symlink_to(elsewhere)
    wf.write_text_atomic(link, "model")
    assert not link.is_symlink() and link.read_text() == "model" and elsewhere.read_text() == "untouched"


def test_unwritable_directories_are_refused_up_front(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(WriteError, match=r"model directory .*file is not a directory"):
        wf.check_writable_dir(blocker, "model directory")
    with pytest.raises(WriteError, match=r"cannot create model directory .*file/sub"):
        wf.check_writable_dir(blocker / "sub", "model directory")
    # a read-only file system (root ignores chmod, so the refusal of the OS is simulated)
    real_open = os.open

    def read_only(path, flags, mode=0o777, **kw):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(wf.os, "open", read_only)
    with pytest.raises(WriteError, match=r"model directory .*ro is not writable: the file system is read-only"):
        wf.check_writable_dir(tmp_path / "ro", "model directory")
    monkeypatch.undo()
    assert wf.check_writable_dir(tmp_path / "ok") == tmp_path / "ok" and _leftovers(tmp_path / "ok") == []


def test_a_chmod_read_only_directory_is_refused(tmp_path, monkeypatch):
    """A directory without write permission is refused naming the reason. Root ignores the mode
    bits (CI runs as root), so there the kernel's answer to an unprivileged writer (EACCES on
    creating a file in the directory) is simulated: the test runs either way."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    real_open = os.open
    refused = []

    def as_unprivileged(path, flags, mode=0o777, **kw):
        if flags & os.O_CREAT and os.path.dirname(os.fspath(path)) == os.fspath(d):
            refused.append(path)
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_open(path, flags, mode, **kw)

    if os.access(d, os.W_OK):                      # root: the mode bits do not stop it
        monkeypatch.setattr(wf.os, "open", as_unprivileged)
    try:
        with pytest.raises(WriteError, match=r"model directory .*ro is not writable: permission denied") as err:
            wf.check_writable_dir(d, "model directory")
        assert err.value.errno == errno.EACCES
        assert _leftovers(d) == [] and os.listdir(d) == []
        assert refused or os.geteuid() != 0       # as root the refusal came from the simulation
    finally:
        d.chmod(0o700)
