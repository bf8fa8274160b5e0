"""Tests of the datasets package: party frames, loaders, synthetic data, splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from ci_rules import SHARED_SKIP

from datasets import (
    PartyFrame,
    breast_cancer_parties,
    check_binary_labels,
    feature_matrix,
    load_a9a,
    load_active_passive,
    load_guest_host,
    load_shared,
    make_synthetic,
    parse_libsvm,
    read_party_csv,
    shared_datasets_dir,
    train_test_split_parties,
    validate_party_frame,
    vertical_split,
)
from vfl.core.errors import InputError


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def active_frame(**extra) -> pd.DataFrame:
    data = {"id": [1, 2, 3, 4], "y": [0, 1, 0, 1], "a": [0.5, np.nan, 1.5, 2.0], "b": [1, 2, 3, 4]}
    data.update(extra)
    return pd.DataFrame(data)


def pf(frame, name="active", label="y", source="g.csv") -> PartyFrame:
    return PartyFrame(name=name, frame=frame, id_col="id", label_col=label, source=source)


def need_shared() -> Path:
    root = shared_datasets_dir()
    if root is None:
        pytest.skip(SHARED_SKIP)
    return root


# --------------------------------------------------------------------------- PartyFrame / validation


def test_feature_names_exclude_id_and_label():
    p = pf(active_frame())
    assert p.feature_names == ["a", "b"]
    assert PartyFrame("passive", active_frame().drop(columns="y"), "id").feature_names == ["a", "b"]
    validate_party_frame(p, require_features=True)  # NaN in features is fine


def test_validate_accepts_string_ids_and_bool_features():
    frame = pd.DataFrame({"id": ["u1", "u2"], "flag": [True, False], "n": [1, 2]})
    party = PartyFrame("passive", frame, "id")
    assert validate_party_frame(party, require_features=True) is None      # accepted: no InputError
    assert party.feature_names == ["flag", "n"]
    # and usable as they are: string ids kept, the bool feature read as 0/1
    ids, X, names = feature_matrix(frame, "passive", "id")
    assert ids.tolist() == ["u1", "u2"] and names == ["flag", "n"]
    assert X.dtype == np.float64 and X.tolist() == [[1.0, 1.0], [0.0, 2.0]]


def test_validate_missing_id_column():
    with pytest.raises(InputError, match=r"party 'active'.*g\.csv.*id column 'id' not found"):
        validate_party_frame(pf(active_frame().rename(columns={"id": "ID"})), require_features=False)


def test_validate_missing_label_column():
    with pytest.raises(InputError, match=r"party 'active'.*g\.csv.*label column 'y' not found"):
        validate_party_frame(pf(active_frame().drop(columns="y")), require_features=False)


def test_validate_string_feature_names_column_and_value():
    frame = active_frame(c=["1.0", "2.5", "oops", "3"])
    with pytest.raises(InputError, match=r"party 'active'.*g\.csv.*feature column 'c' is not numeric.*'oops'"):
        validate_party_frame(pf(frame), require_features=False)


def test_validate_object_feature_rejected():
    frame = active_frame(c=pd.Series([1.0, "x", None, 2.0], dtype=object))
    with pytest.raises(InputError, match=r"feature column 'c'.*'x' in row 1"):
        validate_party_frame(pf(frame), require_features=False)


def test_validate_inf_feature():
    frame = active_frame(c=[1.0, np.inf, -np.inf, 0.0])
    with pytest.raises(InputError, match=r"party 'active'.*feature column 'c' has 2 infinite values"):
        validate_party_frame(pf(frame), require_features=False)


def test_validate_no_features():
    frame = active_frame().drop(columns=["a", "b"])
    validate_party_frame(pf(frame), require_features=False)
    with pytest.raises(InputError, match=r"party 'active'.*g\.csv.*no feature columns"):
        validate_party_frame(pf(frame), require_features=True)


def test_validate_ids_missing_and_duplicated():
    with pytest.raises(InputError, match=r"party 'passive'.*id column 'id' has 2 duplicated ids: 1, 2"):
        validate_party_frame(pf(active_frame(id=[1, 1, 2, 2]), name="passive", label=None), require_features=False)
    frame = active_frame(id=pd.Series(["a", None, "c", "d"], dtype="str"))
    with pytest.raises(InputError, match=r"party 'active'.*id column 'id' has 1 missing ids"):
        validate_party_frame(pf(frame), require_features=False)
    with pytest.raises(InputError, match=r"id column 'id' must hold integers or strings"):
        validate_party_frame(pf(active_frame(id=[1.5, 2.5, 3.5, 4.5])), require_features=False)
    with pytest.raises(InputError, match=r"id column 'id' must hold only integers or only strings"):
        validate_party_frame(pf(active_frame(id=pd.Series([1, "b", 3, 4], dtype=object))), require_features=False)


def test_validate_non_numeric_label():
    with pytest.raises(InputError, match=r"party 'active'.*label column 'y' is not numeric.*'no' in row 0"):
        validate_party_frame(pf(active_frame(y=["no", "yes", "no", "no"])), require_features=False)


def test_check_binary_labels_ok():
    assert check_binary_labels(pf(active_frame(y=[0.0, 1.0, 1.0, 0.0]))).tolist() == [0, 1, 1, 0]
    assert check_binary_labels(pf(active_frame(y=[True, False, True, True]))).tolist() == [1, 0, 1, 1]


def test_check_binary_labels_bad_values():
    p = pf(active_frame(y=[0, 2, 3, -1]))
    with pytest.raises(InputError, match=r"label column 'y' of party 'active'.*3 rows hold other values: -1, 2, 3"):
        check_binary_labels(p)
    many = pf(pd.DataFrame({"id": range(8), "y": [0, 1, 2, 3, 4, 5, 6, 7], "a": 0.0}))
    with pytest.raises(InputError, match=r"2, 3, 4, 5, 6, \.\.\. \(6 in total\)"):
        check_binary_labels(many)
    with pytest.raises(InputError, match=r"0\.5"):
        check_binary_labels(pf(active_frame(y=[0.0, 0.5, 1.0, 1.0])))


def test_check_binary_labels_nan_inf():
    p = pf(active_frame(y=[np.nan, 1.0, np.inf, np.nan]))
    with pytest.raises(InputError, match=r"label column 'y' of party 'active' has 3 NaN/inf values"):
        check_binary_labels(p)


def test_check_binary_labels_needs_label():
    with pytest.raises(InputError, match=r"party 'passive'"):
        check_binary_labels(pf(active_frame(), name="passive", label=None))


# --------------------------------------------------------------------------- CSV loading


def test_read_party_csv_missing_file(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(InputError, match=r"nope\.csv.*party 'active'.*does not exist"):
        read_party_csv(missing, "active", "id", "y")


def test_read_party_csv_empty_and_header_only(tmp_path):
    with pytest.raises(InputError, match=r"empty\.csv.*is empty"):
        read_party_csv(write(tmp_path / "empty.csv", ""), "active", "id")
    with pytest.raises(InputError, match=r"head\.csv.*no data rows"):
        read_party_csv(write(tmp_path / "head.csv", "id,y,a\n"), "active", "id", "y")
    with pytest.raises(InputError, match=r"is a directory"):
        read_party_csv(tmp_path, "active", "id")


def test_read_party_csv_unparsable(tmp_path):
    bad = write(tmp_path / "bad.csv", "id,a\n1,2\n3,4,5\n")
    with pytest.raises(InputError, match=r"bad\.csv.*party 'passive'"):
        read_party_csv(bad, "passive", "id")
    wide = write(tmp_path / "wide.csv", "id,a\n1,2,3,4\n5,6\n")
    with pytest.raises(InputError, match=r"wide\.csv.*more fields than the header"):
        read_party_csv(wide, "passive", "id")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"id,a\n1,\xff\xfe\n")
    with pytest.raises(InputError, match=r"bin\.csv.*not UTF-8"):
        read_party_csv(binary, "passive", "id")
    dup = write(tmp_path / "dup.csv", "id,a,a\n1,2,3\n")
    with pytest.raises(InputError, match=r"dup\.csv.*duplicated column names: 'a'"):
        read_party_csv(dup, "passive", "id")


@pytest.mark.parametrize("text, line, kind", [
    ("id,y,a,b\n1,0,0.5,1\n2,1,1.5\n", 3, "fewer"),              # a truncated last line
    ("id,y,a,b\n1,0,0.5,1\n2,1\n3,0,1,2\n", 3, "fewer"),
    ("id,y,a,b\n1,0,0.5,1\n\n2\n", 4, "fewer"),                 # blank lines are skipped, still counted
    ("id,y,a,b\n1,0,0.5,1\n2,1,1.5,2,9\n", 3, "more"),
    ('id,y,a,b\n1,0,"0.5\n7",1\n2,1,3\n', 4, "fewer"),          # a quoted newline: physical line numbers
])
def test_read_party_csv_rows_with_wrong_field_counts_name_file_and_line(tmp_path, text, line, kind):
    path = write(tmp_path / "rows.csv", text)
    with pytest.raises(InputError, match=rf"rows\.csv.*party 'active'.*line {line} has \d+ fields?: {kind} fields "
                                         r"than the header has columns \(4\)"):
        read_party_csv(path, "active", "id", "y")


def test_read_party_csv_full_rows_and_blank_lines_still_read(tmp_path):
    pf = read_party_csv(write(tmp_path / "ok.csv", "id,y,a\n1,0,\n\n2,1,3\n"), "active", "id", "y")
    assert pf.frame["id"].tolist() == [1, 2] and np.isnan(pf.frame["a"].iloc[0])


@pytest.mark.parametrize("written, expected", [("133.0", 133), ("133.00", 133), (" 133 ", 133), ("-0.0", 0),
                                               ("133", 133)])
def test_read_party_csv_ids_follow_the_one_id_rule(tmp_path, written, expected):
    pf = read_party_csv(write(tmp_path / "ids.csv", f"id,a\n{written},1\n7,2\n"), "passive", "id")
    assert pf.frame["id"].tolist() == [expected, 7] and pf.frame["id"].dtype == np.int64


def test_read_party_csv_ids_the_rule_does_not_merge(tmp_path):
    pf = read_party_csv(write(tmp_path / "ids.csv", "id,a\n007,1\n133.5,2\n1e3,3\n12.0,4\n"), "passive", "id")
    assert pf.frame["id"].tolist() == ["007", "133.5", "1e3", "12"]


def test_read_party_csv_errors_name_file_and_column(tmp_path):
    path = write(tmp_path / "g.csv", "id,y,a,b\n1,0,0.5,x\n2,1,1.5,2\n")
    with pytest.raises(InputError, match=r"party 'active'.*g\.csv.*feature column 'b'.*'x'"):
        read_party_csv(path, "active", "id", "y")
    path = write(tmp_path / "g2.csv", "key,y,a\n1,0,0.5\n")
    with pytest.raises(InputError, match=r"g2\.csv.*id column 'id' not found"):
        read_party_csv(path, "active", "id", "y")
    path = write(tmp_path / "g3.csv", "id,a\n1,inf\n2,3\n")
    with pytest.raises(InputError, match=r"g3\.csv.*feature column 'a' has 1 infinite"):
        read_party_csv(path, "active", "id")
    path = write(tmp_path / "g4.csv", "id,a\n1,1\n1,3\n")
    with pytest.raises(InputError, match=r"g4\.csv.*duplicated ids: 1"):
        read_party_csv(path, "active", "id")


def test_read_party_csv_id_types(tmp_path):
    ints = read_party_csv(write(tmp_path / "i.csv", "id,a\n10,1\n-2,2\n"), "passive", "id")
    assert ints.frame["id"].dtype == np.int64 and ints.frame["id"].tolist() == [10, -2]
    text = read_party_csv(write(tmp_path / "s.csv", "id,a\n007,1\n8,2\n"), "passive", "id")
    assert text.frame["id"].tolist() == ["007", "8"]  # leading zeros kept: ids stay strings
    assert read_party_csv(tmp_path / "s.csv", "passive", "id").source == str(tmp_path / "s.csv")


def make_pair(tmp_path: Path):
    g = write(tmp_path / "active.csv", "id,y,g0,g1\n3,1,0.1,1\n1,0,,2\n2,1,0.3,3\n")
    h = write(tmp_path / "passive.csv", "id,h0\n3,5.0\n1,6.0\n2,7.5\n")
    return g, h


def test_load_active_passive_round_trip(tmp_path):
    g, h = make_pair(tmp_path)
    active, passive = load_active_passive(g, [h])
    assert (active.name, passive.name) == ("active", "passive1")
    assert active.label_col == "y" and passive.label_col is None
    assert active.feature_names == ["g0", "g1"] and passive.feature_names == ["h0"]
    assert active.frame["id"].tolist() == [3, 1, 2] and passive.frame["id"].tolist() == [3, 1, 2]
    assert np.isnan(active.frame["g0"].iloc[1])
    assert passive.frame["h0"].tolist() == [5.0, 6.0, 7.5]
    # and back: written frames read identically
    active.frame.to_csv(tmp_path / "g_out.csv", index=False)
    again = read_party_csv(tmp_path / "g_out.csv", "active", "id", "y")
    pd.testing.assert_frame_equal(again.frame, active.frame)


def test_load_active_passive_names_the_passive_parties(tmp_path):
    g, h = make_pair(tmp_path)
    h2 = write(tmp_path / "passive2.csv", "id,k\n1,0\n2,0\n3,1\n")
    parties = load_active_passive(g, [h, h2])
    assert [p.name for p in parties] == ["active", "passive1", "passive2"]


def test_load_guest_host_is_a_deprecated_alias(tmp_path):
    g, h = make_pair(tmp_path)
    with pytest.warns(DeprecationWarning, match="load_guest_host is deprecated, use load_active_passive"):
        parties = load_guest_host(g, [h], id_col="id", label_col="y")
    new = load_active_passive(g, [h])
    assert [p.name for p in parties] == ["active", "passive1"]
    for old, now in zip(parties, new):
        pd.testing.assert_frame_equal(old.frame, now.frame)


def test_load_active_passive_errors(tmp_path):
    g, h = make_pair(tmp_path)
    with pytest.raises(InputError, match=r"party 'passive1'.*passive_y\.csv.*label column 'y'"):
        load_active_passive(g, [write(tmp_path / "passive_y.csv", "id,y,h0\n1,0,1\n")])
    with pytest.raises(InputError, match=r"active_nolabel\.csv.*label column 'y' not found"):
        load_active_passive(write(tmp_path / "active_nolabel.csv", "id,g0\n1,2\n"), [h])
    with pytest.raises(InputError, match=r"party 'passive1'.*passive_nofeat\.csv.*no feature columns"):
        load_active_passive(g, [write(tmp_path / "passive_nofeat.csv", "id\n1\n")])
    with pytest.raises(InputError, match=r"missing\.csv.*party 'passive2'.*does not exist"):
        load_active_passive(g, [h, tmp_path / "missing.csv"])
    with pytest.raises(InputError, match=r"at least one passive party"):
        load_active_passive(g, [])


# --------------------------------------------------------------------------- breast cancer / vertical split


@pytest.mark.parametrize("n, sizes", [(2, [15, 15]), (3, [10, 10, 10]), (4, [8, 8, 7, 7])])
def test_breast_cancer_parties_shapes(n, sizes):
    parties = breast_cancer_parties(n)
    assert [p.name for p in parties] == ["active"] + [f"passive{i}" for i in range(1, n)]
    assert [len(p.feature_names) for p in parties] == sizes
    assert all(p.frame.shape[0] == 569 for p in parties)
    active = parties[0]
    assert active.label_col == "y" and all(p.label_col is None for p in parties[1:])
    assert active.frame["id"].tolist() == list(range(569))
    assert active.frame["id"].dtype == np.int64
    assert active.feature_names[0] == "mean_radius"
    assert all(" " not in c for p in parties for c in p.feature_names)
    assert check_binary_labels(active).sum() == 357
    for p in parties:
        validate_party_frame(p, require_features=True)


@pytest.mark.parametrize("bad", [1, 31, 0, "2", 2.0, True])
def test_breast_cancer_parties_bad_n(bad):
    with pytest.raises(InputError, match=r"n_parties"):
        breast_cancer_parties(bad)


def test_vertical_split():
    df = pd.DataFrame({"id": [1, 2], "y": [0, 1], "a": [1.0, 2.0], "b": [3, 4], "c": [5, 6]})
    parties = vertical_split(df, "id", "y", 2)
    assert [list(p.frame.columns) for p in parties] == [["id", "y", "a", "b"], ["id", "c"]]
    with pytest.raises(InputError, match=r"n_parties must be in 1\.\.3"):
        vertical_split(df, "id", "y", 4)
    with pytest.raises(InputError, match=r"label column 'z' not found"):
        vertical_split(df, "id", "z", 2)


# --------------------------------------------------------------------------- synthetic


def test_make_synthetic_shapes_and_determinism():
    a = make_synthetic(500, [3, 4, 2], seed=7)
    b = make_synthetic(500, [3, 4, 2], seed=7)
    c = make_synthetic(500, [3, 4, 2], seed=8)
    assert [p.name for p in a] == ["active", "passive1", "passive2"]
    assert [p.frame.shape for p in a] == [(500, 5), (500, 5), (500, 3)]
    assert a[0].label_col == "y" and a[1].label_col is None
    for x, y in zip(a, b):
        pd.testing.assert_frame_equal(x.frame, y.frame)
    assert not a[1].frame.equals(c[1].frame)
    labels = check_binary_labels(a[0])
    assert 0.2 < labels.mean() < 0.8
    assert a[1].frame[a[1].feature_names].dtypes.unique().tolist() == [np.float32]
    for p in a:
        validate_party_frame(p, require_features=True)


def test_make_synthetic_tasks_and_missing():
    reg = make_synthetic(300, [2, 2], task="regression", seed=1)[0]
    assert reg.frame["y"].dtype == np.float64 and reg.frame["y"].nunique() == 300
    multi = make_synthetic(3000, [2, 3], task="multiclass", seed=1)[0]
    assert sorted(multi.frame["y"].unique()) == [0, 1, 2]
    four = make_synthetic(3000, [2, 3], task="multiclass", n_classes=4)[0]
    assert sorted(four.frame["y"].unique()) == [0, 1, 2, 3]
    miss = make_synthetic(2000, [5, 5], missing_rate=0.25, seed=3)
    rate = miss[1].frame[miss[1].feature_names].isna().to_numpy().mean()
    assert 0.2 < rate < 0.3
    assert miss[0].frame["y"].notna().all() and miss[0].frame["id"].notna().all()


def test_make_synthetic_passives_carry_signal():
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    parties = make_synthetic(4000, [4, 4], seed=2)
    train, test = train_test_split_parties(parties, seed=0)

    def auc(cols_train, cols_test):
        model = LogisticRegression().fit(cols_train, train[0].frame["y"])
        return roc_auc_score(test[0].frame["y"], model.predict_proba(cols_test)[:, 1])

    g_tr, g_te = train[0].frame[train[0].feature_names], test[0].frame[test[0].feature_names]
    both_tr = pd.concat([g_tr, train[1].frame[train[1].feature_names]], axis=1)
    both_te = pd.concat([g_te, test[1].frame[test[1].feature_names]], axis=1)
    assert auc(both_tr, both_te) > auc(g_tr, g_te) + 0.05


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"n_samples": 0, "n_features_per_party": [2]}, r"n_samples"),
        ({"n_samples": 10, "n_features_per_party": []}, r"at least one party"),
        ({"n_samples": 10, "n_features_per_party": [2, 0]}, r"party 'passive1'"),
        ({"n_samples": 10, "n_features_per_party": [2], "task": "ranking"}, r"task must be one of"),
        ({"n_samples": 10, "n_features_per_party": [2], "missing_rate": 1.0}, r"missing_rate"),
        ({"n_samples": 10, "n_features_per_party": [2], "task": "multiclass", "n_classes": 1}, r"n_classes"),
    ],
)
def test_make_synthetic_bad_args(kwargs, pattern):
    with pytest.raises(InputError, match=pattern):
        make_synthetic(**kwargs)


# --------------------------------------------------------------------------- train/test split


def test_train_test_split_consistent():
    parties = make_synthetic(1000, [3, 3, 2], seed=4)
    # the second passive party misses some ids and has extra ones, in another order
    h = parties[2].frame
    h = pd.concat([h.iloc[::-1].iloc[10:], pd.DataFrame({"id": [5000, 5001], "passive2_x0": 0.0, "passive2_x1": 1.0})])
    parties[2] = PartyFrame("passive2", h.reset_index(drop=True), "id")
    train, test = train_test_split_parties(parties, test_size=0.25, seed=1)
    g_train, g_test = set(train[0].frame["id"]), set(test[0].frame["id"])
    assert len(g_test) == 250 and len(g_train) == 750 and not g_train & g_test
    assert set(train[1].frame["id"]) == g_train and set(test[1].frame["id"]) == g_test
    assert train[1].frame["id"].tolist() == train[0].frame["id"].tolist()
    # passive2: only ids the active party has, its own (reversed) order kept
    ids2 = train[2].frame["id"].tolist() + test[2].frame["id"].tolist()
    assert set(ids2) == set(range(1000)) - set(range(990, 1000))
    assert train[2].frame["id"].is_monotonic_decreasing
    assert [p.name for p in train] == ["active", "passive1", "passive2"]
    # stratified: class balance preserved
    y = parties[0].frame["y"].mean()
    assert abs(test[0].frame["y"].mean() - y) < 0.01
    # deterministic
    again, _ = train_test_split_parties(parties, test_size=0.25, seed=1)
    pd.testing.assert_frame_equal(again[2].frame, train[2].frame)


def test_train_test_split_regression_and_unstratified():
    parties = make_synthetic(200, [2, 2], task="regression", seed=0)
    train, test = train_test_split_parties(parties, test_size=0.3)
    assert len(test[0].frame) == 60 and len(train[1].frame) == 140
    train, test = train_test_split_parties(make_synthetic(200, [2, 2]), stratify=False)
    assert len(test[0].frame) == 40


@pytest.mark.parametrize("bad", [0, 1, 0.0, 1.0, -0.1, 1.5, float("nan"), "0.2", None])
def test_train_test_split_bad_test_size(bad):
    with pytest.raises(InputError, match=r"test_size"):
        train_test_split_parties(make_synthetic(20, [1, 1]), test_size=bad)


def test_train_test_split_errors():
    parties = make_synthetic(20, [1, 1])
    with pytest.raises(InputError, match=r"first party \('passive1'\) must be the active"):
        train_test_split_parties(parties[::-1])
    other = PartyFrame("passive1", parties[1].frame.assign(id="x" + parties[1].frame["id"].astype(str)), "id")
    with pytest.raises(InputError, match=r"party 'passive1' shares no ids with party 'active'"):
        train_test_split_parties([parties[0], other])


# --------------------------------------------------------------------------- libsvm parser


def test_parse_libsvm(tmp_path):
    path = write(tmp_path / "d.libsvm", "+1 1:1 3:0.5\n0 2:2\n-1\n\n")
    labels, x = parse_libsvm(path, 3)
    assert labels.tolist() == [1, 0, 0]
    assert x.dtype == np.float32
    assert x.tolist() == [[1.0, 0.0, 0.5], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("+1 4:1\n", r"line 1: feature index 4 outside 1\.\.3"),
        ("0 1:1\n2 1:1\n", r"line 2: label '2'"),
        ("0 1=1\n", r"line 1: bad token '1=1'"),
        ("0 2:1 2:1\n", r"line 1: feature index 2 repeated"),
        ("0 1:1\n\n0 2:1\n", r"line 2: blank line"),
        ("0 1:inf\n", r"line 1: feature 1 has value 'inf'"),
        ("", r"is empty"),
    ],
)
def test_parse_libsvm_errors(tmp_path, text, pattern):
    path = write(tmp_path / "bad.libsvm", text)
    with pytest.raises(InputError, match=r"bad\.libsvm.*" + pattern):
        parse_libsvm(path, 3)


# --------------------------------------------------------------------------- shared data


def test_shared_datasets_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("VFL_SHARED_DATASETS", str(tmp_path))
    assert shared_datasets_dir() == tmp_path.resolve()
    monkeypatch.setenv("VFL_SHARED_DATASETS", str(tmp_path / "absent"))
    assert shared_datasets_dir() is None
    with pytest.raises(InputError, match=r"shared datasets directory not found.*absent.*VFL_SHARED_DATASETS"):
        load_shared("breast")


def test_load_shared_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(InputError, match=r"unknown shared dataset 'iris'"):
        load_shared("iris", root=tmp_path)
    with pytest.raises(InputError, match=r"'breast'.*breast_hetero_guest\.csv.*missing"):
        load_shared("breast", root=tmp_path)
    with pytest.raises(InputError, match=r"a9a_vertical_test\.libsvm.*missing"):
        load_a9a("test", root=tmp_path)
    with pytest.raises(InputError, match=r"split must be 'train' or 'test'"):
        load_a9a("valid", root=tmp_path)


# name -> (rows, id, label, features per party)
SHARED_SHAPES = {
    "breast": (569, "id", "y", [10, 20]),
    "default_credit": (30000, "id", "y", [13, 10]),
    "give_credit": (30000, "id", "y", [4, 6]),
    "ionosphere": (351, "sid", "label", [15, 19]),
    "vehicle": (846, "id", "y", [9, 9]),
    "student": (395, "id", "y", [6, 7]),
    "dvisits": (5190, "id", "doctorco", [3, 9]),
    "motor": (800, "idx", "motor_speed", [4, 3, 4]),
}


@pytest.mark.parametrize("name", sorted(SHARED_SHAPES))
def test_load_shared_shapes(name):
    need_shared()
    rows, id_col, label_col, n_features = SHARED_SHAPES[name]
    parties = load_shared(name)
    assert [len(p.feature_names) for p in parties] == n_features
    assert all(len(p.frame) == rows for p in parties)
    assert all(p.id_col == id_col for p in parties)
    assert parties[0].label_col == label_col and parties[0].frame.columns[1] == label_col
    assert all(p.label_col is None for p in parties[1:])
    assert [p.name for p in parties] == ["active", "passive1", "passive2"][:len(parties)]
    ids = parties[0].frame[id_col].tolist()
    assert all(p.frame[id_col].tolist() == ids for p in parties[1:])
    if name == "breast":
        assert check_binary_labels(parties[0]).sum() == 357  # y=1 is benign, as in sklearn
    if name == "ionosphere":
        assert parties[0].frame["x2"].isna().all()
    if name == "give_credit":
        assert parties[0].feature_names == ["x0", "x1", "x2", "x3"]
        assert parties[1].feature_names == [f"x{i}" for i in range(4, 10)]


@pytest.mark.slow
def test_load_a9a_train():
    need_shared()
    active, passive = load_a9a("train")
    assert len(active.frame) == len(passive.frame) == 32561
    assert len(active.feature_names) + len(passive.feature_names) == 123
    assert active.feature_names == [f"f{i}" for i in range(1, 62)]
    assert passive.feature_names == [f"f{i}" for i in range(62, 124)]
    assert active.frame["id"].tolist() == list(range(32561))
    assert int(check_binary_labels(active).sum()) == 7841
    assert active.frame[active.feature_names].dtypes.unique().tolist() == [np.float32]
    # p1 is numbered locally from 1: its first row "2:1 7:1 10:1 32:1 39:1" is a9a features 63, 68, 71, 93, 100
    row0 = passive.frame.iloc[0]
    assert [c for c in passive.feature_names if row0[c] == 1.0] == ["f63", "f68", "f71", "f93", "f100"]


def test_load_a9a_test():
    need_shared()
    active, passive = load_a9a("test")
    assert len(active.frame) == len(passive.frame) == 16281
    assert len(active.feature_names) == 61 and len(passive.feature_names) == 62
    assert int(active.frame["y"].sum()) == 3846
    # first test line: "0 5:1 13:1 18:1 28:1 34:1 35:1 36:1 40:1 42:1 62:1 66:1 76:1 92:1 100:1"
    row0 = passive.frame.iloc[0]
    assert [c for c in passive.feature_names if row0[c] == 1.0] == ["f62", "f66", "f76", "f92", "f100"]


def test_join_parties_gives_the_centralised_view_in_active_order():
    from datasets import breast_cancer_parties, join_parties, sklearn_parties
    parts = breast_cancer_parties(3)
    shuffled = [parts[0]] + [PartyFrame(p.name, p.frame.sample(frac=1, random_state=0), p.id_col)
                             for p in parts[1:]]
    X, y, ids = join_parties(shuffled)
    assert X.shape == (569, 30) and np.array_equal(ids, parts[0].frame["id"].to_numpy())
    from sklearn.datasets import load_breast_cancer
    assert np.array_equal(X, load_breast_cancer().data) and np.array_equal(y, load_breast_cancer().target)
    wine = sklearn_parties("wine", 3)
    assert [len(p.feature_names) for p in wine] == [5, 4, 4]
    with pytest.raises(InputError, match="unknown scikit-learn dataset"):
        sklearn_parties("iris")


def test_bundled_sklearn_parties_check_their_column_names():
    from datasets import sklearn_parties
    with pytest.raises(InputError, match="must differ"):
        sklearn_parties("wine", id_col="y", label_col="y")
    with pytest.raises(InputError, match="clash with a feature name"):
        sklearn_parties("wine", id_col="f0")


def test_load_named_covers_bundled_and_shared_names():
    from datasets import load_named
    assert [p.name for p in load_named("breast_cancer", 3)] == ["active", "passive1", "passive2"]
    assert len(load_named("diabetes")[0].frame) == 442
    with pytest.raises(InputError):
        load_named("no_such_dataset")
