"""Bad input files in process, each error naming the file, the line or the column: LIBSVM lines,
CSV rows the pandas parser would choke on, the id rule's refusals, the split's argument checks, and
the shared catalogue's layouts (built in tmp_path, so these run without ../shared/datasets)."""
import numpy as np
import pandas as pd
import pytest

from datasets.catalogue import load_a9a, load_shared
from datasets.csv_tables import read_party_csv
from datasets.frames import PartyFrame
from datasets.ids import canonical_id, normalize_ids
from datasets.libsvm import parse_libsvm
from datasets.split import train_test_split_parties, vertical_split
from vfl.core.errors import InputError


# --------------------------------------------------------------------------- LIBSVM
def _libsvm(tmp_path, text, name="f.libsvm"):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def test_libsvm_labels_and_sparse_entries(tmp_path):
    labels, x = parse_libsvm(_libsvm(tmp_path, "+1 1:0.5 3:2\n-1\n1.0 2:-1\n0 1:1 2:1 3:1\n-1.0 3:4\n\n\n"), 3)
    assert labels.tolist() == [1, 0, 1, 0, 0]
    assert x.dtype == np.float32 and x.tolist() == [[0.5, 0, 2], [0, 0, 0], [0, -1, 0], [1, 1, 1], [0, 0, 4]]


@pytest.mark.parametrize("text, message", [
    ("1 1:1\n\n0 2:1\n", "line 2: blank line"),
    ("2 1:1\n", r"line 1: label '2' is not one of 0, \+1, -1"),
    ("yes 1:1\n", r"line 1: label 'yes' is not one of"),
    ("1 1:1\n0 2=1\n", r"line 2: bad token '2=1' \(expected index:value\)"),
    ("1 a:1\n", r"line 1: bad token 'a:1'"),
    ("1 1:x\n", r"line 1: bad token '1:x'"),
    ("1 4:1\n", r"line 1: feature index 4 outside 1..3"),
    ("1 0:1\n", r"line 1: feature index 0 outside 1..3"),
    ("1 2:1 2:5\n", r"line 1: feature index 2 repeated"),
    ("1 2:1 1:1 2:5\n", r"line 1: feature index 2 repeated"),         # a repeat after a smaller index (was kept)
    ("1 1:nan\n", r"line 1: feature 1 has value 'nan'"),
    ("0 2:inf\n", r"line 1: feature 2 has value 'inf'"),
    ("  \n\n", "is empty"),
])
def test_libsvm_errors_name_the_file_and_line(tmp_path, text, message):
    p = _libsvm(tmp_path, text)
    with pytest.raises(InputError, match=f"LIBSVM file '{p}'.*{message}"):
        parse_libsvm(p, 3)


def test_libsvm_unreadable_files(tmp_path):
    with pytest.raises(InputError, match="LIBSVM file .*missing.libsvm' does not exist"):
        parse_libsvm(tmp_path / "missing.libsvm", 3)
    with pytest.raises(InputError, match="is not ASCII text"):
        parse_libsvm(_libsvm(tmp_path, "1 1:1\n0 2:\xe9\n".encode("latin-1")), 3)
    with pytest.raises(InputError, match=f"cannot read LIBSVM file '{tmp_path}'"):
        parse_libsvm(tmp_path, 3)           # a directory


# --------------------------------------------------------------------------- CSV
def test_csv_rows_the_parser_cannot_read_are_named(tmp_path):
    cases = {
        "quote.csv": (b'id,y,a\n1,0,"abc\n2,1,3\n', r"cannot parse CSV file '{}' \(party 'bank'\): EOF inside string"),
        "long.csv": (b"id,y,a\n1,0," + b"9" * 140_000 + b"\n", r"cannot parse CSV file '{}' \(party 'bank'\): field "
                                                                r"larger than field limit"),
        "header.csv": (b"id,y," + b"a" * 140_000 + b"\n1,0,1\n", r"cannot read '{}' \(party 'bank'\): bad CSV header"),
        "late.csv": (b"id,y,a\n" + b"1,0,2\n" * 3000 + b"2,1,\xff\n", r"cannot read '{}' \(party 'bank'\): not UTF-8 "
                                                                      r"text"),
        "early.csv": (b"id,y,\xff\n1,0,2\n", r"cannot read '{}' \(party 'bank'\): not UTF-8 text"),
    }
    for name, (data, message) in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(InputError, match=message.format(p)):
            read_party_csv(p, "bank", "id", "y")


# --------------------------------------------------------------------------- ids
def test_the_id_rule_refuses_booleans_and_non_finite_ids():
    with pytest.raises(InputError, match="ids must be integers or strings, got the boolean True"):
        canonical_id(True)
    with pytest.raises(InputError, match="ids must be integers or strings, got the boolean"):
        canonical_id(np.bool_(False))
    for bad in (float("nan"), np.float32("inf")):
        with pytest.raises(InputError, match="ids must not be NaN or infinite"):
            canonical_id(bad)
    with pytest.raises(InputError, match="ids must not be NaN or infinite"):
        normalize_ids(np.array([1.0, np.nan]))


