"""The many-core model (issue 24): a real round on 16 and on 64 simulated workers per party.

Both parties run on :class:`crypto.sim_executor.SimulatedExecutor`: every request runs the real
worker operation (mode ``plain``: cheap) and then sleeps for its counted work (values encrypted,
homomorphic additions, values moved), so the round's wall time is the schedule's. The round is
the real one: the active party's gradient channel and encryption stream, the in-memory transport,
the passive party's intake and root partials, the levels' shard tasks and their reduction.

The work of a round is ordered (the passive party sums what the active party encrypted), and each
party has its own workers: a schedule that keeps every worker of a party busy whenever that party
has work finishes the round in about ``active work / W + passive work / W``; the model asks for
at most 1.3 times that. Whatever runs one task at a time where many could run shows up as the
difference (issue 24 measured none of the 16 cores of a server used beyond 2).

The simulated costs are large next to the real CPU of the plain operations, and a task lasts its
counted time from its start (the real operation inside it), so load stretches only the drivers'
own CPU between the stages, a fixed amount: three busy processes on a 2-core machine made the
12-second round 1.09x its ideal; the CI run of the full suite made the 6-second round this test used
to run 1.33x (2 s over). The assertion is on a ratio of seconds the test itself measures: no
machine-speed constant."""
import numpy as np
import pandas as pd
import pytest

from crypto import parallel, shards
from crypto.sim_executor import SimCosts, SimulatedExecutor
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams

#: a ciphertext of 2048 bits costs ~120 us to make and ~3.7 us to add (issue 24's 16-core machine):
#: about 30 additions per encryption; scaled so that a round is a few seconds on 16 workers
COSTS = SimCosts(encrypt=1.6e-3, add=5e-5, move=2e-6, decrypt=1.6e-3)


def _frames(n: int, n_features: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2 + n_features))
    y = (X[:, 0] + X[:, 2] - X[:, 3] + 0.3 * rng.normal(size=n) > 0).astype(int)
    ids = np.arange(n)
    a = pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, **{f"b{j}": X[:, 2 + j] for j in range(n_features)}})
    return a, b


def model_round(monkeypatch, n_workers: int, n_rows: int, n_features: int, depth: int = 3, scale: float = 1.0):
    """One round of a federation whose two parties run on ``n_workers`` simulated workers each:
    ``(round wall seconds, active work, passive work, the executors, the round's timing record)``."""
    # plain values are ~10 bytes, a 1024-bit ciphertext 256: a real round's 1 MB messages hold
    # ~4k rows; without the byte floor the model's messages hold as few rows as the real ones do
    monkeypatch.setattr(shards, "MIN_STREAM_SHARD_BYTES", 1)
    # the inline thresholds are measured for real rounds' sizes; the model's round is smaller
    monkeypatch.setattr(parallel, "POLICY", parallel.ParallelPolicy(reduce=0))
    a, b = _frames(n_rows, n_features)
    costs = SimCosts(**{k: v * scale for k, v in vars(COSTS).items()})
    ex_a = SimulatedExecutor(n_workers, costs, name="bank")
    ex_p = SimulatedExecutor(n_workers, costs, name="telco")
    try:
        fed = Federation(ActiveParty("bank", a, executor=ex_a), [PassiveParty("telco", b, executor=ex_p)])
        w_a0, w_p0 = ex_a.work_seconds(), ex_p.work_seconds()
        fed.fit(TrainParams(mode="plain", n_estimators=1, max_depth=depth, learning_rate=0.5))
        (timing,) = fed.active.timings
        return timing["total"], ex_a.work_seconds() - w_a0, ex_p.work_seconds() - w_p0, (ex_a, ex_p), timing
    finally:
        ex_a.close()
        ex_p.close()


# multi-second (the model's tasks sleep for their counted work): slow, as the marker defines it
@pytest.mark.slow
@pytest.mark.parametrize("n_workers,n_rows,scale", [(16, 16384, 2.0), (64, 32768, 12.0)], ids=["16", "64"])
def test_a_round_on_many_simulated_workers_per_party_keeps_them_busy(monkeypatch, n_workers, n_rows, scale):
    """Fails before issue 24 (2.7x on 16 workers: the stream encrypted a wave at a time, the intake
    wrote and summed one shard at a time, the driver summed every shard's partial)."""
    W = n_workers
    wall, work_a, work_p, (ex_a, ex_p), timing = model_round(monkeypatch, W, n_rows, n_features=4, scale=scale)
    ideal = work_a / W + work_p / W
    assert ex_a.units["encrypt"] == n_rows                # every row encrypted once
    assert ex_p.units["add"] > 3 * n_rows                 # every level summed on the workers
    assert ideal > 1.5                                    # the sleeps dwarf the real CPU
    assert ex_a.driver_seconds == ex_p.driver_seconds == 0    # no sum in a driver
    assert wall <= 1.3 * ideal, (
        f"a round took {wall:.2f} s on {W} workers per party; its work ({work_a:.1f} s active, "
        f"{work_p:.1f} s passive) needs {ideal:.2f} s: {wall / ideal:.2f}x; stages "
        f"{ {k: round(v, 2) for k, v in timing.items() if isinstance(v, float)} }")
