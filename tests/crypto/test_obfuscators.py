"""Precomputed randomness: obfuscators made ahead, each handed out once, ciphertexts phe can read."""
from __future__ import annotations

import time

import pytest
from phe import paillier

from crypto.executor import LocalExecutor
from crypto.obfuscators import BATCH_PER_WORKER, ObfuscatorStore
from crypto.paillier import Encryptor
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


def test_store_hands_each_obfuscator_out_once(keys):
    pub, priv = keys
    store = ObfuscatorStore(Encryptor(pub, priv))
    store.fill(50)
    first = store.take(30)
    second = store.take(40)                 # 20 from stock, 20 made on the spot
    assert len(first) == 30 and len(second) == 40
    assert len({int(v) for v in first + second}) == 70      # no value handed out twice
    assert store.stats() == {"produced": 70, "taken": 70, "on_demand": 20, "stock": 0, "background_seconds": 0.0}
    assert len(store) == 0


def test_background_filler_on_workers(keys):
    pub, priv = keys
    enc = Encryptor(pub, priv)
    with LocalExecutor(2, name="obf-test") as ex:
        store = ObfuscatorStore(enc, ex).start()
        store.plan(per_round=3 * BATCH_PER_WORKER)
        deadline = time.monotonic() + 60
        while len(store) < 6 * BATCH_PER_WORKER and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(store) >= 6 * BATCH_PER_WORKER, "the filler did not reach its target"
        seen = set()
        for _ in range(3):
            batch = store.take(2 * BATCH_PER_WORKER)
            ints = {int(v) for v in batch}
            assert len(ints) == len(batch) and not ints & seen
            seen |= ints
            values = list(range(len(batch)))
            cts = enc.encrypt_with(values, batch)
            assert [priv.raw_decrypt(int(c)) for c in cts[:5]] == values[:5]
        store.close()
        st = store.stats()
        assert st["taken"] == 6 * BATCH_PER_WORKER and st["stock"] == 0
        assert st["produced"] >= st["taken"] and st["on_demand"] == 0
        assert store.error is None
