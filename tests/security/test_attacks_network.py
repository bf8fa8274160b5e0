"""The attacks of issues 22 and 31, each a real client over real gRPC + mutual TLS against passive-party
processes started from a federation file (`vfl party passive --federation`), each refused naming
the rule (on the code before issue 22, resp. 31, every one of them was served).

The federation: bank (active), telco and insurer (passive), min_node_rows = 10; certificates from
`vfl certs --federation`. One honest training (`vfl party active --federation`) and prediction
(`vfl predict --federation`) run too: deny by default lets the right party through."""
from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support import KEY_BITS

pytest.importorskip("grpc")
pytest.importorskip("cryptography")

from crypto import schemes  # noqa: E402
from crypto.keys import generate_keypair  # noqa: E402
from crypto.packing import PackingLayout  # noqa: E402
from crypto.paillier import Decryptor, Encryptor  # noqa: E402
from datasets import breast_cancer_parties  # noqa: E402
from parties.active import ActiveParty  # noqa: E402
from protocols import alignment  # noqa: E402
from protocols import messages as m  # noqa: E402
from protocols.certs import _load_ca, issue_party_cert  # noqa: E402
from protocols.grpc_client import GrpcTransport  # noqa: E402
from protocols.grpc_security import Security  # noqa: E402
from protocols.serialization import BigInts  # noqa: E402
from vfl.core.errors import PeerError  # noqa: E402
from vfl.core.model import BoostedModel  # noqa: E402
from vfl.core.params import TrainParams  # noqa: E402

pytestmark = pytest.mark.slow   # real party processes

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60
MIN_NODE_ROWS = 10


def cli(*args):
    return [sys.executable, "-m", "cli", *map(str, args)]