def test_the_id_rule_on_floats_bytes_and_arrays():
    assert canonical_id(133.0) == "133" and canonical_id(np.float64(-0.0)) == "0"
    assert canonical_id(133.5) == "133.5" and canonical_id(b" 007 ") == "007" and canonical_id(b"12.00") == "12"
    assert normalize_ids(np.array([3.0, -4.0])) == ["3", "-4"]
    assert normalize_ids(np.array([2.5, 3.0])) == ["2.5", "3"]
    assert normalize_ids(np.array([7, 8], dtype=np.uint16)) == ["7", "8"]
    assert normalize_ids(pd.Series(["1.0", " x "])) == ["1", "x"]


# --------------------------------------------------------------------------- split
def _joined(n=12, labels=None):
    return pd.DataFrame({"id": np.arange(n), "y": labels if labels is not None else np.arange(n) % 2,
                         "a": np.arange(n, dtype=float), "b": np.arange(n, dtype=float) * 2})


def test_vertical_split_checks_its_arguments():
    with pytest.raises(InputError, match="vertical_split expects a pandas DataFrame, got dict"):
        vertical_split({"id": [1]}, "id", "y", 2)
    with pytest.raises(InputError, match=r"vertical_split: need 2 distinct party names, got \['bank', 'bank'\]"):
        vertical_split(_joined(), "id", "y", 2, ["bank", "bank"])
    with pytest.raises(InputError, match=r"need 2 distinct party names, got \['bank'\]"):
        vertical_split(_joined(), "id", "y", 2, ["bank"])
    bank, telco = vertical_split(_joined(), "id", "y", 2, ["bank", "telco"])
    assert (bank.name, bank.label_col, bank.feature_names) == ("bank", "y", ["a"])
    assert (telco.name, telco.label_col, telco.feature_names) == ("telco", None, ["b"])


def _parties(df):
    return vertical_split(df, "id", "y", 2, ["bank", "telco"])


def test_train_test_split_checks_its_arguments():
    parties = _parties(_joined())
    with pytest.raises(InputError, match="needs a non-empty list of PartyFrame"):
        train_test_split_parties([])
    with pytest.raises(InputError, match="expects PartyFrame objects, got DataFrame"):
        train_test_split_parties([parties[0], _joined()])
    with pytest.raises(InputError, match=r"the first party \('telco'\) must be"):
        train_test_split_parties([parties[1], parties[0]])
    no_id = PartyFrame("telco", parties[1].frame.rename(columns={"id": "key"}), "id", None)
    with pytest.raises(InputError, match="telco.*id column 'id' not found"):
        train_test_split_parties([parties[0], no_id])
    no_label = PartyFrame("bank", parties[0].frame.drop(columns="y"), "id", "y")
    with pytest.raises(InputError, match="bank.*label column 'y' not found"):
        train_test_split_parties([no_label, parties[1]])
    tiny = _parties(_joined(2))
    with pytest.raises(InputError, match=r"cannot split 2 rows with test_size=0.9 \(train and test must both be"):
        train_test_split_parties(tiny, test_size=0.9)


@pytest.mark.parametrize("labels, stratified", [
    (np.array([True, False] * 10), True),                           # bool labels are classes
    (np.array([0.0, 1.0] * 9 + [np.nan, 1.0]), False),              # a missing label: not classes
    (np.array([0] * 19 + [1]), False),                              # a class of one row: no stratification
    (np.array([0.5, 1.5] * 10), False),                             # not integers
])
def test_stratification_only_where_it_is_possible(labels, stratified):
    df = _joined(20, labels)
    train, test = train_test_split_parties(_parties(df), test_size=0.5, seed=3)
    assert len(test[0].frame) == 10 and len(train[0].frame) == 10
    assert sorted(train[1].frame["id"].tolist() + test[1].frame["id"].tolist()) == list(range(20))
    assert test[1].frame["id"].tolist() == test[0].frame["id"].tolist()
    if stratified:
        assert test[0].frame["y"].sum() == 5


def test_stratification_keeps_a_row_of_every_class_on_both_sides():
    """The clip to at least one row per class and side moves the total off the asked size; the
    repair takes rows back from (or gives rows to) the largest class."""
    labels = np.array([c for c in range(8) for _ in range(2)] + [8] * 14)     # 8 classes of 2, one of 14
    train, test = train_test_split_parties(_parties(_joined(30, labels)), test_size=0.3, seed=1)
    assert len(test[0].frame) == 9 and sorted(test[0].frame["y"]) == list(range(9))
    assert set(train[0].frame["y"]) == set(range(9))
    big = np.array([0] * 2 + [1] * 2 + [2] * 26)
    train, test = train_test_split_parties(_parties(_joined(30, big)), test_size=0.9, seed=0)
    assert len(test[0].frame) == 27
    for side in (train, test):
        assert set(side[0].frame["y"]) == {0, 1, 2}


