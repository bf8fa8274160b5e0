"""The worker's ``ext`` operation runs only the modules the party using the executor allowed
(Executor.allow, issue 26): the crypto floor names no module above it."""
import sys
import types
from pathlib import Path

import pytest

from crypto import worker
from crypto.executor import InlineExecutor, LocalExecutor, WorkerError

FAKE = "vfl_test_fake_worker_ops"


@pytest.fixture
def fake_ops(monkeypatch):
    module = types.ModuleType(FAKE)
    module.WORKER_OPS = {"echo": lambda req, blobs, st: ({"echo": req["value"]}, [])}
    monkeypatch.setitem(sys.modules, FAKE, module)
    return module


def _ext(module, **kw):
    return dict(op="ext", module=module, fn="echo", **kw), []


def test_an_extension_runs_only_once_the_party_allowed_it(fake_ops):
    ex = InlineExecutor("t")
    with pytest.raises(WorkerError, match=rf"worker extension '{FAKE}' is not allowed by the party using this "
                                          r"executor \(allowed: \[\]\)"):
        ex.map([_ext(FAKE, value=1)])
    ex = InlineExecutor("t")
    ex.allow(FAKE)
    assert ex.map([_ext(FAKE, value=7)])[0][0]["echo"] == 7
    assert ex.extensions == (FAKE,)
    with pytest.raises(WorkerError, match="'os' is not allowed"):
        ex.map([_ext("os", value=1)])


def test_allowing_again_sends_nothing_new_and_a_second_module_adds_to_the_first(fake_ops):
    ex = InlineExecutor("t")
    ex.allow(FAKE)
    held = ex.extensions
    ex.allow(FAKE)
    assert ex.extensions is held and ex.holds(worker.EXTENSIONS_SLOT, held)
    ex.allow("parties.shard_ops")
    assert ex.extensions == tuple(sorted((FAKE, "parties.shard_ops")))
    assert ex._state[worker.EXTENSIONS_SLOT] == ex.extensions


def test_worker_processes_refuse_a_module_no_one_allowed():
    with LocalExecutor(1, "t") as ex:
        with pytest.raises(WorkerError, match="'parties.shard_ops' is not allowed"):
            ex.map([(dict(op="ext", module="parties.shard_ops", fn="fingerprint", slot="none"), [])])
    with LocalExecutor(1, "t") as ex:
        ex.allow("parties.shard_ops")
        with pytest.raises(WorkerError) as err:       # allowed: it runs (and finds no such slot)
            ex.map([(dict(op="ext", module="parties.shard_ops", fn="fingerprint", slot="none"), [])])
        assert "not allowed" not in str(err.value)


def test_the_crypto_floor_names_no_module_above_it():
    text = Path(worker.__file__).read_text(encoding="utf-8")
    assert "parties." not in text.replace("``parties.shard_ops``", "")
