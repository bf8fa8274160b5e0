"""Small shared helpers of the test suite (fixtures are in conftest.py)."""
import copy

import numpy as np
import pandas as pd
from hypothesis import strategies as st

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


# --- mutations of JSON documents (property tests of the file loaders) ------------------------------
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.sampled_from([0, 1, -1, 2, 3, 99, 2 ** 40])
    | st.floats() | st.text(max_size=6) | st.sampled_from(["inf", "-inf", "nan", "a", "b", "c", "a0", "00"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)


def paths(doc, prefix=()):
    """Every position in a JSON document: ``(path, value)``."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, prefix + (i,))


@st.composite
def mutated(draw, doc: dict):
    """``doc`` with one position replaced, deleted, emptied, duplicated or re-typed."""
    doc = copy.deepcopy(doc)
    where = draw(st.sampled_from([p for p, _ in paths(doc) if p]))
    parent = doc
    for k in where[:-1]:
        parent = parent[k]
    key = where[-1]
    action = draw(st.sampled_from(["replace", "replace", "delete", "number", "swap"]))
    if action == "delete":
        del parent[key]
    elif action == "number" and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        parent[key] = parent[key] + draw(st.sampled_from([1, -1, 0.5, 10 ** 6, -(10 ** 6)]))
    elif action == "swap" and isinstance(parent, list) and len(parent) > 1:
        parent.append(copy.deepcopy(parent[0]))
    else:
        parent[key] = draw(JSON_VALUES)
    return doc, where, action
