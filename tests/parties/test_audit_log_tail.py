"""The daily quota at start-up reads the audit log from its end back to the lines of earlier days
only (a year-old log is not read whole), with the same counts as reading it all."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from support import logs_of

from parties.passive_online import AuditLog


def _forward(path, day):
    """The oracle: every line read, in order."""
    counts = {}
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e["outcome"] == "ok" and e["time"].startswith(day):
            counts[e["caller"]] = counts.get(e["caller"], 0) + e["rows"]
    return counts


def _entry(day, caller, rows, outcome="ok", ms=0):
    return {"time": f"{day}T12:00:00.{ms % 1000:03d}+00:00", "caller": caller, "rows": rows, "outcome": outcome,
            "ids": ["ab" * 16] * rows}


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.text(alphabet=st.characters(blacklist_characters="\n\r", codec="utf-8"), max_size=40),
                      max_size=40),
       block=st.integers(1, 64), final_newline=st.booleans())
def test_the_lines_from_the_end_are_the_files_lines_reversed_with_their_offsets(tmp_path_factory, lines, block,
                                                                             final_newline):
    path = tmp_path_factory.mktemp("audit") / "audit.jsonl"
    data = "\n".join(lines).encode() + (b"\n" if final_newline and lines else b"")
    path.write_bytes(data)
    log = AuditLog(path)
    log.BLOCK = block
    try:
        got = list(log._lines_from_end())
    finally:
        log.close()
    want, at = [], 0
    for raw in data.split(b"\n"):
        if raw.strip():
            want.append((at, raw))
        at += len(raw) + 1
    assert got == want[::-1]
    assert all(data[o:o + len(b)] == b for o, b in got)


def test_the_count_of_today_equals_reading_the_whole_log_and_stops_at_earlier_days(tmp_path):
    path = tmp_path / "audit.jsonl"
    with open(path, "w") as fh:
        for k in range(5000):                                   # a long history
            fh.write(json.dumps(_entry("2026-11-30", "bank", 3, ms=k)) + "\n")
        for k in range(50):
            fh.write(json.dumps(_entry("2026-12-01", ["bank", "insurer"][k % 2], 1 + k % 4, ms=k)) + "\n")
        for k in range(30):                                     # today, with refusals and stragglers of yesterday
            fh.write(json.dumps(_entry("2026-12-02", ["bank", "insurer"][k % 2], 2,
                                       "ok" if k % 5 else "refused", ms=k)) + "\n")
            if k % 7 == 0:
                fh.write(json.dumps(_entry("2026-12-01", "bank", 9, ms=k)) + "\n")
    log = AuditLog(path)
    log.BLOCK = 4096
    seen = []
    inner = log._lines_from_end

    def counting():
        for item in inner():
            seen.append(item)
            yield item
    log._lines_from_end = counting
    try:
        for day in ("2026-12-02", "2026-12-01"):
            seen.clear()
            assert log.rows_today(day) == _forward(path, day)
        assert log.rows_today("2026-12-03") == {}
        seen.clear()
        log.rows_today("2026-12-02")
    finally:
        log.close()
    assert _forward(path, "2026-12-02") == {"bank": 24, "insurer": 24}
    assert len(seen) <= 30 + 5 + AuditLog.EARLIER_LINES      # not the 5,000 lines of history
    assert len(seen) >= AuditLog.EARLIER_LINES


def test_a_line_that_is_not_json_is_skipped_with_its_byte_offset(tmp_path, caplog):
    path = tmp_path / "audit.jsonl"
    good = json.dumps(_entry("2026-12-02", "bank", 4)) + "\n"
    path.write_text(good + "{torn\n" + good)
    log = AuditLog(path)
    try:
        with logs_of(caplog, "vfl.passive"):
            assert log.rows_today("2026-12-02") == {"bank": 8}
    finally:
        log.close()
    assert f"the line at byte {len(good)} is not JSON" in caplog.text


def test_a_missing_or_empty_log_counts_nothing(tmp_path):
    log = AuditLog(tmp_path / "new" / "audit.jsonl")
    try:
        assert log.rows_today("2026-12-02") == {}
    finally:
        log.close()
