"""parties.ledger_lock: one writer at a time, across threads, processes, a lock file made anew and
a fork, with the descriptor each process keeps open."""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from parties.ledger_lock import locked

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(path: Path, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def test_threads_of_one_process_take_turns(tmp_path):
    ledger, inside, most = tmp_path / "ledger.json", [0], [0]
    guard = threading.Lock()

    def work():
        for _ in range(50):
            with locked(ledger, "test ledger"):
                with guard:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.0005)
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert (tmp_path / "ledger.json.lock").stat().st_mode & 0o777 == 0o600


def _holder(ledger: Path, held: Path, release: Path) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(ROOT)!r})
        from parties.ledger_lock import locked
        with locked({str(ledger)!r}, "test ledger"):
            Path({str(held)!r}).write_text("held")
            time.sleep(0.5)
            Path({str(release)!r}).write_text("released")
    """)
    return subprocess.Popen([sys.executable, "-c", code])


def test_another_process_holding_the_lock_keeps_this_one_out(tmp_path):
    ledger, held, released = tmp_path / "ledger.json", tmp_path / "held", tmp_path / "released"
    with locked(ledger, "test ledger"):       # this process's descriptor is open from now on
        pass
    p = _holder(ledger, held, released)
    try:
        _wait_for(held)
        with locked(ledger, "test ledger"):
            assert released.exists()          # taken only after the other process let go
    finally:
        p.wait(timeout=30)


def test_a_lock_file_made_anew_is_locked_not_the_old_descriptor(tmp_path):
    """The folder removed and made again (a new lock file, a new inode) while this process still
    holds a descriptor of the old one: locking the old inode would not keep the other process out."""
    ledger, held, released = tmp_path / "d" / "ledger.json", tmp_path / "held", tmp_path / "released"
    with locked(ledger, "test ledger"):
        pass
    (tmp_path / "d" / "ledger.json.lock").unlink()
    (tmp_path / "d").rmdir()
    p = _holder(ledger, held, released)      # makes the folder and a new lock file
    try:
        _wait_for(held)
        with locked(ledger, "test ledger"):
            assert released.exists()
    finally:
        p.wait(timeout=30)


def _child(ledger, queue):
    got = threading.Event()

    def take():
        with locked(ledger, "test ledger"):
            got.set()
    t = threading.Thread(target=take, daemon=True)
    t.start()
    queue.put(got.wait(0.5))            # the parent holds the lock: not taken yet
    queue.put(got.wait(30))             # the parent let go: taken


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
@pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning")
def test_a_forked_child_neither_shares_the_parents_lock_nor_waits_forever(tmp_path):
    ledger = tmp_path / "ledger.json"
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    with locked(ledger, "test ledger"):
        child = ctx.Process(target=_child, args=(str(ledger), queue))
        child.start()
        first = queue.get(timeout=30)
    second = queue.get(timeout=30)
    child.join(timeout=30)
    assert first is False               # a shared descriptor (one open file description) would let it in
    assert second is True               # a copied, held thread lock would keep it out forever
    assert child.exitcode == 0


def test_an_unopenable_lock_file_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    from datasets.errors import InputError
    with pytest.raises(InputError, match="test ledger: cannot open its lock file"):
        with locked(blocker / "ledger.json", "test ledger"):
            pass
    assert os.path.isfile(blocker)
