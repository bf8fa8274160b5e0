"""vfl serve's batching and watching in process (issue 35's latency work): a batch just sent is
awaited before the next one starts (the next gathers the requests meanwhile), unless it takes
longer than ``overlap_after``; the model directory is read only when its listing changes; the
score route's query parameters; the heap settled by the serving processes."""
from __future__ import annotations

import asyncio
import gc
import os
import threading
import time

import numpy as np
import pytest

from parties.online_active import BatchResult, MicroBatcher, ServiceStopping, directory_signature
from vfl.core.errors import InputError


class _Scorer:
    """Scores instantly, except the calls told to wait for a release."""

    def __init__(self, hold_first: int = 0):
        self.calls, self.hold_first = [], hold_first
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self._lock = threading.Lock()

    def score(self, v, ids, X, deadline, keep_decisions=False):
        with self._lock:
            k = len(self.calls)
            self.calls.append(list(ids))
        self.started.release()
        if k < self.hold_first:
            assert self.release.wait(30)
        return BatchResult(np.zeros((len(ids), 1)), {}, {})


def _submit(b, i):
    return b.submit("v", [i], np.zeros((1, 0)), time.monotonic() + 60)


def test_the_next_batch_gathers_while_one_is_in_flight():
    scorer = _Scorer(hold_first=1)
    b = MicroBatcher(scorer, max_rows=64, max_wait=0.0, workers=4, overlap_after=60.0)
    try:
        first = _submit(b, 0)
        assert scorer.started.acquire(timeout=30)
        later = [_submit(b, i) for i in range(1, 6)]
        time.sleep(0.05)                    # free workers, yet nothing else is sent while the batch is answered
        assert scorer.calls == [[0]]
        scorer.release.set()
        for f in [first, *later]:
            f.result(timeout=30)
    finally:
        b.close()
    assert scorer.calls == [[0], [1, 2, 3, 4, 5]]


def test_a_slow_batch_is_overlapped_after_overlap_after_and_never_beyond_the_workers():
    scorer = _Scorer(hold_first=2)
    b = MicroBatcher(scorer, max_rows=64, max_wait=0.0, workers=2, overlap_after=0.02)
    try:
        futs = [_submit(b, 0)]
        assert scorer.started.acquire(timeout=30)
        futs.append(_submit(b, 1))          # the first is slow: a second batch starts beside it
        assert scorer.started.acquire(timeout=30)
        futs.append(_submit(b, 2))          # both workers held: it waits for one
        time.sleep(0.1)
        assert scorer.calls == [[0], [1]]
        scorer.release.set()
        for f in futs:
            f.result(timeout=30)
    finally:
        b.close()
    assert scorer.calls == [[0], [1], [2]]


def test_a_batch_closes_at_max_rows_and_never_mixes_model_versions():
    scorer = _Scorer(hold_first=1)
    b = MicroBatcher(scorer, max_rows=3, max_wait=0.0, workers=4, overlap_after=60.0)

    def submit(version, ids):
        return b.submit(version, ids, np.zeros((len(ids), 0)), time.monotonic() + 60)

    try:
        futs = [submit("v1", [0])]
        assert scorer.started.acquire(timeout=30)
        futs += [submit("v1", [1, 2]), submit("v1", [3]),     # full at three rows: leaves beside the first
                 submit("v1", [4, 5]), submit("v2", [6]),     # another version: each its own batch
                 submit("v1", [7])]
        assert scorer.started.acquire(timeout=30)
        scorer.release.set()
        for f in futs:
            f.result(timeout=30)
    finally:
        b.close()
    assert scorer.calls == [[0], [1, 2, 3], [4, 5], [6], [7]]


