"""The federation file's checks on parsed data (parse_federation on dicts, as tomllib gives them):
each wrong shape names the file, the table and the key; the Access rules beyond the happy path."""
import copy

import pytest

from parties.federation import (
    DEFAULT_MIN_NODE_ROWS,
    Access,
    FederationError,
    cert_names_of,
    load_federation,
    parse_federation,
)
from vfl.core.errors import InputError, ProtocolError

BASE = {
    "federation": {"active": "bank", "min_node_rows": 5},
    "parties": {
        "bank": {"hosts": ["bank.internal"]},
        "telco": {"address": "10.0.0.7:50051", "hosts": ["10.0.0.7"]},
    },
}


def _edited(edit):
    data = copy.deepcopy(BASE)
    edit(data)
    return data


def test_the_base_is_good():
    fed = parse_federation(copy.deepcopy(BASE), "fed.toml")
    assert fed.path == "fed.toml" and fed.active == "bank" and fed.min_node_rows == 5
    assert fed.passives == {"telco": "10.0.0.7:50051"}
    assert fed.parties["telco"].cert_names == frozenset({"telco", "10.0.0.7"})


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["parties"]["telco"].update(train="bank"), r"\[parties.telco\] train: expected a list of party names"),
    (lambda d: d["parties"]["telco"].update(predict=["bank", 3]),
     r"\[parties.telco\] predict: expected a list of party names"),
    (lambda d: d["parties"]["telco"].update(predict=["bank", "bank"]), r"\[parties.telco\] predict: a party is "
                                                                       r"named twice"),
    (lambda d: d["parties"]["telco"].update(hosts=[7]), r"\[parties.telco\] hosts: expected a list of DNS names"),
    (lambda d: d["parties"]["telco"].update(hosts=[""]), r"\[parties.telco\] hosts: expected a list of DNS names"),
    (lambda d: d["parties"]["telco"].update(hosts="telco.internal"),
     r"\[parties.telco\] hosts: expected a list of DNS names or IP addresses, got 'telco.internal'"),
    (lambda d: d["parties"]["telco"].update(address=50051), r"\[parties.telco\] address: expected \"HOST:PORT\""),
    (lambda d: d["parties"].update({"bad name!": {"address": "h:1"}}), r"\[parties.bad name!\]"),
    (lambda d: d["parties"].update(shop="not a table"), r"\[parties.shop\]: expected a table"),
    (lambda d: d["parties"].pop("telco"), r"\[parties\]: a federation needs at least two parties, got \['bank'\]"),
    (lambda d: d.update(parties={}), r"\[parties\]: missing: give one \[parties.NAME\] table per party"),
    (lambda d: d.pop("federation"), r"\[federation\]: missing \(it names the active party"),
    (lambda d: d["federation"].update(min_node_rows=(1 << 20) + 1), r"\[federation\] min_node_rows: expected an "
                                                                     r"integer 1..1048576, got 1048577"),
    (lambda d: d["federation"].update(active=None), r"\[federation\] active: None is not one of the parties"),
])
def test_each_wrong_shape_names_its_table_and_key(edit, message):
    with pytest.raises(FederationError, match=r"^federation file fed.toml: " + message):
        parse_federation(_edited(edit), "fed.toml")


def test_not_a_table_at_all():
    with pytest.raises(FederationError, match="federation file f.toml: not a TOML table"):
        parse_federation(["federation"], "f.toml")


def test_hosts_are_kept_canonical():
    """An IP address is written the standard way (so a certificate's SAN text compares equal); a DNS
    name is kept as written."""
    fed = parse_federation(_edited(lambda d: d["parties"]["telco"].update(hosts=["::0001", "t-1.example"])), "f")
    assert fed.parties["telco"].hosts == ("::1", "t-1.example")


def test_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "federation.toml"
    path.write_bytes(b'[federation]\nactive = "\xff"\n')
    with pytest.raises(FederationError, match=f"federation file {path}: not UTF-8 text"):
        load_federation(path)


def test_a_party_outside_the_federation_is_named_with_its_option():
    fed = parse_federation(copy.deepcopy(BASE), "fed.toml")
    with pytest.raises(InputError, match=r"fed.toml: party 'shop' \(--name\) is not in the federation "
                                         r"\(its parties: bank, telco\)"):
        fed.party("shop")
    with pytest.raises(InputError, match=r"party 'shop' \(--peer\)"):
        fed.party("shop", "--peer")
    with pytest.raises(InputError, match="party 'shop'"):
        fed.trainers("shop")


def test_cert_names_of_reads_only_certificate_identities():
    assert cert_names_of("certificate bank/bank.internal") == {"bank", "bank.internal"}
    assert cert_names_of("bank@ipv4:127.0.0.1") is None
    assert cert_names_of("bank certificate x") is None


def test_min_node_rows_comes_from_the_federation_or_the_default():
    fed = parse_federation(copy.deepcopy(BASE), "fed.toml")
    assert Access("telco", True, fed).min_node_rows == 5
    assert Access("telco", True, None, ("bank",)).min_node_rows == DEFAULT_MIN_NODE_ROWS


def test_a_model_without_a_recorded_trainer_is_served_to_the_active_party_only():
    """A model file from before trainers were recorded (trainer None): under a federation only its
    active party may predict; without one (--allow-client) the transport's list is the rule."""
    fed = parse_federation(copy.deepcopy(BASE), "fed.toml")
    telco = Access("telco", True, fed)
    assert telco.check_predict("certificate bank/bank.internal", None, "old") == "bank"
    with pytest.raises(ProtocolError, match=r"refuses prediction with model 'old' for 'telco'.*rule 'who may "
                                            r"predict': only \['bank'\] may \(fed.toml\)"):
        Access("telco", True, fed).check_predict("certificate telco/10.0.0.7", None, "old")
    alone = Access("telco", True, None, ("bank",))
    assert alone.check_predict("certificate shop", None, "old") == "certificate shop"
    insecure = Access("telco", False, fed)
    assert insecure.check_predict("shop@ipv4:127.0.0.1", "bank", "m") == "shop@ipv4:127.0.0.1"
