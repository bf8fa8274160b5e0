"""Issue 31: the passive party owns its limits. Each attack of the second review that is about the
wire, as a real client over real gRPC + mutual TLS against `vfl party passive --federation`
processes (on the code before issue 31 every one was served, or the federation keys that now set
the limits did not exist).

The federation: bank (active), telco (a lifetime budget of 4 split answers per row), insurer (the
default caps; 40 prediction decisions per (client, model, row); dp_model_min_node_rows = 1) and
shop (2 trainings in its lifetime), min_node_rows = 5."""
from __future__ import annotations

import json
import subprocess
import warnings

import numpy as np
import pandas as pd
import pytest
from support import KEY_BITS
from test_attacks_network import FED_ADDR, cli, free_port, run_cli, start_passive

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from crypto.keys import WeakKeyWarning  # noqa: E402
from datasets import breast_cancer_parties  # noqa: E402
from parties.active import ActiveParty  # noqa: E402
from parties.reveal_budget import split_answers  # noqa: E402
from protocols import alignment  # noqa: E402
from protocols import messages as m  # noqa: E402
from protocols.certs import _load_ca, issue_party_cert  # noqa: E402
from protocols.grpc_client import GrpcTransport  # noqa: E402
from protocols.grpc_security import Security  # noqa: E402
from vfl.core.errors import PeerError  # noqa: E402
from vfl.core.params import TrainParams  # noqa: E402

pytestmark = pytest.mark.slow   # real party processes

PASSIVES = ("telco", "insurer", "shop")
TRAIN_ROWS = 400                 # the bank trains on ids 0..399; ids 400..568 are new rows to predict


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    d = tmp_path_factory.mktemp("limits")
    frames = breast_cancer_parties(4)
    files = {}
    for n, pf in zip(("bank", *PASSIVES), frames):
        pf.frame.to_csv(d / f"{n}.csv", index=False)
        files[n] = d / f"{n}.csv"
    for p in PASSIVES:
        FED_ADDR[p] = f"127.0.0.1:{free_port()}"
    text = ('[federation]\nactive = "bank"\nmin_node_rows = 5\ndp_model_min_node_rows = 1\n\n[parties.bank]\n\n'
            f'[parties.telco]\naddress = "{FED_ADDR["telco"]}"\nhosts = ["127.0.0.1"]\n'
            'lifetime_split_answers_per_row = 4\n\n'
            f'[parties.insurer]\naddress = "{FED_ADDR["insurer"]}"\nlifetime_prediction_decisions_per_row = 40\n\n'
            f'[parties.shop]\naddress = "{FED_ADDR["shop"]}"\nlifetime_trainings = 2\n')
    (d / "federation.toml").write_text(text)
    certs = d / "certs"
    r = run_cli("certs", "--out", certs, "--federation", d / "federation.toml")
    assert r.returncode == 0, r.stderr
    procs = {}
    env = {"dir": d, "files": files, "certs": certs, "fed": d / "federation.toml", "procs": procs}
    try:
        for n in PASSIVES:
            procs[n] = start_passive(n, files[n], d / f"m_{n}", d / "federation.toml", certs, d / f"{n}.err")
        yield env
    finally:
        for p in procs.values():
            p.kill()
            p.wait(timeout=10)
            p.stdout.close()


def _transport(fed, peers):
    return GrpcTransport("bank", {p: FED_ADDR[p] for p in peers}, Security.from_options("bank", fed["certs"]),
                         timeout=30)


def _bank(fed, features=True, rows=TRAIN_ROWS):
    frame = pd.read_csv(fed["files"]["bank"]).iloc[:rows]
    return ActiveParty("bank", frame if features else frame[["id", "y"]])


def _fit(fed, peers, features=True, **params):
    with _transport(fed, peers) as t:
        return _bank(fed, features).fit(t, list(peers), TrainParams(**{"mode": "plain", "n_estimators": 2,
                                                                          "max_depth": 3, "min_node_rows": 5,
                                                                          **params}))


# -- rounds x depth: the passive party's caps, not the requester's TrainSetup ----------------------------
@pytest.mark.parametrize("rounds, depth, why", [
    (1 << 20, 4, "1048576 rounds, this party allows at most 1000 \\(max_rounds\\)"),
    (10, 30, "max_depth 30, this party allows at most 10 \\(max_depth\\)"),
    (1000, 10, "1000 rounds x depth 10 = 10000 levels, this party allows at most 6000"),
])
def test_a_setup_beyond_the_partys_own_caps_is_refused(fed, rounds, depth, why):
    """Finding 1: the requester set n_rounds (up to 2^20) and max_depth (up to 30) in TrainSetup."""
    bank = _bank(fed)
    with _transport(fed, ("insurer",)) as t:
        bank.align(t, ["insurer"], alignment.new_salt(), f"caps-{rounds}-{depth}")
        with pytest.raises(PeerError, match=f"insurer.*rule 'rounds x depth cap': {why}"):
            t.call("insurer", m.TrainSetup("plain", 8, f"caps{depth}", n_rounds=rounds, max_depth=depth,
                                           min_node_rows=5))


