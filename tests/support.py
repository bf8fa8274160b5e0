"""Small shared helpers of the test suite (fixtures are in conftest.py)."""
import numpy as np
import pandas as pd

KEY_BITS = 1024   # tests use 1024-bit keys unless they are about key size


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


def alive(pid: int) -> bool:
    """Whether process ``pid`` is still running (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] not in ("Z", "X")
    except FileNotFoundError:
        return False
