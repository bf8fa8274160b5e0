"""Issue 31 (in one process, where the rule is the passive party's own): the DP-only release needs a
data-independent domain, the ledgers' read-modify-write holds a file lock across processes, the
federation's new keys, case-folded names, --allow-client under the own-names rule, and a DP
model's floor of min_node_rows for its own trainings only."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import small_frames

from parties.dp_ledger import PrivacyLedger
from parties.federation import Access, FederationError, parse_federation
from parties.passive_limits import DEFAULT_MAX_DEPTH, DEFAULT_MAX_ROUNDS, Limits
from parties.reveal_budget import RevealBudget, split_answers
from protocols import alignment
from protocols import messages as m
from vfl.api import ActiveParty, Federation, PassiveParty
from vfl.core.errors import PeerError, ProtocolError

ROOT = Path(__file__).resolve().parents[2]


def _aligned(limits=None):
    a, b = small_frames(120, seed=3)[:2]
    passive = PassiveParty("telco", b)
    passive.limits = limits
    fed = Federation(ActiveParty("bank", a), [passive])
    fed.active.align(fed.transport, ["telco"], alignment.new_salt(), "s")
    return fed


# -- finding 2: DP-only mode without a data-independent domain ------------------------------------------
def test_a_finite_release_without_a_domain_is_refused():
    """TrainSetup(mode="dp") without dp_binning: the bins are the data's quantiles and the release's
    rr_domain said which features have missing values. A finite epsilon needs the domain."""
    fed = _aligned(Limits(dp_allow_unbounded=True))
    fed.transport.call("telco", m.TrainSetup("dp", 8, "m1", n_rounds=1, max_depth=2))
    with pytest.raises(PeerError, match="telco.*rule 'dp domain'.*data-independent domain.*rr_domain"):
        fed.transport.call("telco", m.DPReleaseRequest("m1", 1.0))
    fed.transport.call("telco", m.DPReleaseRequest("m1", float("inf")))     # allowed: no noise, no claim


def test_dp_only_without_a_domain_needs_the_partys_own_policy():
    fed = _aligned(Limits())
    with pytest.raises(PeerError, match="rule 'dp unbounded'"):
        fed.transport.call("telco", m.TrainSetup("dp", 8, "m1", n_rounds=1, max_depth=2))


def test_the_caps_and_their_defaults():
    assert (DEFAULT_MAX_ROUNDS, DEFAULT_MAX_DEPTH) == (1000, 10)
    lim = Limits(max_rounds=10, max_depth=4, max_rounds_x_depth=20)
    lim.check_setup("telco", 5, 4)
    for rounds, depth, why in ((11, 1, "11 rounds"), (2, 5, "max_depth 5"), (6, 4, "6 rounds x depth 4 = 24 levels")):
        with pytest.raises(ProtocolError, match=f"rule 'rounds x depth cap': {why}"):
            lim.check_setup("telco", rounds, depth)


# -- finding 8: the ledgers' read-modify-write under a lock -----------------------------------------------
_CHARGER = """
import sys
from parties.dp_ledger import PrivacyLedger
from parties.passive_limits import Limits
from parties.reveal_budget import RevealBudget
import numpy as np
dp, rb, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
book, budget = PrivacyLedger(dp, None, "telco"), RevealBudget(rb, Limits(lifetime_trainings=10**6), "telco")
for i in range(n):
    book.charge("fp", 0.5, "dp-release", "m")
    budget.charge_training("fp", 10, "m", "bank")
    budget.charge_splits("fp", 10, np.arange(10))
    budget.charge_predictions("fp", 10, "bank", "m", ["r0", "r1"], np.array([1, 2]), "ScoreRequest")
