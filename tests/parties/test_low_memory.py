"""A driver that trains once (``ActiveParty(low_memory=True)``, what ``vfl party active`` builds):
the handed-over frame is emptied as it is read, the raw features, ids and labels are dropped once
binned and aligned, and the model is the one a keeping party grows."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import examples, small_frames

from datasets.frames import party_data
from protocols import messages as m
from protocols.alignment import hash_ids
from vfl.api import ActiveParty, Federation, PassiveParty
from vfl.core.errors import InputError
from vfl.core.rounds import RoundGradients, RoundTiming

ROOT = Path(__file__).resolve().parents[2]


def _structures(model):
    return [t.structure() for rnd in model.rounds for t in rnd]


@settings(max_examples=examples(40), deadline=None)
@given(n=st.integers(1, 30), n_num=st.integers(0, 4), with_text=st.booleans(), seed=st.integers(0, 2**16))
def test_a_consumed_frame_gives_the_same_arrays_and_keeps_only_its_ids(n, n_num, with_text, seed):
    rng = np.random.default_rng(seed)
    cols = {"id": np.arange(n), "y": rng.integers(0, 2, n).astype(float)}
    for j in range(n_num):
        x = rng.normal(size=n)
        x[rng.random(n) < 0.2] = np.nan
        cols[f"x{j}"] = x
    if with_text:
        cols["t"] = rng.choice(["a", "b", None], n)
    frame = pd.DataFrame(cols)
    cats = ["t"] if with_text else None
    kept = party_data(frame.copy(), "bank", "id", "y", require_features=False, categorical=cats)
    handed = frame.copy()
    got = party_data(handed, "bank", "id", "y", require_features=False, categorical=cats, consume=True)
    assert list(handed.columns) == ["id"]
    assert got.feature_names == kept.feature_names
    assert np.array_equal(got.X, kept.X, equal_nan=True)
    assert np.array_equal(got.y, kept.y, equal_nan=True) and np.array_equal(got.ids, kept.ids)
    assert got.categories == kept.categories


def test_a_low_memory_party_grows_the_same_model_and_keeps_no_raw_rows():
    a, b, c = small_frames(n=80)
    a = a.assign(w=np.linspace(0.5, 2.0, len(a)))
    keep = Federation(ActiveParty("a", a.copy(), weight_col="w"), [PassiveParty("b", b), PassiveParty("c", c)])
    keep.fit(mode="plain", n_estimators=3, max_depth=3)
    handed = a.copy()
    party = ActiveParty("a", handed, weight_col="w", low_memory=True)
    assert list(handed.columns) == ["id"]           # the weight, label and features were taken out
    lean = Federation(party, [PassiveParty("b", b), PassiveParty("c", c)])
    lean.fit(mode="plain", n_estimators=3, max_depth=3)
    assert _structures(lean.model) == _structures(keep.model)
    assert party.X is None and party.ids is None and party.y_raw is None
    new = {"a": a.drop(columns=["y", "w"]).iloc[:20], "b": b.iloc[:20], "c": c.iloc[:20]}
    # each training draws its own salt, so the rows are summed in another order: equal to rounding
    np.testing.assert_allclose(lean.predict_proba(new), keep.predict_proba(new), rtol=1e-12)
    with pytest.raises(InputError, match="keeps no training rows"):
        lean.predict_proba()
    with pytest.raises(InputError, match="trains once"):
        lean.fit(mode="plain", n_estimators=1)


def test_round_gradients_are_made_into_floats_once_and_shared_read_only():
    g = np.arange(12, dtype=np.int64).reshape(6, 2)
    rg = RoundGradients(0, g, g + 1, 8.0, 16.0, 3, None, RoundTiming())
    first, second = rg.as_float(), rg.as_float()
    assert first[0] is second[0] and first[1] is second[1]
    assert np.array_equal(first[0], g / 8) and np.array_equal(first[1], (g + 1) / 8)
    with pytest.raises(ValueError):
        first[0][0, 0] = 1.0


def test_a_passive_party_keeps_no_hashes_once_aligned():
    from parties.passive_align import align_request, align_result
    a, b, _ = small_frames(n=30)
    passive = PassiveParty("b", b)
    salt = bytes(range(16))
    reply = align_request(passive._state, m.AlignRequest("s1", salt))
    assert reply.hashes.shape == (30, 16)
    common = hash_ids(a["id"].to_numpy()[5:], salt)
    ack = align_result(passive._state, m.AlignResult(common))
    assert (ack.n_rows, ack.n_kept) == (30, 25)
    assert passive._state.train.hashes is None and len(passive._state.train.rows) == 25


#: what every peak-RSS probe runs first (argv[1]: the repository; the probe's own arguments follow)
PRELUDE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from parties.memory import return_freed_memory
return_freed_memory()
def hwm():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmHWM")) * 1024
def start_peak():
    with open("/proc/self/clear_refs", "w") as fh:     # the peak RSS starts again from the current RSS
        fh.write("5")
    return hwm()
"""


