"""The federation file (issue 22, Build 1): parsed with tomllib, every mistake named by file, table
and key; certificates that carry only a party's own names; deny by default."""
import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parties.federation import (
    DEFAULT_MIN_NODE_ROWS,
    Access,
    FederationError,
    load_federation,
    parse_federation,
)
from vfl.core.errors import InputError, ProtocolError

GOOD = """
[federation]
active = "bank"
min_node_rows = 20

[parties.bank]
hosts = ["bank.internal"]

[parties.telco]
address = "10.0.0.7:50051"
hosts = ["10.0.0.7", "telco.internal"]

[parties.insurer]
address = "insurer.internal:50052"
predict = ["bank", "telco"]
"""


def _write(tmp_path, text):
    p = tmp_path / "federation.toml"
    p.write_text(text)
    return p


def test_a_good_file(tmp_path):
    fed = load_federation(_write(tmp_path, GOOD))
    assert fed.active == "bank" and fed.min_node_rows == 20
    assert fed.passives == {"telco": "10.0.0.7:50051", "insurer": "insurer.internal:50052"}
    assert fed.trainers("telco") == ("bank",) and fed.predictors("telco") is None
    assert fed.predictors("insurer") == ("bank", "telco")
    assert fed.party_of({"telco", "10.0.0.7"}) == "telco"
    assert fed.party_of({"telco", "bank"}) is None            # valid for another party's name: nobody
    assert fed.party_of({"telco", "elsewhere"}) is None       # a name outside the party's own
    assert load_federation(_write(tmp_path, GOOD.replace("min_node_rows = 20\n", ""))).min_node_rows == \
        DEFAULT_MIN_NODE_ROWS


@pytest.mark.parametrize("edit, where", [
    (lambda t: t.replace('active = "bank"', 'active = "nobody"'), r"\[federation\] active"),
    (lambda t: t.replace("min_node_rows = 20", "min_node_rows = 0"), r"\[federation\] min_node_rows"),
    (lambda t: t.replace("min_node_rows = 20", "min_node_rows = true"), r"\[federation\] min_node_rows"),
    (lambda t: t.replace("min_node_rows = 20", "min_rows = 2"), r"\[federation\] min_rows: unknown key"),
    (lambda t: t.replace('address = "10.0.0.7:50051"\n', "").replace('"bank", "telco"', '"bank"'),
     r"\[parties.telco\] address: missing"),
    (lambda t: t.replace('hosts = ["bank.internal"]', 'address = "10.0.0.1:5"'),
     r"\[parties.bank\] address: the active party serves nothing"),
    (lambda t: t.replace('"10.0.0.7:50051"', '"10.0.0.7"'), r"\[parties.telco\] address"),
    (lambda t: t.replace('"telco.internal"', '"bank"'), r"\[parties.telco\] hosts: 'bank' is the name of party"),
    (lambda t: t.replace('"telco.internal"', '"bank.internal"'), r"\[parties.telco\] hosts: 'bank.internal' is "
                                                                 r"already a certificate name of party 'bank': two "
                                                                 r"parties cannot share a host name; on one machine "
                                                                 r"omit hosts \(peers are verified by party name"),
    (lambda t: t.replace('"telco.internal"', '"bad name!"'), r"\[parties.telco\] hosts"),
    (lambda t: t.replace('predict = ["bank", "telco"]', 'predict = ["bank", "mallory"]'),
     r"\[parties.insurer\] predict: 'mallory' is not a party"),
    (lambda t: t.replace('predict = ["bank", "telco"]', 'train = ["insurer"]'), r"\[parties.insurer\] train: a "
                                                                                r"party cannot be its own client"),
    (lambda t: t + '\n[parties.bank2]\naddress = "x:1"\ncolour = "red"\n', r"\[parties.bank2\] colour: unknown key"),
    (lambda t: t.replace('hosts = ["bank.internal"]', 'train = ["telco"]'), r"\[parties.bank\] train: the active"),
    (lambda t: t.replace("[parties.insurer]", "[parties.ca]"), r"\[parties.ca\]"),
    (lambda t: t + "\n[extra]\n", r"unknown table or key 'extra'"),
])
def test_every_mistake_names_file_table_and_key(tmp_path, edit, where):
    path = _write(tmp_path, edit(GOOD))
    with pytest.raises(FederationError, match=f"federation file {tmp_path}.*" + where):
        load_federation(path)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(FederationError, match="cannot read federation file"):
        load_federation(tmp_path / "missing.toml")
    with pytest.raises(FederationError, match="not valid TOML"):
        load_federation(_write(tmp_path, "[federation\nactive="))
    assert isinstance(FederationError("x"), InputError)


_keys = st.sampled_from(["federation", "parties", "active", "min_node_rows", "address", "hosts", "train", "predict",
                         "bank", "telco", "x"])