"""


def test_two_concurrent_trainings_charge_the_ledgers_correctly(tmp_path):
    """Each charge read the ledger, added its entry and wrote it back without a lock: two trainings
    charging at once lost one of the charges."""
    dp, rb, n, procs = tmp_path / "dp.json", tmp_path / "rb.json", 40, 4
    runs = [subprocess.Popen([sys.executable, "-c", _CHARGER, str(dp), str(rb), str(n)], cwd=ROOT,
                             env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, stderr=subprocess.PIPE)
            for _ in range(procs)]
    for r in runs:
        _, err = r.communicate(timeout=300)
        assert r.returncode == 0, err.decode()
    assert len(PrivacyLedger(dp).read()["datasets"]["fp"]) == n * procs
    assert PrivacyLedger(dp).spent("fp") == pytest.approx(0.5 * n * procs)
    doc = RevealBudget(rb, Limits()).read()
    assert len(doc["datasets"]["fp"]["trainings"]) == n * procs
    assert split_answers(doc, "fp").tolist() == [n * procs] * 10
    assert doc["datasets"]["fp"]["predictions"] == {"bank": {"m": {"r0": n * procs, "r1": 2 * n * procs}}}
    assert (tmp_path / "dp.json").stat().st_mode & 0o777 == 0o600


def test_a_refused_charge_writes_nothing(tmp_path):
    budget = RevealBudget(tmp_path / "rb.json", Limits(lifetime_split_answers_per_row=2), "telco")
    budget.charge_splits("fp", 3, np.array([0, 0, 1]))
    with pytest.raises(ProtocolError, match="rule 'lifetime split answers': row 0 .* 3 split answers, at most 2"):
        budget.charge_splits("fp", 3, np.array([0, 2]))
    assert split_answers(budget.read(), "fp").tolist() == [2, 1, 0]
    (tmp_path / "bad.json").write_text(json.dumps({"format": "vfl-reveal-budget", "version": 1,
                                                    "datasets": {"fp": {"n_rows": 2, "trainings": [],
                                                                        "split_answers": "AAAA", "predictions": {}}}}))
    with pytest.raises(Exception, match="bad.json.*dataset 'fp' must hold"):
        RevealBudget(tmp_path / "bad.json", Limits()).read()


def test_the_default_dp_cap_counts_dp_releases_only(tmp_path):
    book = PrivacyLedger(tmp_path / "dp.json", None, "telco", dp_cap=1.0)
    book.charge("fp", float("inf"), "no-dp", "m0")          # an exact training: recorded, not refused
    book.charge("fp", 0.75, "dp-release", "m1")
    with pytest.raises(ProtocolError, match="spent epsilon 0.75 of the default lifetime cap 1"):
        book.charge("fp", 0.5, "dp-release", "m2")
    strict = PrivacyLedger(tmp_path / "dp.json", 5.0, "telco")      # an explicit cap: no exact training
    with pytest.raises(ProtocolError, match="without differential privacy"):
        strict.charge("fp2", float("inf"), "no-dp", "m3")


# -- federation keys, case, own names -----------------------------------------------------------------
def _fed(**telco):
    return {"federation": {"active": "bank"}, "parties": {"bank": {}, "telco": {"address": "127.0.0.1:5", **telco}}}


def test_the_limit_keys_of_a_federation_entry():
    fed = parse_federation(_fed(max_rounds=50, lifetime_trainings=3, predict_training_rows=True,
                                dp_lifetime_epsilon=2.5))
    lim = Access("telco", True, fed).limits
    assert (lim.max_rounds, lim.lifetime_trainings, lim.predict_training_rows, lim.dp_lifetime_epsilon) == \
        (50, 3, True, 2.5)
    assert lim.max_depth == DEFAULT_MAX_DEPTH
    for bad, msg in ((dict(max_rounds=0), r"\[parties.telco\] max_rounds: expected an integer"),
                     (dict(predict_training_rows="yes"), r"predict_training_rows: expected true or false"),
                     (dict(dp_lifetime_epsilon=float("inf")), r"dp_lifetime_epsilon: expected a finite number"),
                     (dict(max_depth=12, max_rounds_x_depth=5), r"max_rounds_x_depth: 5 is below max_depth 12")):
        with pytest.raises(FederationError, match=msg):
            parse_federation(_fed(**bad))
    d = _fed()
    d["parties"]["bank"]["max_rounds"] = 5
    with pytest.raises(FederationError, match=r"\[parties.bank\] max_rounds: a passive party's limit"):
        parse_federation(d)


def test_names_and_hosts_are_compared_ignoring_case():
    d = _fed()
    d["parties"]["Telco"] = {"address": "127.0.0.1:6"}
    with pytest.raises(FederationError, match="'Telco' and 'telco' differ only in case"):
        parse_federation(d)
    with pytest.raises(FederationError, match="'TELCO' is the name of party 'telco'"):
        parse_federation({**_fed(), "parties": {"bank": {"hosts": ["TELCO"]}, "telco": {"address": "127.0.0.1:5"}}})
    d = _fed(hosts=["Telco.Example"])
    d["parties"]["bank"]["hosts"] = ["telco.example"]
    with pytest.raises(FederationError, match="'Telco.Example' is already a certificate name of party 'bank'"):
        parse_federation(d)
    fed = parse_federation(_fed(hosts=["telco.example"]))
    assert fed.party_of({"TELCO", "Telco.Example"}) == "telco"


def test_allow_client_follows_the_own_names_rule():
    """--allow-client bank passed a certificate carrying "bank" and "telco" as bank."""
    alone = Access("insurer", True, None, ("bank", "telco"))
    assert alone.check_train("certificate bank/127.0.0.1/bank.internal/localhost") == \
        "certificate bank/127.0.0.1/bank.internal/localhost"
    for names in ("bank/telco", "bank/shop"):
        with pytest.raises(ProtocolError, match="rule 'own names'"):
            alone.check_train(f"certificate {names}")


def test_a_dp_model_floor_applies_to_dp_model_trainings_only():
    """Finding 8: a DP model agrees min_node_rows 1, so a federation training DP models had to set
    min_node_rows = 1 for every training. dp_model_min_node_rows is now its own key."""
    fed = parse_federation({**_fed(), "federation": {"active": "bank", "min_node_rows": 10,
                                                     "dp_model_min_node_rows": 1}})
    assert (fed.min_node_rows, fed.dp_model_min_node_rows) == (10, 1)
    f = _aligned()
    p = f.passives["telco"]
    p.min_node_rows, p.dp_model_min_node_rows = 10, 1
    with pytest.raises(PeerError, match="rule 'min_node_rows'.*agrees 1 rows.*at least 10 .*min_node_rows\\)"):
        f.transport.call("telco", m.TrainSetup("plain", 8, "m", n_rounds=1, max_depth=2, min_node_rows=1))
    f.active.align(f.transport, ["telco"], alignment.new_salt(), "s2")
    f.transport.call("telco", m.TrainSetup("plain", 8, "m", {"epsilon": 1.0, "training_epsilon": 2.0},
                                           n_rounds=1, max_depth=2, min_node_rows=1))
