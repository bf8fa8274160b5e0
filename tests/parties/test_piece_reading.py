"""Bounded passive drivers (issue 11): a Parquet table is read piece by piece by the workers that
hold the aligned rows' shards; the bin edges come from per-shard summaries merged in the driver; the
bins stay on the workers (splits ask them); the driver keeps only ids and per-row small arrays. The
model equals the one trained from the same table in memory (CSV path)."""
from __future__ import annotations

import gc
import json
import tracemalloc
import types

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import KEY_BITS, examples, small_frames

pytest.importorskip("pyarrow")

from crypto.executor import LocalExecutor  # noqa: E402
from datasets.errors import InputError  # noqa: E402
from datasets.pieces import PieceTable, open_piece_table, read_rows  # noqa: E402
from parties.shard_ops import row_fingerprint  # noqa: E402
from protocols import alignment  # noqa: E402
from protocols import messages as m  # noqa: E402
from protocols.transport import frame_handler  # noqa: E402
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams  # noqa: E402
from vfl.core.binning import Binner  # noqa: E402

SALT = bytes(range(16))


@pytest.fixture
def fixed_salt(monkeypatch):
    monkeypatch.setattr(alignment, "new_salt", lambda: SALT)


def frames(n=600, n_extra=0, seed=0):
    """The active party's table and the passive one's, the latter in another row order than the
    active party's (so the aligned order is not the file order), with missing values."""
    a, b, _ = small_frames(n, seed)
    rng = np.random.default_rng(seed + 1)
    for j in range(n_extra):
        b[f"x{j}"] = rng.normal(size=n).round(2) if j % 2 else rng.normal(size=n)
    b.loc[b.index[::17], "b0"] = np.nan
    b["flag"] = rng.integers(0, 2, n).astype(bool)
    b["small"] = rng.integers(0, 5, n).astype(np.int32)
    return a, b.iloc[rng.permutation(n)].reset_index(drop=True)


def write_parquet(df, d, files=3, row_group_size=70):
    d.mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(df)), files)):
        df.iloc[part].to_parquet(d / f"part-{i}.parquet", index=False, row_group_size=row_group_size)
    return d


def structures(model):
    return [t.structure() for r in model.rounds for t in r]


def train(a, passive, mode, seen=None, **params):
    """Train bank + ``passive``; ``seen``: a list receiving, at every histogram request, where the
    passive party's bins are (``(bins in the driver, shards, their workers)``)."""
    fed = Federation(ActiveParty("bank", a), [passive])
    if seen is not None:
        real = fed.passives[passive.name].handle

        def handle(request):
            if isinstance(request, m.HistogramRequest):
                t = passive._state.train
                seen.append((t.bin_idx is not None, len(t.shards), list(t.shards.workers)))
            return real(request)

        fed.transport.handlers[passive.name] = frame_handler(handle)
    model = fed.fit(TrainParams(mode=mode, key_bits=KEY_BITS, seed=1, **dict(dict(n_estimators=2, max_depth=3),
                                                                                 **params)))
    return fed, model


# --- the piece table ----------------------------------------------------------------------
def test_piece_table_keeps_ids_and_reads_any_rows_from_their_pieces(tmp_path):
    _, b = frames(300)
    d = write_parquet(b, tmp_path / "b", files=2, row_group_size=40)
    t = open_piece_table(d, "telco", "id")
    assert isinstance(t, PieceTable) and len(t) == 300 and t.shape == (300, len(b.columns) - 1)
    assert np.array_equal(t.ids, b["id"].to_numpy()) and t.ids.dtype == np.int64
    assert len(t.pieces) == 8 and t.pieces[4][2] == 150         # 4 row groups per file, first rows counted
    want = b.drop(columns="id").to_numpy(dtype=np.float64)
    rows = np.array([299, 0, 151, 149, 40, 39, 150, 0])         # any order, across pieces and files
    assert np.array_equal(t.read(rows), want[rows], equal_nan=True)
    assert np.array_equal(t[np.arange(300)], want, equal_nan=True)
    sub = t.with_features(["b1", "b0"])
    assert np.array_equal(sub.read([5, 6]), want[[5, 6]][:, [1, 0]], equal_nan=True)
    with pytest.raises(InputError, match="lacks feature column"):
        t.with_features(["nope"])
    assert read_rows(t.spec(), np.zeros(0, dtype=np.int64)).shape == (0, t.shape[1])
    with pytest.raises(InputError, match="outside its 300 rows"):
        t.read([300])
    # CSV and text features are read whole
    b.to_csv(tmp_path / "b.csv", index=False)
    assert open_piece_table(tmp_path / "b.csv", "telco", "id") is None
    write_parquet(b.assign(city="x"), tmp_path / "txt", files=1)
    assert open_piece_table(tmp_path / "txt", "telco", "id", categorical=["city"]) is None
    with pytest.raises(InputError, match="'city' is not numeric"):
        open_piece_table(tmp_path / "txt", "telco", "id")
    assert open_piece_table(d, "telco", "id", categorical=["small"]) is None
    dup = b.copy()
    dup.loc[200, "id"] = dup.loc[3, "id"]
    with pytest.raises(InputError, match="duplicated ids"):
        open_piece_table(write_parquet(dup, tmp_path / "dup"), "telco", "id")


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 120), files=st.integers(1, 4), group=st.integers(1, 50), seed=st.integers(0, 2 ** 16),
       take=st.integers(0, 200))