def test_a_batch_leaves_early_once_the_rows_of_the_batch_answered_last_are_back():
    """Clients that wait for their answer before sending again: once as many rows as the last batch
    answered have arrived, the batch leaves without waiting out ``max_wait``; with fewer it waits."""
    scorer = _Scorer()
    b = MicroBatcher(scorer, max_rows=64, max_wait=0.2, workers=4, overlap_after=60.0)
    try:
        b.submit("v", [0, 1], np.zeros((2, 0)), time.monotonic() + 60)
        b.submit("v", [2], np.zeros((1, 0)), time.monotonic() + 60).result(timeout=30)   # by its wait: 3 rows
        b.max_wait = 600.0                  # from here on only the early leave can send a batch in this test
        two = [_submit(b, 3), _submit(b, 4)]
        time.sleep(0.3)
        assert scorer.calls == [[0, 1, 2]] and not any(f.done() for f in two)    # two of three: it waits
        third = _submit(b, 5)
        for f in [*two, third]:
            f.result(timeout=30)            # the third row back: it left (max_wait was ten minutes)
        assert scorer.calls == [[0, 1, 2], [3, 4, 5]]
        one = _submit(b, 6)
        time.sleep(0.3)
        assert not one.done()               # the batch answered last had three rows: one waits
        b.submit("v", [7, 8], np.zeros((2, 0)), time.monotonic() + 60).result(timeout=30)
        one.result(timeout=30)
    finally:
        b.close()
    assert scorer.calls == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_the_batcher_sleeps_until_what_it_waits_for_happens():
    """No polling: while a batch is answered and the next waits for it, the gathering thread wakes
    for arrivals and answers only (it looked every millisecond before: hundreds of wake-ups here)."""
    scorer = _Scorer(hold_first=1)
    b = MicroBatcher(scorer, max_rows=64, max_wait=0.0, workers=4, overlap_after=60.0)
    try:
        first = _submit(b, 0)
        assert scorer.started.acquire(timeout=30)
        waits = []
        real = b._cv.wait

        def counted(timeout=None):
            waits.append(timeout)
            return real(timeout)

        b._cv.wait = counted
        later = _submit(b, 1)
        until = time.monotonic() + 30
        while not waits and time.monotonic() < until:
            time.sleep(0.005)
        assert waits                            # it took the arrival and waits for the batch in flight
        time.sleep(0.3)
        assert scorer.calls == [[0]]
        assert len(waits) <= 3, waits           # and sleeps meanwhile (at most a spurious wake-up or two)
        scorer.release.set()
        first.result(timeout=30)
        later.result(timeout=30)                # it left when the first was answered, not after overlap_after
    finally:
        b.close()
    assert scorer.calls == [[0], [1]]


def test_a_request_arriving_as_the_service_stops_gets_an_answer():
    b = MicroBatcher(_Scorer(), max_rows=64, max_wait=0.0, workers=1)
    b.close()
    with pytest.raises(ServiceStopping, match="stopping"):
        _submit(b, 0).result(timeout=30)


