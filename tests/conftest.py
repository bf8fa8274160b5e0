"""Fixtures every test directory shares; helpers are in support.py."""
import warnings

import pytest
from support import KEY_BITS

from crypto import parallel
from crypto.keys import WeakKeyWarning
from datasets import breast_cancer_parties, shared_datasets_dir


@pytest.fixture(autouse=True)
def _allow_test_keys():
    """1024-bit keys warn by design; tests use them on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=WeakKeyWarning)
        yield


@pytest.fixture(scope="session")
def keypair():
    import phe
    return phe.generate_paillier_keypair(n_length=KEY_BITS)


@pytest.fixture(scope="session")
def breast2():
    return breast_cancer_parties(2)


@pytest.fixture(scope="session")
def breast3():
    return breast_cancer_parties(3)


@pytest.fixture
def shared_dir():
    d = shared_datasets_dir()
    if d is None:
        pytest.skip("../shared/datasets is not available")
    return d


@pytest.fixture
def always_parallel(monkeypatch):
    """Send even tiny batches to the workers, so the executor paths run on test-sized data."""
    monkeypatch.setattr(parallel, "POLICY", parallel.ParallelPolicy.always())