def test_any_rows_read_from_any_piece_layout_equal_the_table(tmp_path_factory, n, files, group, seed, take):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"id": rng.permutation(10 * n)[:n], "x": rng.normal(size=n),
                       "k": rng.integers(-5, 5, n), "f": rng.random(n) < 0.5})
    df.loc[rng.random(n) < 0.2, "x"] = np.nan
    d = tmp_path_factory.mktemp("pieces") / "t"
    write_parquet(df, d, files=min(files, n), row_group_size=group)
    t = open_piece_table(d, "p", "id")
    assert np.array_equal(t.ids, df["id"].to_numpy())
    rows = rng.integers(0, n, take)
    want = df[["x", "k", "f"]].to_numpy(dtype=np.float64)[rows]
    assert np.array_equal(t.read(rows), want, equal_nan=True)


@settings(max_examples=examples(50), deadline=None)
@given(cols=st.lists(st.lists(st.floats(-1e6, 1e6) | st.just(float("nan")), max_size=40), max_size=5))
def test_column_summaries_cross_the_worker_boundary_unchanged(cols):
    from parties.shard_ops import _summaries_from_frame, _summaries_to_frame
    from vfl.core.bin_summaries import summarize_column

    summaries = [summarize_column(np.array(c, dtype=np.float64), 256) for c in cols]
    header, blobs = _summaries_to_frame(summaries)
    back = _summaries_from_frame(json.loads(json.dumps(header)), [bytes(b) for b in blobs])
    assert [(s.values.tolist(), s.counts.tolist(), s.exact, s.n_missing) for s in back] == \
        [(s.values.tolist(), s.counts.tolist(), s.exact, s.n_missing) for s in summaries]


def test_text_ids_that_are_integers_follow_the_csv_rule(tmp_path):
    _, b = frames(120)
    d = write_parquet(b.assign(id=b["id"].astype(str)), tmp_path / "b", files=2)
    t = open_piece_table(d, "telco", "id")
    assert t.int_ids and t.ids.dtype == np.int64 and np.array_equal(t.ids, b["id"].to_numpy())
    assert np.array_equal(t.read([7, 100]), b.drop(columns="id").to_numpy(dtype=np.float64)[[7, 100]],
                          equal_nan=True)


@pytest.mark.slow
def test_a_bad_value_in_a_piece_read_by_a_worker_names_the_file(tmp_path, fixed_salt):
    a, b = frames(200)
    b["b1"] = b["b1"].astype(np.float64)
    b.loc[150, "b1"] = np.inf
    d = write_parquet(b, tmp_path / "b", files=2)
    with LocalExecutor(2, name="passive:telco") as ex:
        with pytest.raises(InputError, match=r"part-1\.parquet.*b1|b1.*part-1\.parquet"):
            train(a, PassiveParty.from_file("telco", d, executor=ex), "plain")


def test_the_row_fingerprint_adds_up_over_any_shards_and_sees_any_change():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(500, 4))
    X[::7, 1] = np.nan
    whole = row_fingerprint(X, 0)
    for cuts in ([250], [1, 2, 499], [100, 300, 301]):
        bounds = [0, *cuts, 500]
        parts = [row_fingerprint(X[a:b], a) for a, b in zip(bounds, bounds[1:])]
        assert [sum(p[i] for p in parts) % (1 << 64) for i in range(2)] == whole
    changed = X.copy()
    changed[123, 2] = np.nextafter(changed[123, 2], 1.0)
    swapped = X[[1, 0, *range(2, 500)]]
    assert row_fingerprint(changed, 0) != whole and row_fingerprint(swapped, 0) != whole
    assert row_fingerprint(X[:, [1, 0, 2, 3]], 0) != whole and row_fingerprint(X, 1) != whole


