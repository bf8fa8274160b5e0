import warnings

import numpy as np
import pandas as pd
import pytest

from crypto import parallel
from crypto.keys import WeakKeyWarning
from datasets import breast_cancer_parties, shared_datasets_dir

KEY_BITS = 1024   # tests use 1024-bit keys unless they are about key size


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


def small_frames(n=120, seed=0):
    """A tiny three-party problem (active with 2 features, two passives with 2 each)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    y = (X[:, 0] + X[:, 2] - X[:, 4] + 0.3 * rng.normal(size=n) > 0).astype(int)
    ids = np.arange(n)
    a = pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})
    c = pd.DataFrame({"id": ids, "c0": X[:, 4], "c1": X[:, 5]})
    return a, b, c


@pytest.fixture
def always_parallel(monkeypatch):
    """Send even tiny batches to the workers, so the executor paths run on test-sized data."""
    monkeypatch.setattr(parallel, "POLICY", parallel.ParallelPolicy.always())
