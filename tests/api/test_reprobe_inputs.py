"""Issue 36, the re-probe: the bad inputs refused at start-up with one clear error (items 2, 6, 7, 8,
9, 10 and 11; the in-process part, click's CliRunner). The network and Dask items are in
tests/network/test_reprobe_network.py."""
from __future__ import annotations

import errno
import json
import logging
import os

import pandas as pd
import pytest
from click.testing import CliRunner
from support import small_frames

import cli
from cli import main
from datasets import files as data_files
from datasets.csv_tables import read_party_csv
from datasets.errors import InputError, ProtocolError
from parties.dp_ledger import PrivacyLedger
from parties.federation import load_federation
from parties.network import passive_access
from protocols.grpc_security import Security
from vfl.core.model import BoostedModel

pytest.importorskip("cryptography")

FED = """[federation]
active = "bank"
[parties.bank]
[parties.telco]
address = "127.0.0.1:5"
predict = ["bank", "scorer"]
[parties.scorer]
"""


@pytest.fixture(autouse=True)
def _keep_logging():
    log = logging.getLogger("vfl")
    saved = log.handlers[:], log.level, log.propagate
    yield
    log.handlers[:], log.level, log.propagate = saved


@pytest.fixture
def served(monkeypatch):
    """`vfl party passive` up to serving: the policy it would serve with, or nothing (refused first)."""
    got = []
    monkeypatch.setattr(cli, "serve_passive", lambda *a, **kw: got.append(kw["policy"]))
    return got


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_error(result, *parts):
    """Exit code 1 and one `Error:` line holding every part; no traceback."""
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and all(p in errors[0] for p in parts), result.output
    assert "Traceback" not in result.output
    return errors[0]


def _passive(tmp_path, *extra):
    a, b, _ = small_frames(n=40)
    b.to_csv(tmp_path / "b.csv", index=False)
    return _run("party", "passive", "--name", "telco", "--data", tmp_path / "b.csv", "--model-dir", tmp_path / "m",
                "--insecure", "--listen", "127.0.0.1:0", *extra)


# -- item 2: a zero limit is the tightest limit, never none -------------------------------------------
def test_item2_zero_limits_are_kept(tmp_path, served):
    r = _passive(tmp_path, "--dp-max-epsilon-per-feature", "0", "--dp-ledger", tmp_path / "l.json",
                 "--dp-lifetime-epsilon", "0")
    assert r.exit_code == 0, r.output
    assert served[0]["dp_max_epsilon_per_feature"] == 0.0 and served[0]["dp_lifetime_epsilon"] == 0.0
    book = PrivacyLedger(tmp_path / "l.json", 0.0, "telco")
    with pytest.raises(ProtocolError, match="refuses dp release at epsilon 1: its dataset has spent epsilon 0 of "
                                            "its lifetime budget 0"):
        book.charge("ab" * 32, 1.0, "dp release", "m1")
    assert not (tmp_path / "l.json").exists()


# -- item 6: every limit and the ledger checked before listening --------------------------------------
@pytest.mark.parametrize("option, value, message", [
    ("--dp-lifetime-epsilon", "-1", "--dp-lifetime-epsilon must be a number >= 0"),
    ("--dp-lifetime-epsilon", "nan", "--dp-lifetime-epsilon must be a number >= 0"),
    ("--dp-max-epsilon-per-feature", "-0.5", "--dp-max-epsilon-per-feature must be a number >= 0"),
    ("--dp-max-epsilon-per-feature", "nan", "--dp-max-epsilon-per-feature must be a number >= 0"),
])
def test_item6_bad_limits_refused_at_start(tmp_path, served, option, value, message):
    _one_error(_passive(tmp_path, "--dp-ledger", tmp_path / "l.json", option, value), message)
    assert served == []