# --- the same model as the in-memory path ------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["plain", "he"])
def test_workers_read_the_parquet_directory_and_train_the_csv_model(tmp_path, fixed_salt, mode):
    a, b = frames(600)
    d = write_parquet(b, tmp_path / "b")
    b.to_csv(tmp_path / "b.csv", index=False)
    ref_party = PassiveParty.from_file("telco", tmp_path / "b.csv")
    assert isinstance(ref_party._state.X, np.ndarray)
    ref, ref_model = train(a, ref_party, mode)
    with LocalExecutor(2, name="passive:telco") as ex:
        party = PassiveParty.from_file("telco", d, executor=ex)
        assert isinstance(party._state.X, PieceTable)
        seen = []
        fed, model = train(a, party, mode, seen)
    assert seen and all(x == (False, 3, [0, 1, 0]) for x in seen)     # >= 256 rows a shard, bins on them
    assert structures(model) == structures(ref_model)
    assert [(r["feature"], r["threshold"], r["default_left"]) for r in party.records] == \
        [(r["feature"], r["threshold"], r["default_left"]) for r in ref_party.records]
    assert {n.owner for t in model.rounds[0] for n in t.nodes if not n.is_leaf} >= {"telco"}
    # prediction: on the training table (rows read per session) and on a Parquet table loaded for it
    pred = {"bank": a.drop(columns="y"), "telco": b}
    for prediction in ("one-round", "node"):
        want = ref.predict_raw(pred, prediction=prediction)
        assert np.array_equal(fed.predict_raw(None, prediction=prediction), want)
        assert np.array_equal(fed.predict_raw({**pred, "telco": d}, prediction=prediction), want)
        assert isinstance(party._state.pred_X, PieceTable)
        assert np.array_equal(fed.predict_raw({**pred, "telco": open_piece_table(d, "telco", "id")},
                                              prediction=prediction, batch_rows=70), want)
    assert np.array_equal(party.aligned_features(), ref_party.aligned_features(), equal_nan=True)


@pytest.mark.slow
def test_sharded_edges_in_training_equal_the_binner_of_the_aligned_rows(tmp_path, fixed_salt):
    """More distinct values than a column summary holds (4,096): the per-shard summaries are
    approximate and refined on the workers until the edges are Binner's."""
    a, b = frames(6000, n_extra=2)
    d = write_parquet(b, tmp_path / "b", files=4, row_group_size=500)
    with LocalExecutor(2, name="passive:telco") as ex:
        party = PassiveParty.from_file("telco", d, executor=ex)
        train(a, party, "plain", n_estimators=1, max_depth=2, max_bin=64)
    t = party._state.train
    X = b.drop(columns="id").to_numpy(dtype=np.float64)[t.rows]
    want = Binner(64).fit(X).thresholds_
    assert len(np.unique(X[:, 2][~np.isnan(X[:, 2])])) > 4096
    assert len(t.binner.thresholds_) == len(want)
    assert all(np.array_equal(g, w) for g, w in zip(t.binner.thresholds_, want))


# --- the driver's memory ---------------------------------------------------------------
def _arrays_reachable(root) -> list[tuple]:
    """Shapes of the numpy arrays reachable from ``root`` (not through modules, classes, functions)."""
    seen, out, todo = set(), [], [root]
    skip = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
            types.CodeType)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            out.append(obj.shape)
            continue
        if isinstance(obj, (str, bytes, int, float)):
            continue
        todo.extend(gc.get_referents(obj))
        if hasattr(obj, "__dict__"):
            todo.append(vars(obj))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("source", ["parquet", "memory"])
