"""Drift (issue 34): the PSI of a batch against the training counts equals a naive formula over the
same bins; references are checked when read back."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from datasets.errors import InputError
from vfl.core import drift


def naive_psi(train, batch, edges):
    """PSI written out loop by loop: bins (-inf, e0], (e0, e1], ..., (e_last, inf), then missing."""
    def shares(x):
        counts = [0] * (len(edges) + 2)
        for v in x:
            if math.isnan(v):
                counts[-1] += 1
                continue
            i = 0
            while i < len(edges) and v > edges[i]:
                i += 1
            counts[i] += 1
        return [max(c / len(x), drift.PSI_FLOOR) for c in counts]
    e, a = shares(train), shares(batch)
    return sum((ai - ei) * math.log(ai / ei) for ai, ei in zip(a, e))


@pytest.mark.parametrize("shift", [0.0, 0.2, 1.0])
def test_psi_matches_naive_formula(shift):
    rng = np.random.default_rng(1)
    train = rng.normal(size=(2000, 3))
    train[::9, 2] = np.nan
    train[:, 1] = np.round(train[:, 1])         # repeated values: fewer distinct edges
    batch = rng.normal(size=(700, 3)) + shift
    batch[::4, 2] = np.nan
    ref = drift.fit_reference(train, ["a", "b", "c"])
    got = drift.feature_psi(ref, batch)
    for j, f in enumerate(ref["features"]):
        assert f["counts"][-1] == int(np.isnan(train[:, j]).sum())
        assert sum(f["counts"]) == len(train)
        assert got[j] == pytest.approx(naive_psi(train[:, j], batch[:, j], f["edges"]), rel=1e-12, abs=1e-15)
    assert drift.feature_psi(ref, train) == [0.0, 0.0, 0.0]
    if shift >= 1.0:
        assert all(drift.flag(v) == "major" for v in got[:2])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-5, 5), min_size=1, max_size=60), st.lists(st.integers(-5, 5), min_size=1, max_size=60))
def test_psi_property(train, batch):
    t = np.array(train, dtype=float)[:, None]
    b = np.array(batch, dtype=float)[:, None]
    ref = drift.fit_reference(t, ["x"])
    v = drift.feature_psi(ref, b)[0]
    assert v >= 0
    assert v == pytest.approx(naive_psi(t[:, 0], b[:, 0], ref["features"][0]["edges"]), rel=1e-12, abs=1e-15)


def test_batches_add_up_and_categories():
    rng = np.random.default_rng(2)
    X = rng.integers(0, 4, size=(300, 1)).astype(float)
    ref = drift.fit_reference(X, ["cat"], categories={"cat": ["a", "b", "c", "d"]})
    assert ref["features"][0]["counts"] == [0] + np.bincount(X[:, 0].astype(int)).tolist() + [0]
    new = np.r_[X[:100], np.full((50, 1), -1.0)]      # 50 rows of an unseen category
    c = drift.DriftCounts(ref)
    c.add(new[:60])
    c.add(new[60:])
    assert c.n_rows == 150
    assert c.psi() == drift.feature_psi(ref, new)
    assert c.psi()[0] > drift.MAJOR


def test_flags_and_reference_checks():
    assert [drift.flag(x) for x in (0.0, 0.1, 0.2499, 0.25, None)] == ["stable", "moderate", "moderate", "major",
                                                                       "unknown"]
    ref = drift.fit_reference(np.arange(20.0)[:, None], ["x"])
    assert drift.check_reference(ref, "f.json") is ref
    bad = {**ref, "features": [{**ref["features"][0], "counts": [1, 2]}]}
    with pytest.raises(InputError, match="f.json.*counts"):
        drift.check_reference(bad, "f.json")
    assert drift.psi([0, 0], [1, 1]) is None


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 50) | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(st.one_of(_JSON, st.fixed_dictionaries({"version": st.just(1), "n_rows": st.integers(0, 5),
                                               "features": st.lists(st.fixed_dictionaries(
                                                   {"name": st.text(max_size=3), "edges": st.lists(
                                                       st.floats(allow_nan=False) | st.integers() | st.text(max_size=2),
                                                       max_size=3),
                                                    "counts": st.lists(st.integers(-1, 5) | st.booleans(),
                                                                       max_size=5)}), max_size=3)})))
def test_a_reference_read_from_a_file_is_checked_or_refused(value):
    """What a model file holds under drift_reference: accepted whole (then usable), or an InputError."""
    try:
        ref = drift.check_reference(value, "m.json")
    except InputError as exc:
        assert "m.json" in str(exc)
        return
    counts = drift.DriftCounts(ref)
    counts.add(np.zeros((2, len(ref["features"]))))
    assert len(counts.psi()) == len(ref["features"])
