"""The round pipeline of the learner core: Booster + TreeGrower over sources, typed round records,
observers in order, one timing record, and integers handed on (never floats)."""
import numpy as np
import pytest

from vfl.core.boosting import Booster
from vfl.core.objectives import get_objective
from vfl.core.params import TrainParams
from vfl.core.rounds import CallbackObserver, RoundGradients, RoundObserver, RoundRecord, RoundTiming
from vfl.core.sources import LocalSource


def _problem(n=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    y = (X[:, 0] - X[:, 2] + 0.3 * rng.normal(size=n) > 0).astype(float)
    return X, y


class Recorder(RoundObserver):
    def __init__(self, log, name, stop_at=None):
        self.log, self.name, self.stop_at = log, name, stop_at

    def round_started(self, gradients):
        self.log.append((self.name, "started", gradients))

    def round_finished(self, record):
        self.log.append((self.name, "finished", record))
        return self.stop_at is not None and record.round_idx >= self.stop_at


class SpySource(LocalSource):
    """A local source that logs when it receives a round."""

    def __init__(self, log, *args):
        super().__init__(*args)
        self.log = log

    def start_round(self, gradients):
        self.log.append((self.party, "start_round", gradients))
        super().start_round(gradients)


def _booster(log, observers, n_estimators=3, **kw):
    X, y = _problem()
    params = TrainParams(mode="plain", n_estimators=n_estimators, max_depth=3, **kw)
    sources = [SpySource(log, "a", X[:, :2], ["a0", "a1"], params.max_bin),
               SpySource(log, "b", X[:, 2:], ["b0", "b1"], params.max_bin)]
    return Booster(sources, get_objective("binary"), params, observers), y


def test_observers_hear_each_round_before_the_sources_and_in_order():
    log = []
    booster, y = _booster(log, [Recorder(log, "first"), Recorder(log, "second")])
    booster.fit(y)
    events = [(who, what) for who, what, _ in log]
    per_round = [("first", "started"), ("second", "started"), ("a", "start_round"), ("b", "start_round"),
                 ("first", "finished"), ("second", "finished")]
    assert events == per_round * 3
    # every party of a round receives the very object the observers saw
    for r in range(3):
        chunk = log[r * 6:(r + 1) * 6]
        assert all(item is chunk[0][2] for _, what, item in chunk[:4])


def test_the_round_hands_on_fixed_point_integers_bounds_and_precision():
    log = []
    booster, y = _booster(log, [Recorder(log, "obs")], n_estimators=1)
    booster.fit(y)
    g = log[0][2]
    assert isinstance(g, RoundGradients)
    assert g.g.dtype == np.int64 and g.h.dtype == np.int64 and g.g.shape == (len(y), 1)
    assert (g.g_bound, g.h_bound) == (1.0, 0.25)                     # binary: constant bounds
    scale = 2.0 ** g.precision_bits
    assert np.all(np.abs(g.g) <= g.g_bound * scale) and np.all((g.h >= 0) & (g.h <= g.h_bound * scale))
    gf, hf = g.as_float()
    assert np.array_equal(gf, g.g / scale) and np.array_equal(hf, g.h / scale)
    assert g.in_any_sample is None                                   # no sampling: every row


def test_round_records_are_typed_and_one_timing_record_per_round():
    log = []
    booster, y = _booster(log, [Recorder(log, "obs")])
    base, rounds, raw = booster.fit(y)
    records = [item for _, what, item in log if what == "finished"]
    assert [r.round_idx for r in records] == [0, 1, 2]
    assert all(isinstance(r, RoundRecord) and r.trees is rounds[r.round_idx] for r in records)
    assert records[-1].raw is raw
    assert [r.timing for r in records] == booster.timings
    for t in booster.timings:
        d = t.as_dict()
        assert {"gradients", "histograms", "split_search", "apply_splits", "total"} <= set(d)
        assert d["total"] >= d["gradients"] and "bytes_sent" not in d     # nothing sent in memory


def test_an_observer_stops_training_and_the_round_is_kept():
    log = []
    booster, y = _booster(log, [Recorder(log, "stopper", stop_at=1), Recorder(log, "after")], n_estimators=5)
    _, rounds, _ = booster.fit(y)
    assert len(rounds) == 2
    # the observers after the one that stopped still saw the last round
    assert [(who, item.round_idx) for who, what, item in log if what == "finished"][-1] == ("after", 1)


def test_callback_observer_gives_the_info_dict():
    seen = []
    booster, y = _booster([], [CallbackObserver(lambda r, info: seen.append((r, info)))], n_estimators=2)
    booster.fit(y)
    assert [r for r, _ in seen] == [0, 1]
    r, info = seen[-1]
    assert set(info) == {"raw", "trees", "timing", "history"} and isinstance(info["timing"], dict)


def test_observers_change_nothing_in_the_model():
    plain, y = _booster([], [], n_estimators=3)
    _, ref, ref_raw = plain.fit(y)
    log = []
    observed, _ = _booster(log, [Recorder(log, "a"), CallbackObserver(lambda r, info: None)], n_estimators=3)
    _, rounds, raw = observed.fit(y)
    assert [[t.to_dict() for t in rnd] for rnd in rounds] == [[t.to_dict() for t in rnd] for rnd in ref]
    assert np.array_equal(raw, ref_raw)


def test_round_timing_adds_up_from_several_threads():
    from concurrent.futures import ThreadPoolExecutor
    t = RoundTiming()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: t.add("histogram", 0.001), range(4000)))
    assert t.get("histogram") == pytest.approx(4.0)
