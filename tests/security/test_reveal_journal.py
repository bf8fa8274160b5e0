"""The prediction charges' journal of the reveal budget (issue 35: online scoring charges every
request): a charge appends one line of increments beside the budget file instead of rewriting the
file, the totals count the file's own (older) predictions and every process's lines, a torn last
line is sealed and skipped, and a journal made anew is read anew."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from support import logs_of

from parties.passive_limits import Limits
from parties.reveal_budget import JOURNAL_SUFFIX, RevealBudget, _journal_for
from vfl.core.errors import InputError, ProtocolError


def _budget(tmp_path, cap=10):
    return RevealBudget(tmp_path / "ledgers" / "rb.json", Limits(lifetime_prediction_decisions_per_row=cap),
                        "telco")


def _charge(b, digests, counts, client="bank", model="m", n_rows=5):
    b.charge_predictions("fp", n_rows, client, model, digests, np.array(counts), "ScoreRequest")


def _journal(b):
    return [json.loads(x) for x in b.journal_path.read_text().splitlines()]


def test_a_prediction_charge_appends_a_line_and_leaves_the_budget_file_alone(tmp_path):
    b = _budget(tmp_path)
    b.charge_training("fp", 5, "m", "bank")
    before = b.path.stat()
    _charge(b, ["a", "b"], [3, 0])
    _charge(b, ["a", "c", "a"], [2, 4, 1])
    after = b.path.stat()
    assert (before.st_ino, before.st_mtime_ns, before.st_size) == (after.st_ino, after.st_mtime_ns, after.st_size)
    assert str(b.journal_path) == str(b.path) + JOURNAL_SUFFIX
    assert b.journal_path.stat().st_mode & 0o777 == 0o600
    head, *lines = _journal(b)
    assert head["format"] == "vfl-reveal-journal" and len(head["id"]) == 24
    assert [x["add"] for x in lines] == [{"a": 3}, {"a": 3, "c": 4}]
    assert b.read()["datasets"]["fp"]["predictions"] == {"bank": {"m": {"a": 6, "c": 4}}}
    assert b.read()["datasets"]["fp"]["trainings"][0]["client"] == "bank"


def test_the_cap_counts_every_line_per_client_and_model_and_a_refusal_writes_nothing(tmp_path):
    b = _budget(tmp_path, cap=10)
    _charge(b, ["a"], [6])
    _charge(b, ["a"], [6], client="shop")          # another client: its own count
    _charge(b, ["a"], [6], model="m2")             # another model: its own count
    size = b.journal_path.stat().st_size
    with pytest.raises(ProtocolError, match="rule 'lifetime prediction decisions': a row would have 12 split "
                                            "decisions of model 'm' revealed to 'bank', at most 10"):
        _charge(b, ["x", "a"], [1, 6])
    assert b.journal_path.stat().st_size == size
    _charge(b, ["a"], [4])                         # exactly the cap
    with pytest.raises(ProtocolError, match="11 split decisions"):
        _charge(RevealBudget(b.path, b.limits, "telco"), ["a"], [1])       # a new object: the same totals


def test_the_files_own_predictions_count_beside_the_journal(tmp_path):
    """A budget file of an earlier version holds its prediction counts in the file itself."""
    b = _budget(tmp_path, cap=10)
    b.path.parent.mkdir(parents=True)
    b.path.write_text(json.dumps({"format": "vfl-reveal-budget", "version": 1, "datasets": {"fp": {
        "n_rows": 5, "trainings": [], "split_answers": "AAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        "predictions": {"bank": {"m": {"a": 8}}}}}}))
    with pytest.raises(ProtocolError, match="11 split decisions"):
        _charge(b, ["a"], [3])
    _charge(b, ["a"], [2])
    assert b.read()["datasets"]["fp"]["predictions"]["bank"]["m"]["a"] == 10
    with pytest.raises(InputError, match="dataset fp has 5 rows there, 7 here"):
        _charge(b, ["b"], [1], n_rows=7)


def test_another_processes_lines_are_read_before_a_charge(tmp_path):
    """Two processes share a budget: each reads what the other appended (simulated by a second
    view of the journal, as another process has)."""
    b = _budget(tmp_path, cap=10)
    _charge(b, ["a"], [5])
    line = json.dumps({"fp": "fp", "n_rows": 5, "client": "bank", "model": "m", "add": {"a": 5}}) + "\n"
    with open(b.journal_path, "a") as fh:           # what another process appended under the lock
        fh.write(line)
    with pytest.raises(ProtocolError, match="11 split decisions"):
        _charge(b, ["a"], [1])


def test_a_torn_last_line_is_sealed_and_skipped(tmp_path, caplog):
    with logs_of(caplog, "vfl.passive"):
        _torn_line(tmp_path)
    assert "torn line" in caplog.text


def _torn_line(tmp_path):
    b = _budget(tmp_path, cap=10)
    _charge(b, ["a"], [5])
    with open(b.journal_path, "ab") as fh:          # a process died in the middle of its write
        fh.write(b'{"fp":"fp","n_rows":5,"client":"bank","model":"m","add":{"a":')
    _journal_for(b.journal_path).offset = 0         # as a process starting now reads it
    _journal_for(b.journal_path).head = None
    _charge(b, ["a"], [5])                          # the torn charge was never answered: not counted
    text = b.journal_path.read_text()
    assert text.count("\n") == 4 and text.endswith("\n")
    assert b.read()["datasets"]["fp"]["predictions"]["bank"]["m"]["a"] == 10


def test_a_journal_made_anew_is_read_anew(tmp_path):
    """Deleting the journal resets the prediction counts (as deleting the file did), even where the
    new journal gets the old one's inode and is as long."""
    b = _budget(tmp_path, cap=10)
    _charge(b, ["a"], [9])
    os.unlink(b.journal_path)
    _charge(b, ["a"], [9])
    assert b.read()["datasets"]["fp"]["predictions"]["bank"]["m"]["a"] == 9
    old = b.journal_path.read_bytes()
    b.journal_path.write_bytes(old.replace(old[:old.index(b"\n")], json.dumps(
        {"format": "vfl-reveal-journal", "version": 1, "id": "0" * 24}, separators=(",", ":")).encode()))
    assert len(b.journal_path.read_bytes()) == len(old)
    _charge(b, ["a"], [1])                          # the new journal's 9 + 1: no stale offset
    assert b.read()["datasets"]["fp"]["predictions"]["bank"]["m"]["a"] == 10