def run_probe(script: str, *args) -> dict:
    """``PRELUDE`` + ``script`` in a fresh interpreter; the JSON it prints."""
    out = subprocess.run([sys.executable, "-c", PRELUDE + script, str(ROOT), *map(str, args)], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


PROBE = r"""
import pyarrow as pa
from datasets.parquet import _to_pandas
from parties.active import ActiveParty
n, f = 400_000, 12
rng = np.random.default_rng(0)
table = pa.table({"id": np.arange(n), "y": rng.integers(0, 2, n).astype(float),
                  **{f"x{j}": rng.normal(size=n) for j in range(f)}})
frame = _to_pandas(table)          # one block per column, as a Parquet read gives
del table
before = start_peak()
party = ActiveParty("bank", frame, low_memory=sys.argv[2] == "on")
frame = None
print(json.dumps({"growth": hwm() - before, "x_bytes": party.X.nbytes}))
"""


def _clear_refs_works() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


needs_clear_refs = pytest.mark.skipif(not sys.platform.startswith("linux") or not _clear_refs_works(),
                                      reason="needs /proc/self/clear_refs to reset the peak RSS")


@needs_clear_refs
def test_a_handed_over_frame_and_the_feature_matrix_are_never_both_whole():
    lean, kept = run_probe(PROBE, "on"), run_probe(PROBE, "off")
    assert kept["growth"] > 0.9 * kept["x_bytes"], kept        # frame and matrix both held
    assert lean["growth"] < 0.4 * lean["x_bytes"], lean        # each column freed as it is copied


# -- deferred feature columns: a Parquet table's features are read after the alignment ---------------
def _parquet_dir(tmp_path, name, df, parts=2):
    d = tmp_path / name
    d.mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(df)), parts)):
        df.iloc[part].to_parquet(d / f"part-{i}.parquet", index=False)
    return d


@pytest.fixture
def fixed_salt(monkeypatch):
    from protocols import alignment
    monkeypatch.setattr(alignment, "new_salt", lambda: bytes(range(16)))


def test_deferred_features_train_the_model_of_the_whole_table(tmp_path, fixed_salt):
    from datasets.loaders import read_party_table_deferred
    pytest.importorskip("pyarrow")
    a, b, c = small_frames(n=90)
    a = a.assign(w=np.linspace(0.5, 2.0, len(a)))
    path = _parquet_dir(tmp_path, "active", a)
    head, cols = read_party_table_deferred(path, "active", "id", "y", keep=["w"])
    assert list(head.frame.columns) == ["id", "y", "w"] and cols.feature_names == ["a0", "a1"]
    party = ActiveParty("active", head.frame, weight_col="w", low_memory=True, features=cols)
    assert party.X is None and party.feature_names == ["a0", "a1"]
    lean = Federation(party, [PassiveParty("b", b), PassiveParty("c", c)])
    lean.fit(mode="plain", n_estimators=3, max_depth=3)
    whole = Federation(ActiveParty("active", a, weight_col="w"), [PassiveParty("b", b), PassiveParty("c", c)])
    whole.fit(mode="plain", n_estimators=3, max_depth=3)
    assert _structures(lean.model) == _structures(whole.model)
    new = {"active": a.drop(columns=["y", "w"]), "b": b, "c": c}
    assert np.array_equal(lean.predict_proba(new), whole.predict_proba(new))      # same salt: same sums
    assert party.X is None and party._deferred is None