# -- the lifetime budget: a refused session reopened at once is still refused ----------------------------
def test_the_split_answer_budget_is_not_reset_by_a_new_session(fed):
    """Finding 1: a refused session could be reopened at once, with a fresh allowance. The bank has no
    features: every split is telco's, each row gets one answer per level (3 in round 0, the 5th in
    round 1 exceeds telco's lifetime budget of 4)."""
    with pytest.raises(PeerError, match="telco.*rule 'lifetime split answers'.*at most 4"):
        _fit(fed, ("telco",), features=False)
    with pytest.raises(PeerError, match="telco.*rule 'lifetime split answers'"):     # reopened at once
        _fit(fed, ("telco",), features=False, n_estimators=1)
    doc = json.loads((fed["dir"] / "m_telco" / "ledgers" / "reveal-budget.json").read_text())
    ((fp, ds),) = doc["datasets"].items()
    assert doc["format"] == "vfl-reveal-budget" and len(ds["trainings"]) == 2
    counts = split_answers(doc, fp)
    assert counts.max() == 4 and len(counts) == 569


def test_the_training_budget_survives_a_restart(fed):
    for _ in range(2):
        _fit(fed, ("shop",), n_estimators=1, max_depth=1)
    with pytest.raises(PeerError, match="shop.*rule 'lifetime trainings'.*trained 2 times, at most 2"):
        _fit(fed, ("shop",), n_estimators=1, max_depth=1)
    p = fed["procs"]["shop"]          # a restarted party keeps its budget (on disk)
    p.kill()
    p.wait(timeout=10)
    p.stdout.close()
    fed["procs"]["shop"] = start_passive("shop", fed["files"]["shop"], fed["dir"] / "m_shop", fed["fed"],
                                         fed["certs"], fed["dir"] / "shop2.err")
    with pytest.raises(PeerError, match="shop.*rule 'lifetime trainings'"):
        _fit(fed, ("shop",), n_estimators=1, max_depth=1)


# -- DP: no unbounded DP-only training, no DP label on an exact exchange ---------------------------------
def test_dp_only_at_epsilon_inf_without_a_domain_is_refused(fed):
    """Finding 2: mode dp without dp_binning released every row's exact quantile bin."""
    with pytest.raises(PeerError, match="insurer.*rule 'dp unbounded'.*dp_allow_unbounded"):
        _fit(fed, ("insurer",), mode="dp", epsilon=float("inf"))


def test_a_dp_model_label_charges_infinity_to_the_ledger(fed):
    """Finding 4: a training labelled --dp-model charged the training_epsilon the active party stated,
    while it saw exact sums and split answers; and the ledger was off unless configured. It is now on
    by default (MODEL_DIR/ledgers/dp-ledger.json) and the exchange is charged as what it is."""
    _fit(fed, ("insurer",), dp_model=1.0, n_estimators=1, max_depth=2)
    doc = json.loads((fed["dir"] / "m_insurer" / "ledgers" / "dp-ledger.json").read_text())
    entries = [e for es in doc["datasets"].values() for e in es]
    assert entries and entries[-1]["epsilon"] == "inf" and entries[-1]["labelled"] == "dp-model"
    assert all(e["epsilon"] == "inf" for e in entries)


# -- prediction: the skeleton, the budget across sessions, the training rows -----------------------------
@pytest.fixture(scope="module")
def model(fed):
    with warnings.catch_warnings():         # (module scope: outside conftest's per-test filter)
        warnings.filterwarnings("ignore", category=WeakKeyWarning)
        return _fit(fed, ("insurer",), mode="he", key_bits=KEY_BITS, n_estimators=2, max_depth=3)


def _session(t, model, sid, ids):
    hashes = alignment.hash_ids(np.asarray(ids), bytes.fromhex(model.salt))
    t.call("insurer", m.PredictStart(model.model_id, sid, hashes, model.party_hashes.get("insurer", "")))


