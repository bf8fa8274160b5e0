"""Fixtures of the network tests (real party processes)."""
import pytest


@pytest.fixture
def children():
    """Processes a test starts (append them); killed and reaped when the test ends."""
    procs = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        if p.stdout:
            p.stdout.close()