def test_deferred_reading_applies_to_numeric_parquet_only_and_checks_values_late(tmp_path, fixed_salt):
    from datasets.loaders import read_party_table_deferred
    pytest.importorskip("pyarrow")
    a, b, _ = small_frames(n=40)
    a.to_csv(tmp_path / "a.csv", index=False)
    assert read_party_table_deferred(tmp_path / "a.csv", "active", "id", "y") is None
    cat = _parquet_dir(tmp_path, "cat", a.assign(kind=np.where(a["a0"] > 0, "hi", "lo")))
    assert read_party_table_deferred(cat, "active", "id", "y", categorical=["kind"]) is None
    bad = a.copy()
    bad.loc[25, "a1"] = np.inf                  # in the second file
    path = _parquet_dir(tmp_path, "bad", bad)
    head, cols = read_party_table_deferred(path, "active", "id", "y")   # the labels and ids are fine
    fed = Federation(ActiveParty("active", head.frame, low_memory=True, features=cols), [PassiveParty("b", b)])
    with pytest.raises(InputError, match=r"part-1\.parquet.*'a1' has 1 infinite"):
        fed.fit(mode="plain", n_estimators=1)
    # the table replaced between the labels and the features
    path = _parquet_dir(tmp_path, "moved", a)
    head, cols = read_party_table_deferred(path, "active", "id", "y")
    for i, part in enumerate(np.array_split(np.arange(len(a))[::-1], 2)):      # same files, rows reversed
        a.iloc[part].to_parquet(path / f"part-{i}.parquet", index=False)
    fed = Federation(ActiveParty("active", head.frame, low_memory=True, features=cols), [PassiveParty("b", b)])
    with pytest.raises(InputError, match="ids of .* changed between reading its labels and its features"):
        fed.fit(mode="plain", n_estimators=1)
    with pytest.raises(InputError, match="either in the frame or as deferred columns"):
        ActiveParty("active", a, features=cols)
    # as a column reader: a column must have as many rows as the ids read
    from datasets.loaders import DeferredColumns
    assert cols.shape == (40, 2) and np.array_equal(cols.column(1), a["a1"].to_numpy()[::-1])
    cols.n_rows = 41
    with pytest.raises(InputError, match="'a0' of .* has 40 rows, its ids 41; was the file replaced"):
        cols.column(0)
    with pytest.raises(ValueError, match="known once the ids were read"):
        DeferredColumns(path, cols.schema, "active", "id", ["a0"]).shape


class _Dies(Exception):
    pass


def _old_checkpoint(ck, tmp_path, digest_args):
    """``ck`` as a checkpoint written before the digest layout field: the features fingerprinted
    row after row, no ``data_digest_layout`` key."""
    from parties import checkpoint
    from vfl.core.model import content_hash
    d = ck.to_dict()
    del d["data_digest_layout"]
    ids, X, y, names, rows = digest_args
    d["data_digest"] = checkpoint.data_digest(ids, X, y, names, rows, layout="rows")
    d["content_hash"] = content_hash(d)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    return checkpoint.Checkpoint.load(path)


def test_a_deferred_party_checkpoints_and_resumes_reading_a_column_at_a_time(tmp_path, fixed_salt, monkeypatch):
    """The fingerprint of a low-memory party's deferred table is taken a column at a time and
    equals the one of the same table read whole; a resume (from a new checkpoint, and from one
    written before the layout field, fingerprinted row after row) gives the uninterrupted model."""
    from datasets.loaders import read_party_table_deferred
    from parties import checkpoint
    from parties.server import PassiveServer
    from protocols.transport import InMemoryTransport
    from vfl.core.params import TrainParams
    pytest.importorskip("pyarrow")
    a, b, _ = small_frames(n=120)
    path = _parquet_dir(tmp_path, "active", a)
    params = TrainParams(mode="plain", n_estimators=4, max_depth=3)

    def run(tag, **kw):
        head, cols = read_party_table_deferred(path, "active", "id", "y")
        party = ActiveParty("active", head.frame, low_memory=True, features=cols)
        server = PassiveServer("b", b, "id", tmp_path / tag / "b")
        t = InMemoryTransport("active", {"b": server.handle_frame})
        return party.fit(t, ["b"], params, **kw)

    digests, calls = [], []
    real = checkpoint.data_digest

    def spy(ids, X, y, names, rows=None, layout="columns"):
        calls.append((ids, X, y, names, rows))
        digests.append((type(X).__name__, layout, real(ids, X, y, names, rows, layout)))
        return digests[-1][2]
    monkeypatch.setattr(checkpoint, "data_digest", spy)
    full = run("full", checkpoint=lambda ck: None)
    assert digests[-1][:2] == ("DeferredColumns", "columns")
    kept = ActiveParty("active", a)            # the same table read whole: the same fingerprint
    kept.fit(InMemoryTransport("active", {"b": PassiveServer("b", b, "id", tmp_path / "kept" / "b").handle_frame}),
             ["b"], params, checkpoint=lambda ck: None)
    assert digests[-1][:2] == ("ndarray", "columns") and digests[-1][2] == digests[0][2]

    def stop(r, info):
        if r == 1:
            raise _Dies()
    for variant in ("new", "old"):
        saved = []
        with pytest.raises(_Dies):
            run(variant, checkpoint=saved.append, on_round=stop)
        ck = saved[-1]
        assert ck.n_rounds == 2 and ck.digest_layout == "columns"
        if variant == "old":
            ids, X, y, names, rows = calls[-1]
            assert type(X).__name__ == "DeferredColumns"
            ck = old = _old_checkpoint(ck, tmp_path, (ids, a[names].to_numpy(float), y, names, rows))
            assert old.digest_layout == "rows" and old.data_digest != saved[-1].data_digest
        resumed = run(variant, resume=ck)
        assert digests[-1][1] == ck.digest_layout
        assert _structures(resumed) == _structures(full)
    bad = old.to_dict()
    bad["data_digest_layout"] = "diagonal"
    from vfl.core.model import content_hash
    bad["content_hash"] = content_hash(bad)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(InputError, match="data_digest_layout"):
        checkpoint.Checkpoint.load(tmp_path / "bad.json")


