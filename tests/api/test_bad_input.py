"""Every bad input of the core issue gives a clear error naming the party, file or column."""
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from support import small_frames

from cli import main
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core.binning import Binner
from vfl.core.errors import InputError


def _cli_error(args):
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res.output


def _write(tmp_path, name, df):
    p = tmp_path / name
    df.to_csv(p, index=False)
    return str(p)


@pytest.fixture
def files(tmp_path):
    a, b, _ = small_frames(40)
    return tmp_path, a, b


def test_missing_id_column(files):
    tmp, a, b = files
    out = _cli_error(["simulate", "--active", _write(tmp, "g.csv", a), "--passive",
                      _write(tmp, "h.csv", b.rename(columns={"id": "key"})), "--mode", "plain"])
    assert "id column 'id' not found" in out and "h.csv" in out
    with pytest.raises(InputError, match="party 'telco'.*id column 'id' not found"):
        PassiveParty("telco", b.rename(columns={"id": "key"}))


def test_missing_label_column(files):
    tmp, a, b = files
    out = _cli_error(["simulate", "--active", _write(tmp, "g.csv", a.drop(columns="y")),
                      "--passive", _write(tmp, "h.csv", b), "--mode", "plain"])
    assert "label column 'y' not found" in out and "g.csv" in out
    with pytest.raises(InputError, match="party 'bank'.*label column 'y' not found"):
        ActiveParty("bank", a.drop(columns="y"))


def test_non_numeric_feature_column(files):
    tmp, a, b = files
    b = b.astype({"b1": object})
    b.loc[3, "b1"] = "n/a?"
    out = _cli_error(["simulate", "--active", _write(tmp, "g.csv", a), "--passive", _write(tmp, "h.csv", b),
                      "--mode", "plain"])
    assert "feature column 'b1' is not numeric" in out and "h.csv" in out
    with pytest.raises(InputError, match="party 'telco'.*feature column 'b1' is not numeric"):
        PassiveParty("telco", b)


def test_labels_other_than_zero_and_one(files):
    _, a, b = files
    a = a.copy()
    a.loc[0, "y"] = 2
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    with pytest.raises(InputError, match="label column 'y' of party 'bank' must hold only 0 and 1.*2"):
        fed.fit(mode="plain", n_estimators=1)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_labels(files, bad):
    _, a, b = files
    a = a.astype({"y": float})
    a.loc[5, "y"] = bad
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    with pytest.raises(InputError, match="label column 'y' of party 'bank' has 1 NaN/inf"):
        fed.fit(mode="plain", n_estimators=1)


def test_duplicate_ids(files):
    tmp, a, b = files
    dup = pd.concat([b, b.iloc[:2]])
    out = _cli_error(["simulate", "--active", _write(tmp, "g.csv", a), "--passive", _write(tmp, "h.csv", dup),
                      "--mode", "plain"])
    assert "duplicated ids" in out and "h.csv" in out
    with pytest.raises(InputError, match="party 'telco'.*duplicated ids"):
        PassiveParty("telco", dup)


def test_no_common_ids(files):
    _, a, b = files
    b = b.assign(id=b["id"] + 10_000)
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    with pytest.raises(InputError, match="no sample id in common"):
        fed.fit(mode="plain", n_estimators=1)


def test_party_without_feature_columns(files):
    _, a, b = files
    with pytest.raises(InputError, match="party 'telco'.*no feature columns"):
        PassiveParty("telco", b[["id"]])
    with pytest.raises(InputError, match="party 'bank' has no feature columns and there is no passive"):
        Federation(ActiveParty("bank", a[["id", "y"]]), []).fit(mode="plain")
    # an active party without features is fine when passive parties bring some
    Federation(ActiveParty("bank", a[["id", "y"]]), [PassiveParty("telco", b)]).fit(
        mode="plain", n_estimators=1)


def test_key_size_below_1024(files):
    out = _cli_error(["simulate", "--key-bits", "512"])
    assert "key size 512 bits is refused" in out
    _, a, b = files
    fed = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    with pytest.raises(InputError, match="at least 1024"):
        fed.fit(mode="he", key_bits=768, n_estimators=1)


@pytest.mark.parametrize("max_bin", [1, 257])
def test_max_bin_out_of_range(max_bin):
    out = _cli_error(["simulate", "--mode", "plain", "--max-bin", str(max_bin)])
    assert f"max_bin must be <= 256, got {max_bin}" in out or f"max_bin must be >= 2, got {max_bin}" in out
    with pytest.raises(InputError, match="max_bin"):
        Binner(max_bin)


def test_depth_below_one():
    out = _cli_error(["simulate", "--mode", "plain", "--depth", "0"])
    assert "max_depth must be >= 1, got 0" in out
    with pytest.raises(InputError, match="max_depth"):
        TrainParams(max_depth=0)


def test_unreadable_file(tmp_path):
    missing = tmp_path / "nope.csv"
    out = _cli_error(["simulate", "--active", str(missing), "--passive", str(missing), "--mode", "plain"])
    assert "nope.csv" in out
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00\x00garbage\x00")
    out = _cli_error(["simulate", "--active", str(binary), "--passive", str(binary), "--mode", "plain"])
    assert "bin.csv" in out


def test_party_names_must_be_unique(files):
    _, a, b = files
    with pytest.raises(InputError, match="unique"):
        Federation(ActiveParty("x", a), [PassiveParty("x", b)])


def test_params_take_the_vocabulary_and_store_plain_strings():
    import json

    from vfl.core.params import Alignment, Mode, Objective

    p = TrainParams(mode=Mode.DP, epsilon=1, objective=Objective.REGRESSION, align=Alignment.PSI)
    assert [type(v) for v in (p.mode, p.objective, p.align)] == [str, str, str]
    assert json.dumps(p.to_dict()) == json.dumps(TrainParams(mode="dp", epsilon=1, objective="regression",
                                                             align="psi").to_dict())
    for field, bad in (("mode", "fhe"), ("objective", "poisson"), ("align", "bloom")):
        with pytest.raises(InputError, match=f"parameter {field} must be one of"):
            TrainParams(**{field: bad})
    assert TrainParams.default("max_depth") == TrainParams().max_depth
    with pytest.raises(KeyError):
        TrainParams.default("depth")