def test_item6_bad_ledgers_refused_at_start(tmp_path, served, monkeypatch):
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not a ledger")
    _one_error(_passive(tmp_path, "--dp-ledger", garbage), "DP ledger", "garbage.json", "cannot be read")
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as fh:            # 2 GB, sparse: refused from its size, never read
        fh.truncate(2 * 2 ** 30)
    _one_error(_passive(tmp_path, "--dp-ledger", huge), "--dp-ledger", "huge.json", "2147483648 bytes")
    real_open = os.open

    def read_only(path, flags, mode=0o777, **kw):       # root ignores chmod: the OS's answer simulated
        if flags & os.O_CREAT and "ro" in os.fspath(path):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, mode, **kw)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(data_files.os, "open", read_only)
    _one_error(_passive(tmp_path, "--dp-ledger", tmp_path / "ro" / "l.json"), "ro/l.json", "not writable",
               "read-only")
    assert served == []


# -- item 7: messages that name the real cause --------------------------------------------------------
def test_item7_garbage_ca_and_a_mismatched_key_are_named(tmp_path):
    assert _run("certs", "--out", tmp_path / "c", "--party", "telco", "--party", "bank").exit_code == 0
    a, b, _ = small_frames(n=40)
    b.to_csv(tmp_path / "b.csv", index=False)
    base = ("party", "passive", "--name", "telco", "--data", tmp_path / "b.csv", "--model-dir", tmp_path / "m",
            "--listen", "127.0.0.1:0", "--allow-client", "bank", "--tls-dir", tmp_path / "c")
    key = (tmp_path / "c" / "telco.key").read_bytes()
    (tmp_path / "c" / "telco.key").write_bytes((tmp_path / "c" / "bank.key").read_bytes())
    err = _one_error(_run(*base), "telco.key is not the key of the certificate", "telco.pem")
    assert "cannot listen" not in err
    (tmp_path / "c" / "telco.key").write_bytes(key)
    (tmp_path / "c" / "ca.pem").write_text("garbage\n")
    err = _one_error(_run(*base), "ca.pem is not a PEM CA certificate")
    assert "cannot listen" not in err
    assert _run("certs", "--out", tmp_path / "other", "--party", "telco").exit_code == 0
    (tmp_path / "c" / "ca.pem").write_bytes((tmp_path / "other" / "ca.pem").read_bytes())
    _one_error(_run(*base), "telco.pem was not issued by the CA in", "ca.pem")


def test_item7_read_only_dp_ledger_dir_of_simulate(tmp_path, monkeypatch):
    real_mkdir = os.mkdir

    def ro_mkdir(path, mode=0o777, **kw):
        if "ledgers" in os.fspath(path):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_mkdir(path, mode, **kw)

    monkeypatch.setattr(os, "mkdir", ro_mkdir)
    r = _run("simulate", "--mode", "dp", "--epsilon", "1", "--rounds", "1", "--depth", "2", "--quiet", "--jobs", "1",
             "--dp-ledger-dir", tmp_path / "ledgers")
    err = _one_error(r, "--dp-ledger-dir", "ledgers", "read-only")
    assert "[Errno" not in err


def test_item7_a_byte_order_mark_in_the_federation_file(tmp_path):
    p = tmp_path / "federation.toml"
    p.write_bytes(b"\xef\xbb\xbf" + FED.encode())
    assert load_federation(p).active == "bank"


# -- item 8: no traceback ------------------------------------------------------------------------------
def test_item8_a_non_utf8_token_file(tmp_path):
    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe" + b"x" * 30)
    _one_error(_run("party", "active", "--data", tmp_path / "a.csv", "--model-dir", tmp_path / "m", "--peer",
                    "telco=127.0.0.1:1", "--insecure", "--token-file", token), "token file", "not UTF-8")


def test_item8_certs_days_out_of_range(tmp_path):
    _one_error(_run("certs", "--out", tmp_path / "c", "--party", "bank", "--days", "1000000000"),
               "--days must be at least 1 and at most 36500")
    assert not (tmp_path / "c").exists()


def test_item8_and_10_ledger_entries_with_a_list_kind_or_nan(tmp_path):
    for entry, message in (({"kind": ["x"], "epsilon": 1.0}, "kind must be a string"),
                           ({"kind": "dp release", "epsilon": float("nan")}, "epsilon must be a number >= 0")):
        p = tmp_path / "l.json"
        p.write_text(json.dumps({"format": "vfl-dp-ledger", "version": 1, "datasets": {"ab": [entry]}}))
        for extra in ((), ("--json",)):
            _one_error(_run("dp-ledger", "show", p, *extra), "l.json", message)