def test_the_passive_driver_never_holds_a_rows_by_features_array(tmp_path, fixed_salt, source):
    """At set-up (peak of traced allocations while the passive party answers TrainSetup), at every
    histogram and split request (arrays reachable from the party): nothing as large as half the
    aligned rows x features (what grows with the rows is 1-D or a few columns: ids, their hashes,
    the alignment, a node per row; the summaries behind the bin edges are bounded by their points
    per column). The in-memory path holds both, so the checks can fail."""
    n = 6000
    a, b = frames(n, n_extra=20)
    b = b.round(1)          # few distinct values: the per-shard summaries are small (at most 4,096 points)
    nf = b.shape[1] - 1
    whole = n * nf * 8 // 2                         # half of the float64 feature matrix, in bytes
    d = write_parquet(b, tmp_path / "b", files=3, row_group_size=400)
    with LocalExecutor(2, name="passive:telco") as ex:
        party = PassiveParty.from_file("telco", d, executor=ex) if source == "parquet" else \
            PassiveParty("telco", b, executor=ex)
        fed = Federation(ActiveParty("bank", a), [party])
        real = fed.passives["telco"].handle
        setup_peaks, big = [], []

        def handle(request):
            if isinstance(request, m.TrainSetup):
                tracemalloc.start()
                try:
                    reply = real(request)
                    setup_peaks.append(tracemalloc.get_traced_memory()[1])
                finally:
                    tracemalloc.stop()
                return reply
            if isinstance(request, (m.HistogramRequest, m.SplitRequest)):
                big.append([s for s in _arrays_reachable(party)
                            if len(s) == 2 and s[0] >= n // 2 and s[1] == nf])
            return real(request)

        fed.transport.handlers["telco"] = frame_handler(handle)
        fed.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2, seed=1))
    assert len(setup_peaks) == 1 and len(big) >= 4
    if source == "parquet":
        assert setup_peaks[0] < whole and all(b == [] for b in big), (setup_peaks, whole, big)
        assert party._state.train.binner is not None
    else:
        assert setup_peaks[0] >= whole and all((n, nf) in b for b in big)


def test_dp_mode_reads_the_aligned_rows_in_the_driver_and_categorical_needs_the_whole_table(tmp_path, fixed_salt):
    """Mode dp randomizes every row's bins in the driver (documented): the rows are read there."""
    a, b = frames(300)
    d = write_parquet(b, tmp_path / "b")
    party = PassiveParty.from_file("telco", d)
    train(a, party, "dp", n_estimators=1, max_depth=2, epsilon=5.0)
    # (issue 23: the raw rows, bucketed at each release in its data-independent domain)
    assert party._state.train.dp_X is not None and party._state.train.dp_X.shape == (300, b.shape[1] - 1)
    with pytest.raises(InputError, match="categorical"):
        PassiveParty("telco", open_piece_table(d, "telco", "id"), categorical=["small"])
    assert isinstance(PassiveParty.from_file("telco", d, categorical=["small"])._state.X, np.ndarray)
    pd.testing.assert_index_equal(pd.Index(party.feature_names), pd.Index(b.columns[1:]))


# --- a passive server over a Parquet table: training, interruption, resume ----------------------
def test_a_passive_server_reading_pieces_resumes_an_interrupted_training(tmp_path, fixed_salt):
    """The server keeps a PieceTable; its data check on resume is the workers' fingerprint: an
    interrupted training resumes to the uninterrupted model; a changed table is refused."""
    from parties.server import PassiveServer
    from protocols.transport import InMemoryTransport

    a, b = frames(500)
    d = write_parquet(b, tmp_path / "b")
    params = TrainParams(mode="plain", n_estimators=3, max_depth=2, seed=1)

    def fit(srv, **kw):
        t = InMemoryTransport("bank", {"telco": srv.handle_frame})
        return ActiveParty("bank", a).fit(t, ["telco"], params, **kw)

    full = fit(PassiveServer("telco", open_piece_table(d, "telco", "id"), "id", tmp_path / "full"))
    ref = fit(PassiveServer("telco", b, "id", tmp_path / "mem"))
    assert structures(full) == structures(ref)
    table = open_piece_table(d, "telco", "id")
    srv = PassiveServer("telco", table, "id", tmp_path / "run")
    assert srv.n_rows == 500
    saved = []

    def boom(r, info):
        if r == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(srv, checkpoint=saved.append, on_round=boom)
    assert saved and saved[-1].n_rounds == 2
    resumed = fit(PassiveServer("telco", open_piece_table(d, "telco", "id"), "id", tmp_path / "run"),
                  resume=saved[-1])
    assert structures(resumed) == structures(full)
    changed = b.copy()
    changed.loc[7, "b1"] += 1.0
    d2 = write_parquet(changed, tmp_path / "changed")
    with pytest.raises(InputError, match="its training data changed since model .* cannot resume"):
        fit(PassiveServer("telco", open_piece_table(d2, "telco", "id"), "id", tmp_path / "run"), resume=saved[-1])
