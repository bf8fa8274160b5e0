"""Command-line mistakes refused before anything is read, served or connected (click's CliRunner, in
process), and `vfl dp-ledger show`'s two views of a ledger."""
import json
import logging

import pytest
from click.testing import CliRunner

from cli import _echo_dp_model, main, parse_monotone
from parties.dp_ledger import PrivacyLedger
from vfl.core.errors import InputError


@pytest.fixture(autouse=True)
def _keep_logging():
    """The party commands set up the "vfl" logger: put it back as it was."""
    log = logging.getLogger("vfl")
    saved = log.handlers[:], log.level, log.propagate
    yield
    log.handlers[:], log.level, log.propagate = saved[0], saved[1], saved[2]


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _refused(result, message):
    assert result.exit_code != 0, result.output
    assert message in result.output, result.output


def test_dp_ledger_show(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger(path, party="telco")
    ledger.charge("ab" * 32, 0.5, "dp release", "m1")
    ledger.charge("ab" * 32, float("inf"), "training", "m2")
    res = _run("dp-ledger", "show", path)
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"dataset {'ab' * 8}: epsilon inf in 2 charge(s) (dp release 0.5, training inf)"
    res = _run("dp-ledger", "show", path, "--json")
    assert res.exit_code == 0 and json.loads(res.output) == ledger.read()
    path.write_text(json.dumps({"format": "vfl-dp-ledger", "version": 1, "datasets": {}}))
    assert _run("dp-ledger", "show", path).output.strip() == "no charges"


def test_certs_needs_parties(tmp_path):
    _refused(_run("certs", "--out", tmp_path / "c"), "give --federation FILE or at least one --party NAME")
    fed = tmp_path / "federation.toml"
    fed.write_text('[federation]\nactive = "bank"\n[parties.bank]\n[parties.telco]\naddress = "127.0.0.1:5"\n')
    _refused(_run("certs", "--out", tmp_path / "c", "--federation", fed, "--party", "shop"),
             "party 'shop' (--party) is not in the federation")
    assert not (tmp_path / "c").exists()


def test_passive_party_option_mistakes(tmp_path):
    base = ("party", "passive", "--name", "telco", "--data", tmp_path / "b.csv", "--model-dir", tmp_path / "m",
            "--insecure", "--listen", "127.0.0.1:0")
    _refused(_run(*base, "--dask-insecure"), "--dask-tls-dir, --dask-insecure and --dask-via-scheduler need "
                                             "--dask-scheduler")
    _refused(_run(*base, "--dask-scheduler", "local:2"), "--dask-scheduler takes a scheduler address; for a local "
                                                         "cluster use")
    assert not (tmp_path / "m").exists()


def test_active_party_option_mistakes(tmp_path):
    base = ("party", "active", "--name", "bank", "--data", tmp_path / "a.csv", "--model-dir", tmp_path / "m",
            "--insecure")
    _refused(_run(*base), "give --peer NAME=HOST:PORT (repeat for each passive party) or --federation FILE")
    _refused(_run(*base, "--peer", "telco=127.0.0.1:1", "--early-stopping-rounds", "3"),
             "--early-stopping-rounds needs --validation-data")
    assert not (tmp_path / "m").exists()


def test_simulate_needs_both_sides(tmp_path):
    (tmp_path / "a.csv").write_text("id,y,a\n1,0,1\n")
    _refused(_run("simulate", "--active", tmp_path / "a.csv"), "--active and at least one --passive are needed "
                                                               "together")


def test_monotone_columns_once_each():
    with pytest.raises(InputError, match="--monotone: column 'age' is given twice"):
        parse_monotone(["age=+1", "age=-1"])
    assert parse_monotone([]) is None


def test_the_non_private_released_model_says_so(capsys):
    _echo_dp_model({"dp_model": {"mechanism": "none"}})
    _echo_dp_model({})
    assert capsys.readouterr().out == "privacy (released model): epsilon inf, the non-private model\n"


def test_explain_passive_features_is_for_passive_servers(tmp_path):
    r = _run("explain", "--model-dir", tmp_path, "--party", f"a={tmp_path / 'a.csv'}", "--out", tmp_path / "x.csv",
            "--passive-features", "b")
    assert r.exit_code == 2 and "--passive-features is for passive servers (network)" in r.output
    assert not (tmp_path / "x.csv").exists()