# -- item 9: the federation file (the parser; the processes are in the network tests) ------------------
def test_item9_an_address_of_the_active_party_and_a_predict_only_party(tmp_path, served):
    p = tmp_path / "federation.toml"
    p.write_text(FED.replace("[parties.bank]\n", '[parties.bank]\naddress = "127.0.0.1:6"\n'))
    with pytest.raises(InputError, match=r"\[parties.bank\] address: the active party serves nothing"):
        load_federation(p)
    p.write_text(FED)
    fed = load_federation(p)
    assert fed.passives == {"telco": "127.0.0.1:5"}           # scorer only predicts: never trained with
    assert _passive(tmp_path, "--federation", p).exit_code == 0 and len(served) == 1     # telco serves
    with pytest.raises(InputError, match="party 'scorer' has no address: it only predicts"):
        passive_access("scorer", Security(), fed)


# -- item 10: a model file without its content hash ----------------------------------------------------
def test_item10_a_model_file_whose_hash_was_deleted(tmp_path):
    a, b, _ = small_frames(n=60)
    a.to_csv(tmp_path / "a.csv", index=False)
    b.to_csv(tmp_path / "b.csv", index=False)
    r = _run("simulate", "--active", tmp_path / "a.csv", "--passive", tmp_path / "b.csv", "--mode", "plain",
             "--rounds", "1", "--depth", "2", "--quiet", "--jobs", "1", "--save-model", tmp_path / "s")
    assert r.exit_code == 0, r.output
    path = next(f for f in (tmp_path / "s").glob("*.json") if json.loads(f.read_text()).get("role") == "active")
    assert BoostedModel.load(path)
    doc = json.loads(path.read_text())
    doc.pop("content_hash")
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="records no content_hash: an edit of it could go unnoticed"):
        BoostedModel.load(path)


# -- item 11: a 2 GB sparse input refused from its first bytes ------------------------------------------
def test_item11_a_sparse_2gb_input_is_refused_unread(tmp_path):
    p = tmp_path / "big.csv"
    with open(p, "wb") as fh:
        fh.truncate(2 * 2 ** 30)
    _one_error(_run("simulate", "--active", p, "--passive", p, "--quiet"), "big.csv", "not a CSV text file",
               "NUL byte at line 1, byte offset 0")
    p.write_bytes(b"id,x\n1,2\n3\x00,4\n")
    with pytest.raises(InputError, match=r"NUL byte at line 3, byte offset 10"):
        read_party_csv(p, "telco", "id")


# -- item 1: simulation tests the rows every party holds ------------------------------------------------
@pytest.mark.parametrize("extra", [(), ("--align", "psi"), ("--mode", "plain")])
def test_item1_simulate_with_a_partial_overlap(tmp_path, extra):
    a, b, c = small_frames(n=120)
    a.to_csv(tmp_path / "a.csv", index=False)
    b[b["id"] >= 10].to_csv(tmp_path / "b.csv", index=False)           # 10 of the active party's ids missing
    c[c["id"] < 115].to_csv(tmp_path / "c.csv", index=False)            # 5 others missing
    out = tmp_path / "p.csv"
    r = _run("simulate", "--active", tmp_path / "a.csv", "--passive", tmp_path / "b.csv", "--passive",
             tmp_path / "c.csv", "--rounds", "2", "--depth", "2", "--key-bits", "1024", "--quiet", "--jobs", "1",
             "--predictions", out, *extra)
    assert r.exit_code == 0, r.output
    ids = set(pd.read_csv(out)["id"].tolist())
    assert ids and ids <= set(range(10, 115))
    n_test = int(next(ln for ln in r.output.splitlines() if ln.startswith("train:")).rsplit(" ", 2)[1])
    assert n_test == len(ids)


def test_item1_a_nul_byte_in_an_id_is_named(tmp_path):
    a, b, _ = small_frames(n=60)
    a.to_csv(tmp_path / "a.csv", index=False)
    text = b.to_csv(index=False).replace("\n7,", "\n7\x00,", 1)
    (tmp_path / "b.csv").write_text(text)
    _one_error(_run("simulate", "--active", tmp_path / "a.csv", "--passive", tmp_path / "b.csv", "--quiet"),
               "b.csv", "NUL byte at line 9")
