"""Precomputed randomness: obfuscators made ahead, each handed out once, ciphertexts phe can read."""
from __future__ import annotations

import time

import numpy as np
import pytest
from phe import paillier

from crypto.executor import InlineExecutor, LocalExecutor
from crypto.obfuscators import StockKeeper
from crypto.packing import PackingLayout
from crypto.paillier import Encryptor
from crypto.shards import ShardedEncryption, ShardSet
from tests.support import KEY_BITS


@pytest.fixture(scope="module")
def keys():
    return paillier.generate_paillier_keypair(n_length=KEY_BITS)


@pytest.mark.parametrize("method", ["fast", "standard"])
def test_encrypt_with_obfuscators_decrypts(keys, method):
    pub, priv = keys
    enc = Encryptor(pub, priv, method=method)
    values = [0, 1, -1, 12345678901234567890, -(int(pub.n) // 2 - 1)]
    cts = enc.encrypt_with(values, enc.obfuscators(len(values)))
    assert [priv.raw_decrypt(int(c)) for c in cts] == [v % int(pub.n) for v in values]
    # a public-key-only encryptor makes obfuscators too
    pub_only = Encryptor(pub, None, method=method)
    cts = pub_only.encrypt_with(values, pub_only.obfuscators(len(values)))
    assert [priv.raw_decrypt(int(c)) for c in cts] == [v % int(pub.n) for v in values]


def test_encrypt_with_checks_its_inputs(keys):
    pub, priv = keys
    enc = Encryptor(pub, priv)
    with pytest.raises(ValueError, match="2 plaintexts but 1 obfuscators"):
        enc.encrypt_with([1, 2], enc.obfuscators(1))
    with pytest.raises(OverflowError):
        enc.encrypt_with([int(pub.n)], enc.obfuscators(1))


# --- per-worker stocks (what training uses) -----------------------------------------
def test_worker_stock_fills_to_its_target_and_hands_each_out_once(keys):
    pub, priv = keys
    enc = Encryptor(pub, priv)
    stock = enc.stock
    assert stock.fill(10) == 10 and stock.fill(50, target=30) == 20 and stock.fill(5, target=30) == 0
    first = stock.take(25)
    second = stock.take(25)                  # only 5 left
    assert len(first) == 25 and len(second) == 5
    assert len({int(v) for v in first + second}) == 30
    assert stock.stats() == {"stock": 0, "made": 30, "taken": 30}
    stock.fill(4)
    values = [7, -3, 0, 12345, -(int(pub.n) // 2 - 1), 99]
    cts, from_stock, on_spot = enc.encrypt_stocked(values)
    assert (from_stock, on_spot) == (4, 2) and len(stock) == 0
    assert [priv.raw_decrypt(int(c)) for c in cts] == [v % int(pub.n) for v in values]
    # a new key is a new encryptor with an empty stock of its own
    assert len(Encryptor(pub, priv).stock) == 0


def _wait_for(cond, seconds=60):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def test_keeper_fills_every_worker_only_while_waiting(keys):
    pub, priv = keys
    enc = Encryptor(pub, priv)
    with LocalExecutor(2, name="stock-test") as ex:
        keeper = StockKeeper(ex, enc).start()
        keeper.plan([100, 60])                        # targets 150 and 90
        time.sleep(0.3)
        assert keeper.made == 0                       # not waiting: nothing is made
        with keeper.waiting():
            assert _wait_for(lambda: [s["stock"] for s in keeper.worker_stats()] == [150, 90])
        made = keeper.made
        assert made == 240 and keeper.background_seconds > 0
        # pack_encrypt takes from the stock of the worker it runs on, the rest on the spot
        shards = ShardSet(ex, 400)
        g = np.arange(400 * 1, dtype=np.int64).reshape(400, 1) - 200
        h = np.arange(400, dtype=np.int64).reshape(400, 1)
        layout = PackingLayout.for_bounds(200.0, 400.0, max_rows=400, n_targets=1, precision_bits=0)
        counts = ShardedEncryption(shards, 1, 1, 2 * ((KEY_BITS + 7) // 8), False).fill(
            g, h, None, layout.to_dict(), 1, True, layout.value_bits)
        assert counts == {"from_stock": 240, "on_spot": 160}
        assert [s["taken"] for s in keeper.worker_stats()] == [150, 90]
        time.sleep(0.3)
        assert keeper.made == made                    # still not waiting: nothing more
        keeper.close()
        assert keeper.error is None


def test_a_foreground_request_waits_for_one_small_batch_at_most(keys):
    """The inline executor fills in a thread of this process: a request made while it fills
    waits for at most the batch in flight (a few ms; measured, printed, bounded loosely for a
    busy machine)."""
    pub, priv = keys
    enc = Encryptor(pub, priv)
    ex = InlineExecutor("stock-inline")
    keeper = StockKeeper(ex, enc).start()
    keeper.plan([10 ** 6])
    delays = []
    with keeper.waiting():
        assert _wait_for(lambda: keeper.batches >= 2)
        for _ in range(20):
            t0 = time.perf_counter()
            ex.run_on([(0, ({"op": "ping"}, []))])
            delays.append(time.perf_counter() - t0)
            time.sleep(0.005)
    keeper.close()
    batch = keeper.background_seconds / keeper.batches
    print(f"one batch {batch * 1e3:.2f} ms, request delay median {sorted(delays)[10] * 1e3:.2f} ms, "
          f"max {max(delays) * 1e3:.2f} ms")
    assert keeper.made >= 2 * keeper.batch
    assert sorted(delays)[10] < max(0.05, 3 * batch)
    ex.close()
