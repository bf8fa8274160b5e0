"""The many-core model's price list (crypto.sim_executor.SimCosts) and the simulated executor's
refusals, in process: each worker operation is counted in its own unit."""
import pytest

from crypto.executor import WorkerError
from crypto.sim_executor import SimCosts, SimulatedExecutor

COSTS = SimCosts(encrypt=1.0, add=0.5, move=0.25, decrypt=2.0)


@pytest.mark.parametrize("header, blobs, reply, units", [
    ({"op": "pack_encrypt", "n_rows": 10, "shifts": 3}, [], ({}, []), {"encrypt": 30}),
    ({"op": "pack_encrypt", "n_rows": 10, "masked": True}, [b"", b"", bytes([1, 0, 1, 1])], ({}, []), {"encrypt": 3}),
    ({"op": "encrypt", "width": 8}, [bytes(8 * 5)], ({}, []), {"encrypt": 5}),
    ({"op": "shards_hist"}, [], ({"additions": 42}, []), {"add": 42}),
    ({"op": "take"}, [], ({}, []), {"add": 0}),
    ({"op": "combine", "width": 4}, [b"hdr", bytes(8), bytes(12)], ({}, []), {"add": 5}),
    ({"op": "compress", "shift_bits": 3}, [], ({}, [bytes(7)]), {"add": 21}),
    ({"op": "compress"}, [], ({}, []), {"add": 0}),
    ({"op": "fill", "segments": [[0, 4], [9, 6]]}, [], ({}, []), {"move": 10}),
    ({"op": "get", "width": 2}, [], ({}, [bytes(10)]), {"move": 5}),
    ({"op": "decrypt", "width": 16}, [], ({}, [bytes(64)]), {"decrypt": 4}),
    ({"op": "decrypt"}, [], ({}, [bytes(3)]), {"decrypt": 3}),
    ({"op": "decrypt", "width": 16}, [], ({}, []), {"decrypt": 0}),
    ({"op": "ping"}, [], ({}, []), {}),
])
def test_each_operation_is_counted_in_its_unit(header, blobs, reply, units):
    got, seconds = COSTS.of(header, blobs, reply)
    assert got == units
    assert seconds == pytest.approx(sum(getattr(COSTS, k) * v for k, v in units.items()))


def test_the_simulated_executor_refuses_what_a_real_one_refuses():
    with pytest.raises(ValueError, match="at least one worker"):
        SimulatedExecutor(0)
    ex = SimulatedExecutor(2, name="sim-bank")
    try:
        assert ex.pids == [] and ex.worker_peaks() == [] and not ex.started
        with pytest.raises(WorkerError, match="executor 'sim-bank' has no worker 2"):
            ex.submit_on([(2, ({"op": "ping"}, []))])
        assert ex.started and ex.run_on([]) == []
    finally:
        ex.close()
    assert not ex.started
    with pytest.raises(WorkerError, match="executor 'sim-bank' is closed"):
        ex.start()