# --------------------------------------------------------------------------- the shared catalogue
def _csv(path, frame):
    frame.to_csv(path, index=False)
    return path


def test_shared_catalogue_errors_name_the_dataset_and_file(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="unknown shared dataset 'iris'; choose one of a9a, breast"):
        load_shared("iris", tmp_path)
    with pytest.raises(InputError, match=f"shared datasets directory '{tmp_path / 'none'}' does not exist"):
        load_shared("breast", tmp_path / "none")
    with pytest.raises(InputError, match=f"shared dataset 'breast': file '{tmp_path / 'breast_hetero_guest.csv'}' "
                                         "is missing"):
        load_shared("breast", tmp_path)
    monkeypatch.setenv("VFL_SHARED_DATASETS", str(tmp_path / "elsewhere"))
    with pytest.raises(InputError, match=r"shared datasets directory not found: '.*elsewhere' \(set "
                                         r"VFL_SHARED_DATASETS"):
        load_shared("breast")
    with pytest.raises(InputError, match="a9a split must be 'train' or 'test', got 'valid'"):
        load_a9a("valid", tmp_path)


def test_a_shared_pair_of_files_loads_with_its_columns(tmp_path):
    _csv(tmp_path / "dvisits_hetero_guest.csv", pd.DataFrame({"id": [1, 2, 3], "doctorco": [0, 2, 1],
                                                              "age": [0.1, 0.2, 0.3]}))
    _csv(tmp_path / "dvisits_hetero_host.csv", pd.DataFrame({"id": [3, 1, 2], "income": [1.0, 2.0, 3.0]}))
    active, passive = load_shared("dvisits", tmp_path)
    assert (active.id_col, active.label_col, active.feature_names) == ("id", "doctorco", ["age"])
    assert (passive.label_col, passive.feature_names) == (None, ["income"])


def test_give_credit_is_cut_between_two_parties(tmp_path):
    frame = pd.DataFrame({"id": [1, 2, 3], "y": [0, 1, 0], **{f"x{i}": [float(i)] * 3 for i in range(10)}})
    _csv(tmp_path / "give_credit_homo_test.csv", frame)
    active, passive = load_shared("give_credit", tmp_path)
    assert active.label_col == "y" and active.feature_names == ["x0", "x1", "x2", "x3"]
    assert passive.feature_names == [f"x{i}" for i in range(4, 10)] and passive.label_col is None
    _csv(tmp_path / "give_credit_homo_test.csv", frame.rename(columns={"x9": "x10"}))
    with pytest.raises(InputError, match=r"expected feature columns x0..x9; missing \['x9'\], unexpected \['x10'\]"):
        load_shared("give_credit", tmp_path)


def _a9a_dir(tmp_path, p0, p1, test=None):
    d = tmp_path / "a9a"
    d.mkdir(exist_ok=True)
    (d / "a9a_vertical_p0.libsvm").write_text(p0)
    (d / "a9a_vertical_p1.libsvm").write_text(p1)
    if test is not None:
        (d / "a9a_vertical_test.libsvm").write_text(test)
    return d


def test_a9a_train_and_test_layouts(tmp_path):
    _a9a_dir(tmp_path, "+1 1:1 61:1\n0 2:1\n", "+1 1:1\n0 62:1\n", "0 1:1 62:1 123:1\n")
    active, passive = load_shared("a9a", tmp_path)
    assert active.frame["y"].tolist() == [1, 0] and active.frame["id"].tolist() == [0, 1]
    assert active.feature_names[0] == "f1" and active.feature_names[-1] == "f61"
    assert passive.feature_names[0] == "f62" and passive.feature_names[-1] == "f123"
    assert passive.frame["f62"].tolist() == [1.0, 0.0] and passive.frame["f123"].tolist() == [0.0, 1.0]
    active, passive = load_a9a("test", tmp_path)
    assert active.frame["f1"].tolist() == [1.0] and passive.frame["f62"].tolist() == [1.0]
    assert passive.frame["f123"].tolist() == [1.0] and active.frame["y"].tolist() == [0]


def test_a9a_parts_must_agree(tmp_path):
    d = _a9a_dir(tmp_path, "+1 1:1\n0 2:1\n", "+1 1:1\n")
    with pytest.raises(InputError, match=f"a9a: '{d / 'a9a_vertical_p0.libsvm'}' has 2 rows but .* has 1"):
        load_a9a("train", tmp_path)
    _a9a_dir(tmp_path, "+1 1:1\n0 2:1\n0 2:1\n", "+1 1:1\n+1 2:1\n-1 1:1\n")
    with pytest.raises(InputError, match=r"the labels of .* differ on 1 rows \(lines 2\)"):
        load_a9a("train", tmp_path)
    with pytest.raises(InputError, match="shared dataset 'a9a': file .*a9a_vertical_test.libsvm' is missing"):
        load_a9a("test", tmp_path)