def run_cli(*args, timeout=180):
    return subprocess.run(cli(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_passive(name, data, model_dir, fed, certs, log: Path):
    err = open(log, "w")
    p = subprocess.Popen(cli("party", "passive", "--name", name, "--data", data,
                             "--model-dir", model_dir, "--federation", fed, "--tls-dir", certs,
                             "--listen", FED_ADDR[name]),
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    err.close()
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise AssertionError(f"passive {name} exited: {log.read_text()}")
        ready, _, _ = select.select([p.stdout], [], [], 0.2)
        if ready and "listening on" in p.stdout.readline():
            return p
    p.kill()
    raise AssertionError(f"passive {name} did not start: {log.read_text()}")


FED_ADDR: dict[str, str] = {}


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    """Data, federation file, certificates and the two passive processes (killed at the end)."""
    d = tmp_path_factory.mktemp("fed")
    frames = breast_cancer_parties(3)
    names = ["bank", "telco", "insurer"]
    files = {}
    for n, pf in zip(names, frames):
        pf.frame.to_csv(d / f"{n}.csv", index=False)
        files[n] = d / f"{n}.csv"
    FED_ADDR.update({"telco": f"127.0.0.1:{free_port()}", "insurer": f"127.0.0.1:{free_port()}"})
    text = (f'[federation]\nactive = "bank"\nmin_node_rows = {MIN_NODE_ROWS}\n\n[parties.bank]\n\n'
            f'[parties.telco]\naddress = "{FED_ADDR["telco"]}"\nhosts = ["127.0.0.1"]\npredict_training_rows = true\n\n'
            f'[parties.insurer]\naddress = "{FED_ADDR["insurer"]}"\npredict_training_rows = true\n')
    (d / "federation.toml").write_text(text)
    certs = d / "certs"
    r = run_cli("certs", "--out", certs, "--federation", d / "federation.toml")
    assert r.returncode == 0, r.stderr
    procs = {}
    try:
        for n in ("telco", "insurer"):
            procs[n] = start_passive(n, files[n], d / f"m_{n}", d / "federation.toml", certs, d / f"{n}.err")
        yield {"dir": d, "files": files, "certs": certs, "fed": d / "federation.toml", "procs": procs}
    finally:
        for p in procs.values():
            p.kill()
            p.wait(timeout=10)
            p.stdout.close()


def transport(fed, me, peers=("telco", "insurer"), certs=None):
    return GrpcTransport(me, {p: FED_ADDR[p] for p in peers}, Security.from_options(me, certs or fed["certs"]),
                         timeout=30)


class Tampering(GrpcTransport):
    """The legitimate active party's client, rewriting its histogram requests."""

    def __init__(self, *args, tamper, target="insurer", **kwargs):
        super().__init__(*args, **kwargs)
        self.tamper, self.target = tamper, target
        self.n_hist = 0
        self.replies: list = []         # (request type, reply) from the target

    def call(self, peer, message):
        if isinstance(message, m.CandidatePick) and peer == self.target:     # nodes insurer splits itself
            self.own = getattr(self, "own", set()) | set(zip(message.tree_idx.tolist(), message.node_ids.tolist()))
            out = self.tamper(self, message, -1)
            if out is not message:
                return super().call(peer, out)
        if isinstance(message, m.HistogramRequest) and peer == self.target:
            self.n_hist += 1
            out = self.tamper(self, message, self.n_hist)
            if isinstance(out, list):           # extra requests after the real one
                reply = super().call(peer, message)
                for extra in out:
                    super().call(peer, extra)
                return reply
            message = out
        reply = super().call(peer, message)
        if peer == self.target:
            self.replies.append((type(message).__name__, reply))
        return reply


def _bank(fed):
    return ActiveParty("bank", pd.read_csv(fed["files"]["bank"]))


def _fit_tampered(fed, tamper, target="insurer", **params):
    t = Tampering("bank", {p: FED_ADDR[p] for p in ("telco", "insurer")},
                  Security.from_options("bank", fed["certs"]), timeout=30, tamper=tamper, target=target)
    try:
        return _bank(fed).fit(t, ["telco", "insurer"],
                              TrainParams(**{"mode": "plain", "n_estimators": 2, "max_depth": 3,
                                             "min_node_rows": MIN_NODE_ROWS, **params}))
    finally:
        t.close()


def _level(req):
    return not np.all(req.node_ids == 0)


def _hist_only(tamper):
    """A tamper of histogram requests only (picks pass)."""
    return lambda t, req, i: req if i < 0 else tamper(t, req, i)


# -- who may ask ----------------------------------------------------------------------------------
def test_a_co_passive_certificate_cannot_open_training(fed):
    """Issue 22 (1.): telco's certificate opened a training session at insurer and read its ids."""
    with transport(fed, "telco", peers=("insurer",)) as t:
        # refused by the transport before any session rule (issue 36, item 5): telco may neither train nor
        # predict at insurer
        with pytest.raises(PeerError, match="rule 'federation members': 'telco' may neither train nor predict"):
            t.call("insurer", m.AlignRequest("s1", b"\0" * 16))
    assert "rule 'federation members'" in (fed["dir"] / "insurer.err").read_text()


def test_a_certificate_valid_for_another_partys_name_is_nobody(fed, tmp_path):
    """Issue 22 (4.): `vfl certs --host bank` put "bank" into telco's certificate; it passed as bank."""
    r = run_cli("certs", "--out", tmp_path / "old", "--party", "bank", "--party", "telco", "--host", "bank")
    assert r.returncode != 0 and "is the name of party 'bank'" in r.stderr
    forged = tmp_path / "forged"
    forged.mkdir()
    ca_cert, ca_key = _load_ca(fed["certs"])
    issue_party_cert(forged, "telco", ca_cert, ca_key, hosts=("bank",))    # the CA signed it: TLS accepts it
    (forged / "ca.pem").write_bytes((fed["certs"] / "ca.pem").read_bytes())
    with transport(fed, "telco", peers=("insurer",), certs=forged) as t:
        with pytest.raises(PeerError, match="rule 'federation identity'"):
            t.call("insurer", m.AlignRequest("s2", b"\0" * 16))


# -- what the active party may ask ------------------------------------------------------------------
def test_one_row_per_node_is_refused(fed):
    def tamper(t, req, i):
        if not _level(req):
            return req
        a = req.assignment.copy()
        a[0] = np.arange(a.shape[1])
        return m.HistogramRequest(req.round_idx, np.zeros(8, np.int32), np.arange(1, 9, dtype=np.int32), a)
    with pytest.raises(PeerError, match="insurer.*rule 'refinement'"):
        _fit_tampered(fed, _hist_only(tamper))


def test_an_assignment_not_refining_the_previous_level_is_refused(fed):
    def tamper(t, req, i):
        if not _level(req):
            return req
        a = req.assignment.copy()
        a[0, np.flatnonzero(a[0] > 0)[:5]] = 0     # rows back at the root after it was split
        return m.HistogramRequest(req.round_idx, req.tree_idx, req.node_ids, a)
    with pytest.raises(PeerError, match="insurer.*rule 'refinement'"):
        _fit_tampered(fed, _hist_only(tamper))


def test_more_histogram_requests_than_trees_times_depth_are_refused(fed):
    def tamper(t, req, i):
        if i != 1:
            return req
        a = req.assignment.copy()
        a[0, :a.shape[1] // 2], a[0, a.shape[1] // 2:] = 1, 2      # a refinement, but past max_depth 1
        return [m.HistogramRequest(req.round_idx, np.zeros(1, np.int32), np.array([1], np.int32), a)]
    with pytest.raises(PeerError, match="insurer.*rule 'requests per round'"):
        _fit_tampered(fed, _hist_only(tamper), max_depth=1)


def test_a_node_below_min_node_rows_is_refused(fed):
    """At the third level, a node split by another party is divided again (a split the bank could
    have made on its own features) so that one child holds 9 rows, and that child is asked for."""
    def tamper(t, req, i):
        if i == 2:
            t.level1 = req.assignment.copy()
        if i != 3:
            return req
        prev, a = t.level1[0], req.assignment.copy()
        for v in np.unique(prev[prev > 0]).tolist():
            rows = np.flatnonzero(prev == v)
            kids = np.unique(a[0, rows])
            if (0, v) in getattr(t, "own", set()) or len(kids) != 2 or len(rows) < 2 * MIN_NODE_ROWS:
                continue
            a[0, rows[:MIN_NODE_ROWS - 1]], a[0, rows[MIN_NODE_ROWS - 1:]] = kids[0], kids[1]
            return m.HistogramRequest(req.round_idx, np.zeros(1, np.int32), np.array([kids[0]], np.int32), a)
        raise AssertionError("no level-1 node split by another party: the attack needs one")
    # issue 31: the division itself is refused now (a child below the floor), before the histogram
    with pytest.raises(PeerError, match=f"telco.*rule 'min_node_rows'.*with {MIN_NODE_ROWS - 1} rows"):
        _fit_tampered(fed, _hist_only(tamper), target="telco")      # insurer makes every split of this tree
    with pytest.raises(PeerError, match="rule 'min_node_rows': the setup agrees 2 rows per node, this party "
                                        "requires at least 10"):
        _fit_tampered(fed, lambda t, req, i: req, min_node_rows=2)      # below the federation's floor


def test_a_reply_is_not_the_product_of_the_active_partys_own_ciphertexts(fed):
    """Issue 22 (3.): the reply was the product of the bank's ciphertexts over each bin's rows. Now
    (issue 31) a reply holds shuffled running sums, each re-randomised: every ciphertext differs from
    every other and from the bank's own, and each decrypts to a left child's row count (gradients of
    1), both children at the federation's floor."""
    bank = _bank(fed)
    pk, sk = generate_keypair(KEY_BITS)
    enc = Encryptor(pk, sk, "fast")
    with transport(fed, "bank", peers=("insurer",)) as t:
        rows = bank.align(t, ["insurer"], alignment.new_salt(), "s-product")
        n = len(rows)
        t.call("insurer", m.TrainSetup("he", 8, "productattack", n_rounds=1, max_depth=1,
                                       min_node_rows=MIN_NODE_ROWS))
        t.call("insurer", m.PublicKey(**schemes.public_key_fields(pk, sk)))      # with its n-th-root proof
        cts = enc.encrypt([1] * n)
        layout = PackingLayout.for_bounds(1.0, 0.25, n)
        t.call("insurer", m.Gradients(0, True, layout.to_dict(), 1, BigInts(cts)))
        reply = t.call("insurer", m.HistogramRequest(0, np.zeros(1, np.int32), np.zeros(1, np.int32),
                                                     np.zeros((1, n), np.int32)))
        t.call("insurer", m.TrainEnd("productattack", False))
    assert isinstance(reply, m.CandidateResponse) and int(reply.n_candidates[0]) == reply.n_values > 10
    values = [int(v) for v in reply.values.values]
    assert len(set(values)) == len(values) and not set(values) & {int(c) for c in cts}
    counts = Decryptor(sk).decrypt(values)
    assert all(MIN_NODE_ROWS <= c <= n - MIN_NODE_ROWS for c in counts)


# -- issue 31: targeted splits ---------------------------------------------------------------------
def test_a_targeted_split_request_is_refused(fed):
    """Issue 31 (1.): the bank binary-searched one insurer feature with its own split requests
    ((feature 0, bin b) at each node, levels advanced with empty requests) and read every row's exact
    bin. Now insurer names its splits by opaque positions only: a (feature, bin) request is refused."""
    def tamper(t, req, i):
        if isinstance(req, m.CandidatePick):
            k = len(req.node_ids)
            return m.SplitRequest(req.round_idx, req.node_ids, req.tree_idx, np.zeros(k, np.int32),
                                  np.full(k, 3, np.int32), np.zeros(k, bool))
        return req
    with pytest.raises(PeerError, match="insurer.*refuses SplitRequest: rule 'shuffled candidates'"):
        _fit_tampered(fed, tamper)
    assert "rule 'shuffled candidates'" in (fed["dir"] / "insurer.err").read_text()


def test_parent_minus_a_one_row_child_is_refused(fed):
    """Issue 31 (1.): split {row 7} | rest on the bank's own features, ask only for "rest": root minus
    rest was row 7's bins. Now no division may leave a child below min_node_rows."""
    def tamper(t, req, i):
        if i < 0 or not _level(req):
            return req
        a = req.assignment.copy()
        a[0] = np.where(a[0] >= 0, 2, -4)
        a[0, 7] = 1
        return m.HistogramRequest(req.round_idx, np.zeros(1, np.int32), np.array([2], np.int32), a)
    with pytest.raises(PeerError, match="insurer.*rule 'min_node_rows': tree 0: node 0 is divided leaving child 1 "
                                        "with 1 rows"):
        _fit_tampered(fed, tamper)


def test_what_the_active_party_receives_per_node_over_the_wire(fed):
    """An honest training: for every level insurer sends a CandidateResponse (shuffled running sums, no
    feature id, no per-bin sums) and answers picks by position."""
    t = Tampering("bank", {p: FED_ADDR[p] for p in ("telco", "insurer")},
                  Security.from_options("bank", fed["certs"]), timeout=30, tamper=lambda t, req, i: req)
    try:
        _bank(fed).fit(t, ["telco", "insurer"], TrainParams(mode="he", key_bits=KEY_BITS, n_estimators=2,
                                                              max_depth=3, min_node_rows=MIN_NODE_ROWS))
    finally:
        t.close()
    levels = [r for kind, r in t.replies if kind == "HistogramRequest"]
    assert levels and all(isinstance(r, m.CandidateResponse) for r in levels)
    assert all(len(r.cat_features) == 0 and len(r.monotone) == 0 and r.n_values == int(r.n_candidates.sum())
               for r in levels)
    assert {kind for kind, _ in t.replies} >= {"HistogramRequest", "CandidatePick"}
    assert "SplitRequest" not in {kind for kind, _ in t.replies}


def test_degenerate_keys_are_refused_over_the_wire(fed):
    """Issue 31 (finding 3): a Paillier key without its n-th-root proof, and an OU key whose bases are
    g = h = n - 1 (h^r = +-1: re-randomising with it did nothing), were accepted; each is refused now,
    and no base the key holder sends is used to re-randomise."""
    bank = _bank(fed)
    pk, _ = generate_keypair(KEY_BITS)
    ou_pub, _ = schemes.generate_keypair(KEY_BITS, scheme=schemes.OU)
    with transport(fed, "bank", peers=("insurer",)) as t:
        bank.align(t, ["insurer"], alignment.new_salt(), "s-degenerate")
        t.call("insurer", m.TrainSetup("he", 8, "degenerate", n_rounds=1, max_depth=1, min_node_rows=MIN_NODE_ROWS))
        with pytest.raises(PeerError, match="n-th-root proof has 0 roots"):
            t.call("insurer", m.PublicKey(format(pk.n, "x")))
    with transport(fed, "bank", peers=("insurer",)) as t:
        bank.align(t, ["insurer"], alignment.new_salt(), "s-degenerate-ou")
        t.call("insurer", m.TrainSetup("he", 8, "degenerate-ou", n_rounds=1, max_depth=1,
                                       min_node_rows=MIN_NODE_ROWS, scheme="ou"))
        bad = format(ou_pub.n - 1, "x")
        with pytest.raises(PeerError, match="h? ?has a small multiplicative order"):
            t.call("insurer", m.PublicKey(format(ou_pub.n, "x"), "ou", bad, bad))


# -- an honest federation, and prediction ----------------------------------------------------------
def test_the_federation_trains_and_predicts_and_only_the_trainer_predicts(fed, tmp_path):
    r = run_cli("party", "active", "--federation", fed["fed"], "--tls-dir", fed["certs"], "--data",
                fed["files"]["bank"], "--model-dir", tmp_path / "ma", "--mode", "he", "--key-bits", KEY_BITS,
                "--rounds", 2, "--depth", 3, "--quiet", "--output-json", tmp_path / "train.json")
    assert r.returncode == 0, r.stderr
    model = BoostedModel.load(tmp_path / "ma" / "bank.json")
    assert json.loads((tmp_path / "train.json").read_text())["n_trees"] == 2
    for p in ("telco", "insurer"):
        d = json.loads((fed["dir"] / f"m_{p}" / f"{model.model_id}.json").read_text())
        assert d["trainer"] == "bank" and d["completed"] is True
    r = run_cli("predict", "--federation", fed["fed"], "--tls-dir", fed["certs"], "--model-dir", tmp_path / "ma",
                "--data", fed["files"]["bank"], "--out", tmp_path / "pred.csv", "--prediction", "node")
    assert r.returncode == 0, r.stderr
    assert len(pd.read_csv(tmp_path / "pred.csv")) == 569
    # telco may not predict against insurer with the bank's model (default: the party that trained it)
    with transport(fed, "telco", peers=("insurer",)) as t:
        with pytest.raises(PeerError, match="rule 'federation members': 'telco' may neither train nor predict"):
            t.call("insurer", m.PredictStart(model.model_id, "steal", np.zeros((1, 16), np.uint8)))
    # node-by-node routing answers only rows of the session's batch and records of its model
    with transport(fed, "bank", peers=("insurer",)) as t:
        hashes = alignment.hash_ids(np.arange(5), bytes.fromhex(model.salt))
        t.call("insurer", m.PredictStart(model.model_id, "route", hashes, model.party_hashes.get("insurer", "")))
        with pytest.raises(PeerError, match="row index out of range"):
            t.call("insurer", m.RouteRequest("route", np.zeros(1, np.int64), np.array([5], np.int64)))
        with pytest.raises(PeerError, match="unknown record id"):
            t.call("insurer", m.RouteRequest("route", np.array([10_000], np.int64), np.zeros(1, np.int64)))
        # issue 22 (6.): any (record, row) pair was answered; a row now meets at most max_depth (3) of
        # insurer's distinct records of one tree, as on a path (issue 31: over all the client's sessions)
        recs = json.loads((fed["dir"] / "m_insurer" / f"{model.model_id}.json").read_text())["records"]
        trees = pd.Series([(r["round"], r["tree"]) for r in recs])
        rec = np.flatnonzero(trees == trees.value_counts().index[0])
        assert len(rec) > 3, "the attack needs a tree with more of insurer's records than a path meets"
        t.call("insurer", m.RouteRequest("route", rec[:3], np.zeros(3, np.int64)))
        t.call("insurer", m.RouteRequest("route", rec[:3], np.zeros(3, np.int64)))    # asked before: nothing new
        with pytest.raises(PeerError, match="rule 'path budget'"):
            t.call("insurer", m.RouteRequest("route", rec[3:4], np.zeros(1, np.int64)))
        t.call("insurer", m.PredictEnd("route"))
