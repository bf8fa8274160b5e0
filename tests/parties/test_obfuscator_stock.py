"""Precomputed randomness in training (issue 12): the workers' obfuscator stocks change no model,
hand every obfuscator out once across a whole training, never touch disk or checkpoints, go away
with the key, and take encryption off the critical path (the round timing says how much)."""
import builtins
import gc
import json
import os
import weakref

import pytest
from support import KEY_BITS, small_frames

from crypto.paillier import ObfuscatorStock
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams

PARAMS = dict(n_estimators=3, max_depth=3, key_bits=KEY_BITS)


def _fed(n=240, n_jobs=1, executor=None):
    a, b, c = small_frames(n)
    return Federation(ActiveParty("bank", a, n_jobs=n_jobs, executor=executor),
                      [PassiveParty("telco", b, n_jobs=n_jobs), PassiveParty("shop", c, n_jobs=n_jobs)])


def _structures(model):
    return [[t.structure() for t in rnd] for rnd in model.rounds]


@pytest.fixture
def handed_out(monkeypatch):
    """Every obfuscator any stock of this process hands out, and the stocks themselves (weakly)."""
    values, stocks = [], []
    real = ObfuscatorStock.take

    def take(self, count):
        out = real(self, count)
        if self._enc._crt is not None:      # the key holder's stocks (a passive party's reply stock: its own)
            values.extend(int(v) for v in out)
            stocks.append(weakref.ref(self))
        return out

    monkeypatch.setattr(ObfuscatorStock, "take", take)
    return values, stocks


def test_same_trees_and_every_obfuscator_used_once_across_a_training(handed_out):
    values, stocks = handed_out
    plain = _fed().fit(TrainParams(mode="plain", **PARAMS))
    fed = _fed()
    checkpoints = []
    model = fed.active.fit(fed.transport, list(fed.passives), TrainParams(mode="he", **PARAMS),
                           checkpoint=checkpoints.append)
    assert _structures(model) == _structures(plain)
    keeper = fed.active.channel.stock
    st = keeper.stats()
    # the stock carried real work: most of the rounds' obfuscators came from it
    assert st["from_stock"] > 0 and st["made"] >= st["from_stock"]
    assert len(values) == st["from_stock"]
    assert len(set(values)) == len(values), "an obfuscator was handed out twice"
    # ... nor does one reappear as another's: a fresh training's stock shares none with this one
    first = set(values)
    values.clear()
    fed2 = _fed()
    fed2.fit(TrainParams(mode="he", **PARAMS))
    assert values and not first & set(values)
    # the stock went away with the training (the inline executor's state is gone)
    gc.collect()
    assert stocks and all(ref() is None for ref in stocks)
    # nothing of it in the checkpoints: no obfuscator in any encoding
    text = json.dumps([ck.to_dict() for ck in checkpoints])
    probe = sorted(first)[:50]
    assert checkpoints and not any(format(v, "x") in text or str(v) in text for v in probe)


def test_the_stock_never_touches_disk(monkeypatch, tmp_path, handed_out):
    values, _ = handed_out
    opened = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            opened.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    def spy_os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            opened.append(str(path))
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    monkeypatch.chdir(tmp_path)
    fed = _fed()
    fed.fit(TrainParams(mode="he", **PARAMS))
    assert values, "the stock was not used"
    assert opened == [] and list(tmp_path.iterdir()) == []


def test_round_timing_separates_critical_and_background_encryption():
    fed = _fed(n=300)
    fed.fit(TrainParams(mode="he", n_estimators=4, max_depth=3, key_bits=KEY_BITS))
    timings = fed.active.timings
    keeper = fed.active.channel.stock
    assert all("encrypt" in t for t in timings)
    bg = sum(t.get("obfuscate_bg", 0.0) for t in timings)
    assert bg > 0 and bg + keeper.before_training_seconds == pytest.approx(keeper.background_seconds, rel=1e-6)
    # background seconds are not on the critical path: no tree's total includes them as encryption
    assert all(t["encrypt"] <= t["gradients"] + 1e-9 for t in timings)
    # after the first round the rounds' values come from the stock
    st = keeper.stats()
    assert st["from_stock"] >= st["on_spot"]


