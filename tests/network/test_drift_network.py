"""Drift and credit metrics over the network (issue 34): real party processes over gRPC with mutual
TLS and a federation file. `vfl predict --drift --label-col --segment` reports what the same
federation computes in memory; a passive party whose federation entry declines is reported as
declined, one whose entry shares names is reported by name; the report is built from the run."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from credit_support import credit_frames
from support import cli_command, start_passive

from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core import credit_metrics

pytestmark = pytest.mark.slow   # real party processes
pytest.importorskip("grpc")

ROOT = Path(__file__).resolve().parents[2]

FEDERATION = """
[federation]
active = "bank"

[parties.bank]

[parties.bureau]
address = "127.0.0.1:1"
drift = "names"
predict_training_rows = true   # new.csv scores training rows (issue 31 refuses them by default)

[parties.telco]
address = "127.0.0.1:2"
drift = "decline"
predict_training_rows = true
"""


def _run(*args, timeout=180):
    r = subprocess.run(cli_command(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr + r.stdout
    return r


def test_drift_over_mtls_equals_drift_in_process(tmp_path, children):
    bank, bureau = credit_frames(500)
    bank = bank.drop(columns="w")
    rng = np.random.default_rng(3)
    telco = pd.DataFrame({"id": bank["id"], "tenure": rng.integers(0, 60, 500).astype(float)})
    for name, frame in (("bank", bank), ("bureau", bureau), ("telco", telco)):
        frame.to_csv(tmp_path / f"{name}.csv", index=False)
    new = bank.iloc[100:400].copy()          # scored later: a subset of the rows, the active inputs shifted
    new["income"] = new["income"] + 0.7
    new.to_csv(tmp_path / "new.csv", index=False)
    fed_file = tmp_path / "federation.toml"
    fed_file.write_text(FEDERATION)
    _run("certs", "--out", tmp_path / "certs", "--federation", fed_file)
    tls = ["--tls-dir", tmp_path / "certs", "--federation", fed_file]
    # telco's own --drift-answers names cannot loosen its federation entry's decline (the stricter wins)
    own = {"bureau": [], "telco": ["--drift-answers", "names"]}
    addr = {p: start_passive(children, tmp_path, p, "--data", tmp_path / f"{p}.csv", "--model-dir", tmp_path / f"m_{p}",
                             *tls, *own[p]) for p in ("bureau", "telco")}
    peers = [x for p in ("bureau", "telco") for x in ("--peer", f"{p}={addr[p]}")]
    _run("party", "active", "--data", tmp_path / "bank.csv", *peers, "--model-dir", tmp_path / "m_bank", *tls,
         "--mode", "plain", "--quiet", "--rounds", 3, "--depth", 3, "--learning-rate", 0.5,
         "--output-json", tmp_path / "train.json")
    out = tmp_path / "run.json"
    r = _run("predict", "--model-dir", tmp_path / "m_bank", "--data", tmp_path / "new.csv", *peers, *tls,
             "--out", tmp_path / "pred.csv", "--drift", "--label-col", "y", "--segment", "segment",
             "--batch-rows", 120, "--output-json", out)
    assert "drift telco: declined" in r.stdout and "drift bureau: education" in r.stdout
    run = json.loads(out.read_text())

    # the same federation in memory, the same policies
    bureau_p, telco_p = PassiveParty("bureau", bureau), PassiveParty("telco", telco)
    bureau_p.drift_policy, telco_p.drift_policy = "names", "decline"
    ref = Federation(ActiveParty("bank", bank), [bureau_p, telco_p])
    ref.fit(TrainParams(mode="plain", n_estimators=3, max_depth=3, learning_rate=0.5))
    frames = {"bank": new.drop(columns="y"), "bureau": bureau, "telco": telco}
    proba = ref.predict_proba(frames, drift=True, batch_rows=120)
    np.testing.assert_allclose(pd.read_csv(tmp_path / "pred.csv")["proba"].to_numpy(), proba, atol=1e-12)
    mem = ref.last_drift
    net = run["drift"]
    assert net["n_rows"] == mem["n_rows"] == 300
    assert net["parties"]["telco"]["status"] == mem["parties"]["telco"]["status"] == "declined"
    for party in ("bank", "bureau"):
        assert [e["feature"] for e in net["parties"][party]["features"]] == \
            [e["feature"] for e in mem["parties"][party]["features"]]
        np.testing.assert_allclose([e["psi"] for e in net["parties"][party]["features"]],
                                   [e["psi"] for e in mem["parties"][party]["features"]], rtol=1e-12)
    np.testing.assert_allclose(net["score"]["features"][0]["psi"], mem["score"]["features"][0]["psi"], rtol=1e-12)
    assert [e["flag"] for e in net["parties"]["bank"]["features"]] == \
        [e["flag"] for e in mem["parties"]["bank"]["features"]]
    # the credit metrics of the labelled batch, per segment too
    expected = credit_metrics.credit_report("binary", new["y"].to_numpy(), proba,
                                            segments=new["segment"].to_numpy(), segment_name="segment")
    assert run["credit"]["overall"]["ks"] == pytest.approx(expected["overall"]["ks"])
    assert run["credit"]["overall"]["deciles"] == expected["overall"]["deciles"]
    assert run["credit"]["segments"].keys() == expected["segments"].keys()

    # bad input: a batch without the label column
    new.drop(columns="y").to_csv(tmp_path / "unlabelled.csv", index=False)
    r = subprocess.run(cli_command("predict", "--model-dir", tmp_path / "m_bank", "--data", tmp_path / "unlabelled.csv",
                                   *peers, *tls, "--out", tmp_path / "p2.csv", "--label-col", "y"),
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no label column 'y'" in r.stderr and "Traceback" not in r.stderr, r.stderr

    # the report of this model and run
    _run("report", "--model-dir", tmp_path / "m_bank", "--evaluation", out, "--training", tmp_path / "train.json",
         "--out", tmp_path / "report.json", "--format", "json")
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["drift"]["parties"]["telco"]["status"] == "declined"
    assert doc["parties"]["alignment"]["bureau"]["n_kept"] == 500
    assert doc["features"]["bureau"]["features"] is None          # the active party never sees its names