def test_one_three_node_tree_per_record_is_refused(fed, model):
    """Finding 5: one-round prediction accepted any skeleton: one three-node tree per record returned
    every record's decision, for every row, in one request."""
    sk = model.skeleton("insurer")
    own = sk.record_ids[sk.record_ids >= 0]
    assert len(own) >= 2
    with _transport(fed, ("insurer",)) as t:
        _session(t, model, "honest", [450, 451])
        t.call("insurer", m.LeafMaskRequest("honest", sk.tree_sizes, sk.left, sk.right, sk.record_ids))
        _session(t, model, "evil", [452, 453])
        k = len(own)
        with pytest.raises(PeerError, match="insurer.*rule 'skeleton'"):
            t.call("insurer", m.LeafMaskRequest("evil", np.full(k, 3, np.int32),
                                                np.tile([1, -1, -1], k).astype(np.int32),
                                                np.tile([2, -1, -1], k).astype(np.int32),
                                                np.stack([own, -np.ones(k, np.int64), -np.ones(k, np.int64)],
                                                         axis=1).ravel()))


def test_the_prediction_budget_is_not_reset_by_a_new_session(fed, model):
    """Finding 5: the node-by-node budget was per session; decisions are now counted per (client,
    model, row) on disk (insurer: 40 per row)."""
    sk = model.skeleton("insurer")
    n_own = int((sk.record_ids >= 0).sum())
    with _transport(fed, ("insurer",)) as t:
        for i in range(40 // n_own):
            _session(t, model, f"b{i}", [500])
            t.call("insurer", m.LeafMaskRequest(f"b{i}", sk.tree_sizes, sk.left, sk.right, sk.record_ids))
        for sid in ("over", "again"):         # a new session: the same budget
            _session(t, model, sid, [500])
            with pytest.raises(PeerError, match="insurer.*rule 'lifetime prediction decisions'.*at most 40"):
                t.call("insurer", m.LeafMaskRequest(sid, sk.tree_sizes, sk.left, sk.right, sk.record_ids))
        _session(t, model, "other-row", [501])     # another row: its own budget
        t.call("insurer", m.LeafMaskRequest("other-row", sk.tree_sizes, sk.left, sk.right, sk.record_ids))


def test_prediction_on_the_training_rows_is_refused(fed, model):
    """Finding 5: the server predicted over its training rows (their decisions at every record)."""
    with _transport(fed, ("insurer",)) as t:
        with pytest.raises(PeerError, match="insurer.*rule 'training rows'.*predict_training_rows"):
            _session(t, model, "train-rows", [3, 450])
        _session(t, model, "new-rows", [450, 460])


# -- names -------------------------------------------------------------------------------------------
def test_party_names_differing_in_case_are_refused(tmp_path):
    """Finding 8: `telco` and `Telco` were two parties, though certificate names ignore case."""
    fed = tmp_path / "fed.toml"
    fed.write_text('[federation]\nactive = "bank"\n\n[parties.bank]\n\n[parties.telco]\naddress = "127.0.0.1:1"\n\n'
                   '[parties.Telco]\naddress = "127.0.0.1:2"\n')
    r = subprocess.run(cli("certs", "--out", tmp_path / "c", "--federation", fed), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "'Telco' and 'telco' differ only in case" in r.stderr


def test_allow_client_refuses_a_certificate_carrying_several_names(fed, tmp_path):
    """Finding 8: `--allow-client bank` (no federation file) passed a certificate carrying the names
    "bank" and "telco" as bank. The CA signed it, so TLS accepts it; the own-names rule does not."""
    forged = tmp_path / "forged"
    forged.mkdir()
    ca_cert, ca_key = _load_ca(fed["certs"])
    issue_party_cert(forged, "telco", ca_cert, ca_key, hosts=("bank",))
    (forged / "ca.pem").write_bytes((fed["certs"] / "ca.pem").read_bytes())
    port = free_port()
    err = open(tmp_path / "alone.err", "w")
    p = subprocess.Popen(cli("party", "passive", "--name", "insurer", "--data", fed["files"]["insurer"],
                             "--model-dir", tmp_path / "m", "--tls-dir", fed["certs"], "--allow-client", "bank",
                             "--listen", f"127.0.0.1:{port}"), stdout=subprocess.PIPE, stderr=err, text=True)
    err.close()
    try:
        assert "listening on" in p.stdout.readline()
        sec = Security.from_options("telco", forged)
        with GrpcTransport("telco", {"insurer": f"127.0.0.1:{port}"}, sec, timeout=30) as t:
            with pytest.raises(PeerError, match="rule 'own names'"):
                t.call("insurer", m.AlignRequest("forged", b"\0" * 16))
        with GrpcTransport("bank", {"insurer": f"127.0.0.1:{port}"}, Security.from_options("bank", fed["certs"]),
                           timeout=30) as t:
            t.call("insurer", m.AlignRequest("honest", b"\0" * 16))      # the bank's own certificate: served
    finally:
        p.kill()
        p.wait(timeout=10)
        p.stdout.close()