def test_a_new_key_starts_an_empty_stock_and_an_old_one_is_dropped():
    fed = _fed(n=120)
    fed.fit(TrainParams(mode="he", n_estimators=1, max_depth=2, key_bits=KEY_BITS))
    old = fed.active.channel
    fed.fit(TrainParams(mode="he", n_estimators=1, max_depth=2, key_bits=KEY_BITS))
    new = fed.active.channel
    assert old is not new and old.executor is None and new.executor is None
    assert int(old.public_key.n) != int(new.public_key.n)
    assert old.stock._thread is None and new.stock._thread is None     # background threads stopped


@pytest.mark.slow
def test_local_worker_processes_keep_their_own_stocks(always_parallel):
    plain = _fed(n_jobs=2).fit(TrainParams(mode="plain", **PARAMS))
    fed = _fed(n_jobs=2)
    model = fed.fit(TrainParams(mode="he", **PARAMS))
    assert _structures(model) == _structures(plain)
    st = fed.active.channel.stock.stats()
    assert st["from_stock"] > 0 and st["made"] >= st["from_stock"]


@pytest.mark.slow
def test_dask_workers_keep_their_own_stocks(always_parallel):
    distributed = pytest.importorskip("distributed")
    from crypto.dask_executor import DaskExecutor
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=40,
                                  scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"}) as c:
        ex = DaskExecutor(c.scheduler_address, name="bank", insecure=True)
        try:
            plain = _fed().fit(TrainParams(mode="plain", **PARAMS))
            fed = _fed(executor=ex)
            model = fed.fit(TrainParams(mode="he", **PARAMS))
            keeper = fed.active.channel.stock
            st = keeper.stats()
            assert _structures(model) == _structures(plain)
            assert st["from_stock"] > 0 and st["made"] >= st["from_stock"]
            # the training's end dropped the key (and with it the stocks) from the caller's workers
            assert all(s == {"stock": 0, "made": 0, "taken": 0, "cpu": s["cpu"]} for s in keeper.worker_stats())
        finally:
            ex.close()


def test_validation_between_trees_counts_as_waiting(monkeypatch):
    """The leaf masks of the validation rows come from the peers between trees: the stock is
    filled meanwhile (the keeper is in its waiting state during every validation round)."""
    from parties.monitor import TrainingMonitor
    seen = []
    real = TrainingMonitor._validate_round

    def validate(self, r, trees):
        seen.append(fed.active.channel.stock._waiting)
        return real(self, r, trees)

    monkeypatch.setattr(TrainingMonitor, "_validate_round", validate)
    a, b, c = small_frames(200)
    fed = Federation(ActiveParty("bank", a[:150], n_jobs=1),
                     [PassiveParty("telco", b[:150], n_jobs=1), PassiveParty("shop", c[:150], n_jobs=1)])
    val = {"bank": a[150:], "telco": b[150:], "shop": c[150:]}
    fed.fit(TrainParams(mode="he", n_estimators=2, max_depth=2, key_bits=KEY_BITS), validation=val)
    assert seen == [1, 1]


def test_fill_requests_grow_to_the_executors_task_time():
    """On an executor whose requests cost scheduling time (Dask: ``task_seconds``), the background
    fill asks for batches of about that much work instead of the cheap-pipe default of 32/64."""
    import time

    from crypto.executor import InlineExecutor
    from crypto.keys import generate_keypair
    from crypto.obfuscators import StockKeeper
    from crypto.paillier import Encryptor

    pub, priv = generate_keypair(KEY_BITS)
    ex = InlineExecutor(name="bank")
    ex.task_seconds = 0.02
    keeper = StockKeeper(ex, Encryptor(pub, priv))
    first = keeper.batch
    keeper.plan([100_000])
    keeper.start()
    try:
        with keeper.waiting():
            deadline = time.monotonic() + 20
            while keeper.batches < 8 and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        keeper.close()
    assert keeper.batches >= 8 and keeper.batch > 2 * first
    assert keeper.background_seconds / keeper.batches > 0.004      # not milliseconds of work each
    plain = StockKeeper(InlineExecutor(name="bank2"), Encryptor(pub, priv))
    plain._resize(0.0)
    assert plain.batch == first                                     # a cheap executor keeps its batch
