"""The passive party's lifetime DP ledger (parties.dp_ledger) in process: charges add up per dataset,
the lifetime cap refuses before anything is written, and a damaged ledger file is named."""
import json
import math
import os
import stat

import numpy as np
import pytest

from parties.dp_ledger import LEDGER_FORMAT, PrivacyLedger, check_lifetime, dataset_fingerprint, summary
from vfl.core.errors import InputError, ProtocolError


def test_charges_add_up_per_dataset_and_the_file_is_private(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger(path, lifetime=2.0, party="telco")
    assert ledger.spent("fp1") == 0.0 and not path.exists()
    assert ledger.charge("fp1", 0.5, "dp bins", "m1") == pytest.approx(0.5)
    assert ledger.charge("fp1", 1.0, "dp release", "m1", rows=10) == pytest.approx(1.5)
    assert ledger.charge("fp2", 2.0, "dp model", "m2") == pytest.approx(2.0)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["format"] == LEDGER_FORMAT and doc["datasets"]["fp1"][1]["rows"] == 10
    assert PrivacyLedger(path).spent("fp1") == pytest.approx(1.5)
    assert summary(doc) == {
        "fp1": {"epsilon": 1.5, "entries": 2, "kinds": {"dp bins": 0.5, "dp release": 1.0}},
        "fp2": {"epsilon": 2.0, "entries": 1, "kinds": {"dp model": 2.0}},
    }


def test_the_lifetime_cap_refuses_before_writing(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger(path, lifetime=1.0, party="telco")
    ledger.charge("fp", 0.75, "dp release", "m1")
    before = path.read_bytes()
    with pytest.raises(ProtocolError, match=r"party 'telco' refuses dp release at epsilon 0.5: its dataset has spent "
                                            r"epsilon 0.75 of its lifetime budget 1"):
        ledger.charge("fp", 0.5, "dp release", "m2")
    with pytest.raises(ProtocolError, match="refuses a training without differential privacy"):
        ledger.charge("fp", math.inf, "training", "m3")
    with pytest.raises(ProtocolError, match="refuses the next release: its dataset has spent epsilon 0.75"):
        ledger.check("fp", 0.5, "the next release")
    ledger.check("fp", 0.25, "the last quarter")           # exactly up to the cap is allowed
    assert path.read_bytes() == before


def test_an_unbounded_training_is_recorded_as_inf_without_a_cap(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger(path, party="telco")
    assert ledger.charge("fp", math.inf, "training", "m1") == math.inf
    doc = ledger.read()
    assert doc["datasets"]["fp"][0]["epsilon"] == "inf"
    assert ledger.spent("fp") == math.inf
    assert summary(doc)["fp"]["epsilon"] == "inf"
    with pytest.raises(InputError, match="a DP charge must be >= 0, got -1"):
        ledger.charge("fp", -1, "training", "m2")


@pytest.mark.parametrize("text, message", [
    ("{not json", "cannot be read"),
    (json.dumps({"format": "other", "version": 1, "datasets": {}}), "is not a vfl-dp-ledger version 1 file"),
    (json.dumps({"format": LEDGER_FORMAT, "version": 2, "datasets": {}}), "is not a vfl-dp-ledger version 1 file"),
    (json.dumps({"format": LEDGER_FORMAT, "version": 1, "datasets": []}), "is not a vfl-dp-ledger version 1 file"),
    (json.dumps({"format": LEDGER_FORMAT, "version": 1, "datasets": {"fp": [{"kind": "x"}]}}),
     "dataset 'fp' must list entries with an epsilon"),
    (json.dumps({"format": LEDGER_FORMAT, "version": 1, "datasets": {"fp": {"epsilon": 1}}}),
     "dataset 'fp' must list entries with an epsilon"),
])
def test_a_damaged_ledger_is_named(tmp_path, text, message):
    path = tmp_path / "ledger.json"
    path.write_text(text)
    with pytest.raises(InputError, match=f"DP ledger {str(path)!r}.*{message}".replace("\\", "\\\\")):
        PrivacyLedger(path, 5.0, "telco").spent("fp")


@pytest.mark.parametrize("value", [-1, True, "1", None])
def test_an_entry_with_a_bad_epsilon_is_named(tmp_path, value):
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"format": LEDGER_FORMAT, "version": 1,
                                "datasets": {"fp": [{"kind": "dp release", "epsilon": value}]}}))
    with pytest.raises(InputError, match="epsilon must be a number >= 0 or 'inf'"):
        PrivacyLedger(path).spent("fp")


def test_check_lifetime():
    assert check_lifetime(None) is None and check_lifetime(3) == 3.0
    assert check_lifetime(0) == 0.0         # nothing may be spent (issue 36, item 2: 0 is no "no limit")
    for bad in (-2.0, float("nan"), True, "5"):
        with pytest.raises(InputError, match=r"--dp-lifetime-epsilon must be a number >= 0 .0: nothing may be "
                                             r"spent., got"):
            check_lifetime(bad, "--dp-lifetime-epsilon")


def test_the_fingerprint_follows_ids_names_and_values():
    X = np.array([[1.0, np.nan], [2.0, 3.0]])
    base = dataset_fingerprint([1, 2], X, ["a", "b"])
    assert base == dataset_fingerprint(np.array([1, 2]), X.copy(), ["a", "b"])
    assert len({base, dataset_fingerprint([1, 3], X, ["a", "b"]), dataset_fingerprint([1, 2], X, ["a", "c"]),
                dataset_fingerprint([1, 2], X + 1, ["a", "b"])}) == 4