def test_a_long_journal_is_folded_into_the_budget_file(tmp_path, monkeypatch):
    """The journal grows with every request; past COMPACT_BYTES (and twice the file) its counts move
    into the file's predictions and an empty journal, with another name, replaces it. The totals,
    the cap and another process's view are unchanged."""
    import parties.reveal_budget as rb
    monkeypatch.setattr(rb, "COMPACT_BYTES", 600)
    b = _budget(tmp_path, cap=100)
    b.charge_training("fp", 5, "m", "bank")
    _charge(b, ["a"], [0])                                        # no decision: nothing written
    assert not b.journal_path.exists()
    _charge(b, ["b"], [1])
    first = _journal(b)[0]["id"]
    for i in range(12):
        _charge(b, ["a", "b"], [3, 1])
        _charge(b, ["a"], [2], client="shop")
    want = {"bank": {"m": {"a": 36, "b": 13}}, "shop": {"m": {"a": 24}}}
    assert b.read()["datasets"]["fp"]["predictions"] == want
    assert _journal(b)[0]["id"] != first                         # replaced at least once
    assert b.journal_path.stat().st_size < 600 + 200
    in_file = json.loads(b.path.read_text())["datasets"]["fp"]
    assert in_file["predictions"]["bank"]["m"]["a"] >= 3 and len(in_file["trainings"]) == 1
    rb._JOURNALS.clear()                                          # a process starting now
    assert b.read()["datasets"]["fp"]["predictions"] == want
    _charge(b, ["a"], [64])                                       # 36 + 64 = the cap
    with pytest.raises(ProtocolError, match="101 split decisions"):
        _charge(b, ["a"], [1])
    assert b.journal_path.stat().st_mode & 0o777 == 0o600