DEFERRED_PROBE = r"""
from datasets.loaders import read_party_table_deferred
from parties.active import ActiveParty
from vfl.core.sources import LocalSource
head, cols = read_party_table_deferred(sys.argv[2], "bank", "id", "y")
party = ActiveParty("bank", head.frame, low_memory=sys.argv[3] == "on", features=cols)
head = cols = None
n, f = len(party.ids), len(party.feature_names)
before = start_peak()
party._read_deferred()
src = LocalSource("bank", party.X, party.feature_names, 32, rows=np.arange(n))
print(json.dumps({"growth": hwm() - before, "x_bytes": n * f * 8, "bins": src.bin_idx.nbytes}))
"""


@pytest.mark.slow
@needs_clear_refs
def test_a_low_memory_party_bins_a_deferred_table_without_its_feature_matrix(tmp_path):
    pytest.importorskip("pyarrow")
    n, f = 200_000, 32
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"id": np.arange(n), "y": rng.integers(0, 2, n).astype(float),
                       **{f"x{j}": rng.normal(size=n).round(2) for j in range(f)}})
    path = _parquet_dir(tmp_path, "bank", df, parts=3)
    del df

    lean, kept = run_probe(DEFERRED_PROBE, path, "on"), run_probe(DEFERRED_PROBE, path, "off")
    assert kept["growth"] > 0.9 * kept["x_bytes"], kept        # the matrix read whole
    # one column at a time, then its bins (one byte a value; the matrix would be eight)
    assert lean["growth"] - lean["bins"] < 0.3 * lean["x_bytes"], lean
    assert lean["bins"] == n * f                               # one byte per value


SAVE_PROBE = r"""
from parties.checkpoint import Checkpoint
raw = np.random.default_rng(0).normal(size=(2_000_000, 1))
ck = Checkpoint("a", ["b"], "m", "00", {}, len(raw), "d" * 64, [], raw, {})
before = start_peak()
ck.save(sys.argv[2])
print(json.dumps({"growth": hwm() - before, "raw_bytes": raw.nbytes}))
"""


@needs_clear_refs
def test_saving_a_checkpoint_never_holds_its_whole_text(tmp_path):
    """Every round's checkpoint carries 8 bytes of raw score per row; written as one JSON text it
    cost the driver about 7 times that (base64, dumps, the content hash's canonical copy)."""
    got = run_probe(SAVE_PROBE, tmp_path / "ck.json")
    assert got["growth"] < 0.5 * got["raw_bytes"], got


METRICS_PROBE = r"""
from parties.monitor import TrainingMonitor
from vfl.core.objectives import get_objective
from vfl.core.params import TrainParams
from vfl.core.rounds import RoundRecord, RoundTiming
n = 1_000_000
rng = np.random.default_rng(0)
y, raw = rng.integers(0, 2, n).astype(float), rng.normal(size=(n, 1))     # every score distinct
monitor = TrainingMonitor(get_objective("binary"), TrainParams(), y)
before = start_peak()
monitor.round_finished(RoundRecord(0, [], raw, RoundTiming()))
print(json.dumps({"growth": hwm() - before, "raw_bytes": raw.nbytes, "metrics": sorted(monitor.history["train"])}))
"""


@needs_clear_refs
def test_the_training_metrics_of_a_round_cost_a_few_vectors_not_a_python_float_per_row():
    """logloss, AUC and error of every training row after each round: summed exactly a chunk at a
    time, the AUC's ranks found by binary search (it took about 10 times the raw scores' bytes)."""
    got = run_probe(METRICS_PROBE)
    assert got["metrics"] == ["auc", "error", "logloss"]
    assert got["growth"] < 5 * got["raw_bytes"], got