def test_the_directory_signature_changes_with_its_json_files_only(tmp_path):
    (tmp_path / "model.json").write_text("{}")
    one = directory_signature(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    assert directory_signature(tmp_path) == one
    (tmp_path / "model.json").write_text("{ }")          # rewritten: another size (and time)
    two = directory_signature(tmp_path)
    assert two != one
    os.replace(tmp_path / "model.json", tmp_path / "m2.json")
    assert directory_signature(tmp_path) != two
    assert directory_signature(tmp_path / "missing") is None


class _NoPeers:
    peers: dict = {}

    def close(self):
        pass


def test_the_watcher_reads_the_model_directory_only_when_it_changed(tmp_path, monkeypatch):
    pytest.importorskip("fastapi")
    import vfl.serving as serving

    reads = []

    def find(model_dir):
        reads.append(time.monotonic())
        raise InputError("no model here (test)")
    monkeypatch.setattr(serving, "find_active_model_file", find)
    (tmp_path / "model.json").write_text("{}")
    service = serving.ScoringService(tmp_path, _NoPeers(), watch_interval=0.01)
    try:
        service.start_watching()
        time.sleep(0.3)
        assert reads == []                  # about 30 looks, no read: the listing did not change
        (tmp_path / "model.json").write_text("{\"changed\": 1}")
        deadline = time.monotonic() + 30
        while not reads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(reads) >= 1
        n = len(reads)
        service.request_reload()            # SIGHUP: read even though nothing changed
        while len(reads) == n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(reads) == n + 1
    finally:
        service.close()


def test_a_new_model_not_taken_is_tried_again_without_another_change(tmp_path, monkeypatch):
    """A reload refused (a passive party without the new model yet) is tried at every interval
    until it is taken, as before the listing was watched."""
    pytest.importorskip("fastapi")
    import vfl.serving as serving

    (tmp_path / "model.json").write_text("{}")
    monkeypatch.setattr(serving, "find_active_model_file", lambda d: tmp_path / "model.json")
    monkeypatch.setattr(serving, "model_signature", lambda p: ("new",))
    service = serving.ScoringService(tmp_path, _NoPeers(), watch_interval=0.01)
    tries = []
    service.reload = lambda: tries.append(1) or len(tries) >= 3       # taken at the third try
    try:
        # written before the watcher thread first looks (as when the thread starts late under load, or
        # while the first model loads): still a change, since the listing was taken at construction
        (tmp_path / "model.json").write_text("{\"new\": 1}")
        service.start_watching()
        deadline = time.monotonic() + 30
        while len(tries) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(tries) == 3
        service._signature = ("new",)          # what a reload taken records
        time.sleep(0.2)
        assert len(tries) == 3
    finally:
        service.close()


def test_the_score_routes_query_parameters(tmp_path):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")

    import vfl.serving as serving
    service = serving.ScoringService(tmp_path, _NoPeers())
    body = {"id": 1, "features": {}}

    async def ask():
        transport = httpx.ASGITransport(app=serving.create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
            out = [await client.post(f"/v1/score{q}", json=body) for q in (
                "?explain=maybe", "?deadline_ms=soon", "?deadline_ms=-5", "", "?explain=false",
                "?explain=0&deadline_ms=100", "?explain=TRUE")]
            return out, await client.get("/v1/score")
    try:
        (bad_flag, bad_number, negative, *fine), get = asyncio.run(ask())
    finally:
        service.close()
    assert bad_flag.status_code == 422 and "explain must be true or false, got 'maybe'" in bad_flag.json()["error"]
    assert bad_number.status_code == 422 and "deadline_ms must be a number, got 'soon'" in bad_number.json()["error"]
    assert negative.status_code == 422 and "deadline_ms must be more than 0" in negative.json()["error"]
    assert [(r.status_code, r.json()["error"]) for r in fine] == [(503, "no model is loaded yet")] * 4
    assert get.status_code == 405


def test_the_score_route_served_first_answers_a_bug_with_a_json_500_and_leaves_the_other_routes(
        tmp_path, monkeypatch, caplog):
    """POST /v1/score bypasses FastAPI's middleware (vfl.serving._ScoreFirst): an error in its
    handler is still a logged JSON 500, and every other route is still FastAPI's."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from support import logs_of

    import vfl.serving as serving
    service = serving.ScoringService(tmp_path, _NoPeers())

    def broken(value, name):
        raise RuntimeError("a bug in the handler (test)")
    monkeypatch.setattr(serving, "_flag", broken)

    async def ask():
        transport = httpx.ASGITransport(app=serving.create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
            return (await client.post("/v1/score", json={"id": 1, "features": {}}), await client.get("/healthz"),
                    await client.put("/v1/score", json={}), await client.post("/v1/scores", json={}),
                    await client.get("/readyz"))
    try:
        with logs_of(caplog, "vfl.serve", "ERROR"):
            bug, health, put, other, ready = asyncio.run(ask())
    finally:
        service.close()
    assert bug.status_code == 500 and "internal error while scoring" in bug.json()["error"]
    assert "a bug in the handler (test)" in caplog.text
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert put.status_code == 405 and other.status_code == 404
    assert ready.status_code == 503 and ready.json()["ready"] is False


def test_a_batch_result_is_awaited_from_another_thread_with_its_timeout():
    pytest.importorskip("fastapi")
    import threading
    from concurrent.futures import Future

    import vfl.serving as serving

    async def main():
        ok, bad, late = Future(), Future(), Future()
        threading.Timer(0.05, ok.set_result, ("scored",)).start()
        threading.Timer(0.05, bad.set_exception, (ValueError("from the batch"),)).start()
        out = [await serving._result(ok, 30)]
        with pytest.raises(ValueError, match="from the batch"):
            await serving._result(bad, 30)
        t0 = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await serving._result(late, 0.05)
        out.append(time.monotonic() - t0)
        late.set_result("after its deadline")          # nobody waits any more: no error
        await asyncio.sleep(0.05)
        return out
    got, waited = asyncio.run(main())
    assert got == "scored" and 0.04 <= waited < 10


def test_settle_heap_freezes_what_is_alive():
    from parties.serve_metrics import settle_heap
    before = gc.get_freeze_count()
    try:
        settle_heap()
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
