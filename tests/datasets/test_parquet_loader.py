"""Parquet input (datasets.parquet via datasets.loaders.read_party_table / iter_party_batches): the same
table, ids, validation and error quality as CSV; schemas must agree across a directory's files; batches
equal the whole table."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import examples

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from datasets.csv_tables import read_party_csv  # noqa: E402
from datasets.errors import InputError  # noqa: E402
from datasets.ids import canonical_id  # noqa: E402
from datasets.loaders import iter_party_batches, read_party_piece, read_party_table  # noqa: E402
from datasets.parquet import parquet_files, parquet_pieces, read_parquet_piece  # noqa: E402


def frame(n=30, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"id": np.arange(n) * 7 + 3, "y": rng.integers(0, 2, n),
                         "a": np.where(rng.random(n) < 0.2, np.nan, rng.normal(size=n)),
                         "b": rng.integers(-5, 5, n), "c": rng.random(n) < 0.5})


def write_dir(tmp_path, df, cuts, name="pq", row_group_size=None):
    d = tmp_path / name
    d.mkdir()
    for i, part in enumerate(np.split(np.arange(len(df)), cuts)):
        pq.write_table(pa.Table.from_pandas(df.iloc[part], preserve_index=False), d / f"part.{i}.parquet",
                       row_group_size=row_group_size)
    return d


def same(a: pd.DataFrame, b: pd.DataFrame):
    assert list(a.columns) == list(b.columns)
    assert [str(t) for t in a.dtypes] == [str(t) for t in b.dtypes]
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=True)


def test_directory_equals_csv_and_files_are_read_in_natural_order(tmp_path):
    df = frame(40)
    df.to_csv(tmp_path / "t.csv", index=False)
    d = write_dir(tmp_path, df, [3, 5, 9, 12, 15, 18, 21, 24, 27, 30, 33])   # part.0 .. part.11
    (d / "_SUCCESS").write_text("")
    (d / ".part.0.parquet.crc").write_text("x")
    assert [f.name for f in parquet_files(d)][9:] == ["part.9.parquet", "part.10.parquet", "part.11.parquet"]
    csv = read_party_csv(tmp_path / "t.csv", "active", "id", "y")
    got = read_party_table(d, "active", "id", "y")
    same(got.frame, csv.frame)
    assert got.source == str(d) and got.feature_names == ["a", "b", "c"]
    one = tmp_path / "one.parquet"
    df.to_parquet(one, index=False)
    same(read_party_table(one, "active", "id", "y").frame, csv.frame)
    same(read_party_table(tmp_path / "t.csv", "active", "id", "y").frame, csv.frame)   # CSV dispatch


def test_text_ids_follow_the_csv_rule(tmp_path):
    df = pd.DataFrame({"id": ["10", "-2", "3"], "a": [1.0, 2.0, 3.0]})
    df.to_parquet(tmp_path / "i.parquet", index=False)
    assert read_party_table(tmp_path / "i.parquet", "h", "id").frame["id"].tolist() == [10, -2, 3]
    df.assign(id=["007", "8", "x"]).to_parquet(tmp_path / "s.parquet", index=False)
    got = read_party_table(tmp_path / "s.parquet", "h", "id").frame["id"]
    assert got.tolist() == ["007", "8", "x"]
    df.assign(id=np.array([1, 2, 3], dtype=np.uint16)).to_parquet(tmp_path / "u.parquet", index=False)
    assert read_party_table(tmp_path / "u.parquet", "h", "id").frame["id"].dtype == np.int64


def test_schema_mismatch_names_the_file_and_the_difference(tmp_path):
    df = frame(20)
    d = write_dir(tmp_path, df, [10])
    df.iloc[:5].assign(b=df["b"].iloc[:5].astype(float)).to_parquet(d / "part.2.parquet", index=False)
    with pytest.raises(InputError, match=r"part\.2\.parquet.*does not match the schema of.*part\.0\.parquet"
                                         r".*'b' is double here but int64 there"):
        read_party_table(d, "active", "id", "y")
    df.iloc[:5].drop(columns="c").to_parquet(d / "part.2.parquet", index=False)
    with pytest.raises(InputError, match=r"part\.2\.parquet.*columns missing \['c'\], unexpected \[\]"):
        read_party_table(d, "active", "id", "y")
    df.iloc[:5][["id", "y", "b", "a", "c"]].to_parquet(d / "part.2.parquet", index=False)
    with pytest.raises(InputError, match="in another order"):
        read_party_table(d, "active", "id", "y")


@pytest.mark.parametrize("change, message", [
    (lambda df: df.drop(columns="id"), r"party 'active' \(file '.*pq'\): id column 'id' not found; columns are"),
    (lambda df: df.drop(columns="y"), r"label column 'y' not found"),
    (lambda df: df.assign(a=df["a"].astype(str)),
     r"feature column 'a' is not numeric \(Parquet type (large_)?string\)"),
    (lambda df: df.assign(a=pd.to_datetime(df["b"], unit="D")),
     r"feature column 'a' is not numeric \(Parquet type timestamp"),
    (lambda df: df.assign(id=df["id"].astype(float)), r"id column 'id' must hold integers or strings, got Parquet "
                                                      r"type double"),
    (lambda df: df.assign(y=df["y"].astype(str)), r"label column 'y' is not numeric"),
])
def test_bad_columns_are_named_before_reading(tmp_path, change, message):
    d = write_dir(tmp_path, change(frame(20)), [10])
    with pytest.raises(InputError, match=message):
        read_party_table(d, "active", "id", "y")


def test_row_problems_name_the_file_at_fault(tmp_path):
    df = frame(20)
    d = write_dir(tmp_path, df.assign(a=df["a"].where(df.index != 13, np.inf)), [10])
    with pytest.raises(InputError, match=r"file '.*part\.1\.parquet'\): feature column 'a' has 1 infinite "
                                         r"values \(rows 3\)"):
        read_party_table(d, "active", "id", "y")
    d = write_dir(tmp_path, df.assign(id=df["id"].where(df.index != 15, df["id"][2])), [10], "dup")
    with pytest.raises(InputError, match=r"file '.*dup'\): id column 'id' has 1 duplicated ids: 17"):
        read_party_table(d, "active", "id", "y")     # across files: the directory is named
    d = write_dir(tmp_path, df.assign(id=df["id"].astype("Int64").where(df.index != 4, pd.NA)), [10], "na")
    with pytest.raises(InputError, match=r"part\.0\.parquet'\): id column 'id' has 1 missing ids \(rows 4\)"):
        read_party_table(d, "active", "id", "y")


def test_bad_paths_and_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_party_table(tmp_path / "nope", "g", "id")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no Parquet files"):
        read_party_table(tmp_path / "empty", "g", "id")
    d = write_dir(tmp_path, frame(10), [5])
    (d / "notes.txt").write_text("hello")
    with pytest.raises(InputError, match=r"notes\.txt.*is not a Parquet file"):
        read_party_table(d, "g", "id")
    (d / "notes.txt").unlink()
    (d / "sub").mkdir()
    with pytest.raises(InputError, match="holds a subdirectory 'sub'"):
        read_party_table(d, "g", "id")
    bad = tmp_path / "trunc.parquet"
    frame(10).to_parquet(bad, index=False)
    bad.write_bytes(bad.read_bytes()[:40])
    with pytest.raises(InputError, match=r"cannot read Parquet file '.*trunc\.parquet'"):
        read_party_table(bad, "g", "id")
    empty = tmp_path / "rows0.parquet"
    frame(10).iloc[:0].to_parquet(empty, index=False)
    with pytest.raises(InputError, match="no data rows"):
        read_party_table(empty, "g", "id", "y")
    indexed = tmp_path / "indexed.parquet"
    frame(10).set_index("id").to_parquet(indexed)
    with pytest.raises(InputError, match="it is the pandas index"):
        read_party_table(indexed, "g", "id", "y")


def test_index_columns_are_dropped_and_nullable_columns_read_as_csv_would(tmp_path):
    df = frame(10)
    df.iloc[[5, 2, 7, 1]].to_parquet(tmp_path / "x.parquet")   # index written as __index_level_0__
    assert "__index_level_0__" in pq.read_schema(tmp_path / "x.parquet").names
    assert read_party_table(tmp_path / "x.parquet", "g", "id", "y").feature_names == ["a", "b", "c"]
    pq.write_table(pa.table({"id": [1, 2, 3], "flag": pa.array([True, None, False]),
                             "n": pa.array([1, None, 3]), "z": pa.nulls(3)}), tmp_path / "n.parquet")
    got = read_party_table(tmp_path / "n.parquet", "g", "id").frame
    assert [str(t) for t in got.dtypes] == ["int64", "float64", "float64", "float64"]
    assert np.array_equal(got["flag"].to_numpy(), [1.0, np.nan, 0.0], equal_nan=True)


def test_pieces_are_read_one_by_one(tmp_path):
    df = frame(30)
    d = write_dir(tmp_path, df, [12], row_group_size=5)
    pieces = parquet_pieces(d)
    assert [(p.split("/")[-1], g, n) for p, g, n in pieces][:4] == [
        ("part.0.parquet", 0, 5), ("part.0.parquet", 1, 5), ("part.0.parquet", 2, 2), ("part.1.parquet", 0, 5)]
    parts = [read_parquet_piece(p, "g", row_group=g) for p, g, _ in pieces]
    same(pd.concat(parts, ignore_index=True), df)
    with pytest.raises(InputError, match="has no row group 9"):
        read_parquet_piece(pieces[0][0], "g", row_group=9)
    validated = [read_party_piece(p, "g", "id", "y", row_group=g, int_ids=True) for p, g, _ in pieces]
    same(pd.concat([v.frame for v in validated], ignore_index=True), read_party_table(d, "g", "id", "y").frame)
    assert validated[3].source == pieces[3][0]
    text = write_dir(tmp_path, df.assign(id=df["id"].astype(str)), [12], "text")
    [(f0, _, _), *_] = parquet_pieces(text)
    assert read_party_piece(f0, "g", "id", "y", int_ids=False).frame["id"].map(type).eq(str).all()
    assert read_party_piece(f0, "g", "id", "y").frame["id"].dtype == np.int64
    bad = write_dir(tmp_path, df.assign(a=df["a"].where(df.index != 7, np.inf)), [], "bad", row_group_size=5)
    with pytest.raises(InputError, match=r"part\.0\.parquet'\): feature column 'a' has 1 infinite values "
                                         r"\(rows 2\).* \(in row group 1;"):
        read_party_piece(parquet_pieces(bad)[1][0], "g", "id", "y", row_group=1)
    with pytest.raises(InputError, match="does not hold integers"):
        read_party_piece(parquet_pieces(write_dir(tmp_path, df.assign(id="x" + df["id"].astype(str)), [], "x"))[0][0],
                         "g", "id", "y", int_ids=True)


# --------------------------------------------------------------------------- batches

@st.composite
def tables(draw):
    n = draw(st.integers(1, 40))
    ids = draw(st.one_of(
        st.lists(st.integers(-10**12, 10**12), min_size=n, max_size=n, unique=True),
        st.lists(st.sampled_from(["007", "8", "x", "-3", "1.0", "12", "abc", "0"]) | st.text("0123456789", min_size=1,
                                                                                       max_size=4),
                 min_size=n, max_size=n, unique_by=canonical_id)))    # "1.0" and "1" are one id (the id rule)
    vals = draw(st.lists(st.one_of(st.none(), st.floats(-1e9, 1e9, allow_nan=False)), min_size=n, max_size=n))
    ints = draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n))
    df = pd.DataFrame({"id": ids, "f": np.array([np.nan if v is None else v for v in vals]), "k": ints})
    cuts = sorted(draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=3, unique=True))) if n > 1 else []
    return df, cuts, draw(st.integers(1, 12))


@pytest.mark.slow
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=tables())
def test_batches_of_csv_and_parquet_equal_the_whole_table(tmp_path_factory, t):
    df, cuts, batch_rows = t
    tmp = tmp_path_factory.mktemp("t")
    csv_path = tmp / "t.csv"
    df.to_csv(csv_path, index=False)
    d = write_dir(tmp, df.assign(id=df["id"].astype(str)) if df["id"].dtype == object else df, cuts)
    whole = read_party_table(csv_path, "g", "id").frame
    same(read_party_table(d, "g", "id").frame, whole)
    for path in (csv_path, d):
        batches = list(iter_party_batches(path, "g", "id", batch_rows=batch_rows))
        assert all(0 < len(b.frame) <= batch_rows for b in batches)
        same(pd.concat([b.frame for b in batches], ignore_index=True), whole)


def test_batches_check_the_whole_id_column_first(tmp_path):
    df = frame(20)
    df.assign(id=df["id"].where(df.index != 17, df["id"][1])).to_csv(tmp_path / "d.csv", index=False)
    with pytest.raises(InputError, match=r"d\.csv'\): id column 'id' has 1 duplicated ids: 10"):
        next(iter_party_batches(tmp_path / "d.csv", "g", "id", batch_rows=4))
    text = df.assign(id=df["id"].astype(str).where(df.index != 18, "x18"))
    text.to_csv(tmp_path / "s.csv", index=False)
    batches = list(iter_party_batches(tmp_path / "s.csv", "g", "id", batch_rows=4))
    assert all(b.frame["id"].map(type).eq(str).all() for b in batches)    # one id kind for every batch
    bad = df.astype({"a": object})
    bad.loc[13, "a"] = "oops"
    bad.to_csv(tmp_path / "b.csv", index=False)
    it = iter_party_batches(tmp_path / "b.csv", "g", "id", "y", batch_rows=5)
    assert len(next(it).frame) == 5 and len(next(it).frame) == 5
    with pytest.raises(InputError, match=r"feature column 'a' is not numeric.*'oops' in row 3 .*\(in the batch of "
                                         r"data rows from row 10 of '.*b\.csv'"):
        next(it)
    with pytest.raises(InputError, match="batch_rows must be in >= 1"):
        next(iter_party_batches(tmp_path / "s.csv", "g", "id", batch_rows=0))
    (tmp_path / "h.csv").write_text("id,a\n")
    with pytest.raises(InputError, match="no data rows"):
        next(iter_party_batches(tmp_path / "h.csv", "g", "id"))
    with pytest.raises(InputError, match="id column 'key' not found"):
        next(iter_party_batches(tmp_path / "s.csv", "g", "key"))