_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 2**40) | st.text(max_size=12) |
                       st.sampled_from(["bank", "telco", "127.0.0.1:5", "h.example"]),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4),
                       max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_keys, _values, max_size=4))
def test_the_parser_never_fails_otherwise_than_with_a_federation_error(data):
    data = {k: v for k, v in data.items() if v is not None}
    try:
        fed = parse_federation(data, "fuzz.toml")
    except FederationError as exc:
        assert str(exc).startswith("federation file fuzz.toml")
        return
    assert fed.active in fed.parties and len(fed.parties) >= 2


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(GOOD.splitlines(keepends=True)), st.integers(0, 40), st.characters())
def test_a_damaged_good_file_is_refused_or_still_checked(line, at, ch):
    text = GOOD.replace(line, line[:at] + ch + line[at:], 1) if line.strip() else GOOD
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return
    try:
        fed = parse_federation(data, "f.toml")
    except FederationError:
        return
    assert fed.active in fed.parties


def test_access_deny_by_default(tmp_path):
    fed = load_federation(_write(tmp_path, GOOD))
    telco = Access("telco", True, fed)
    assert telco.check_train("certificate bank/bank.internal") == "bank"
    with pytest.raises(ProtocolError, match="rule 'who may train'"):
        telco.check_train("certificate insurer")
    with pytest.raises(ProtocolError, match="rule 'federation identity'"):
        telco.check_train("certificate bank/telco")          # a certificate valid for two parties' names
    assert telco.check_predict("certificate bank", "bank", "m1") == "bank"
    with pytest.raises(ProtocolError, match="rule 'who may predict'.*only \\['bank'\\]"):
        telco.check_predict("certificate insurer", "bank", "m1")
    insurer = Access("insurer", True, fed)
    assert insurer.check_predict("certificate telco/telco.internal", "bank", "m1") == "telco"
    plain = Access("telco", False, fed)      # --insecure: names are only claimed, nothing is enforced
    assert plain.check_train("mallory@ipv4:127.0.0.1") == "mallory@ipv4:127.0.0.1"
    alone = Access("telco", True, None, ("bank",))       # --allow-client: the model's trainer predicts
    assert alone.check_predict("certificate bank", "certificate bank", "m") == "certificate bank"
    with pytest.raises(ProtocolError, match="the client that trained it"):
        alone.check_predict("certificate shop", "certificate bank", "m")


def test_the_commands_deny_by_default(tmp_path):
    """Under TLS a passive party needs a federation file or --allow-client; --insecure listens on
    loopback only; `vfl certs --federation` gives each party only its own names."""
    pytest.importorskip("grpc")
    pytest.importorskip("cryptography")
    from click.testing import CliRunner
    from support import small_frames

    from cli import main
    from protocols.certs import certificate_names

    def run(*args):
        return CliRunner().invoke(main, [str(a) for a in args])

    _, b, _ = small_frames(30)
    b.to_csv(tmp_path / "b.csv", index=False)
    fed = _write(tmp_path, GOOD.replace('"10.0.0.7:50051"', '"127.0.0.1:1"'))
    r = run("certs", "--out", tmp_path / "certs", "--federation", fed)
    assert r.exit_code == 0, r.output
    names = {p: certificate_names((tmp_path / "certs" / f"{p}.pem").read_bytes()) for p in ("bank", "telco", "insurer")}
    assert names == {"bank": {"bank", "bank.internal"}, "telco": {"telco", "telco.internal"},
                     "insurer": {"insurer"}}        # (telco's IP address is an IP name, not a DNS one)
    r = run("certs", "--out", tmp_path / "c2", "--federation", fed, "--host", "x.example")
    assert r.exit_code != 0 and "--host goes into every certificate" in r.output
    base = ["party", "passive", "--name", "telco", "--data", tmp_path / "b.csv", "--model-dir", tmp_path / "m",
            "--listen", "127.0.0.1:0"]
    r = run(*base, "--tls-dir", tmp_path / "certs")
    assert r.exit_code == 1 and "would serve any certificate of its CA" in r.output and "--federation" in r.output
    r = run(*base[:-2], "--listen", "0.0.0.0:0", "--insecure")
    assert r.exit_code == 1 and "--insecure refuses to listen on 0.0.0.0:0" in r.output
    r = run(*base[:2], "--name", "bank", *base[4:], "--federation", fed, "--tls-dir", tmp_path / "certs")
    assert r.exit_code == 1 and "is the federation's active party" in r.output
    r = run("party", "active", "--federation", fed, "--name", "telco", "--data", tmp_path / "b.csv",
            "--model-dir", tmp_path / "ma", "--tls-dir", tmp_path / "certs")
    assert r.exit_code == 1 and "the active party is 'bank', not 'telco'" in r.output
