"""Credit metrics and drift from the API and `vfl simulate` (issue 34): the numbers a command prints
are those of vfl.core.credit_metrics on the same predictions; drift in every party's own model file;
a declining passive party, names shared only by choice, old model files without training counts."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from credit_support import credit_frames
from scipy.stats import ks_2samp
from sklearn.metrics import roc_auc_score

from cli import main
from protocols import messages as m
from protocols.serialization import loads
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams
from vfl.core import credit_metrics, drift
from vfl.estimators import VerticalBoostingClassifier

PARAMS = TrainParams(mode="plain", n_estimators=3, max_depth=3, learning_rate=0.5)


def _fed(bank, bureau, **policy):
    p = PassiveParty("bureau", bureau)
    for k, v in policy.items():
        setattr(p, k, v)
    fed = Federation(ActiveParty("bank", bank), [p])
    fed.fit(PARAMS)
    return fed


def _new_rows(bank, bureau, n=300, shift=0.0):
    b = bank.drop(columns=[c for c in ("y", "w") if c in bank]).iloc[:n].copy()
    b["income"] = b["income"] + shift
    return {"bank": b, "bureau": bureau.iloc[:n].assign(days_late=bureau["days_late"].iloc[:n] + 2 * shift)}


def test_drift_in_process_each_party_against_its_own_counts():
    bank, bureau = credit_frames(600)
    fed = _fed(bank.drop(columns="w"), bureau)
    assert fed.model.drift["features"]["n_rows"] == 600
    assert fed.passives["bureau"].model_dict()["drift_reference"]["n_rows"] == 600
    frames = _new_rows(bank, bureau, shift=1.0)
    proba = fed.predict_proba(frames, drift=True, batch_rows=70)     # five batches: one drift run
    np.testing.assert_allclose(proba, fed.predict_proba(frames))      # drift changes no prediction
    rep = fed.last_drift
    assert rep["n_rows"] == 300
    own = {e["feature"]: e for e in rep["parties"]["bank"]["features"]}
    ref = fed.model.drift["features"]
    cols = ["segment", "income"]
    X = np.column_stack([pd.Categorical(frames["bank"]["segment"], categories=fed.model.categories["segment"]).codes,
                         frames["bank"]["income"]]).astype(float)
    expected = drift.feature_psi(ref, X[:, [cols.index(f["name"]) for f in ref["features"]]])
    assert [own[f["name"]]["psi"] for f in ref["features"]] == pytest.approx(expected)
    assert own["income"]["flag"] == "major"
    bureau_sec = rep["parties"]["bureau"]
    assert bureau_sec["status"] == "ok" and not bureau_sec["named"]          # positions by default
    assert [e["feature"] for e in bureau_sec["features"]] == ["#0", "#1"]
    p = fed.passives["bureau"]
    pref = p.model_dict()["drift_reference"]
    codes = pd.Categorical(frames["bureau"]["education"], categories=p.categories["education"]).codes.astype(float)
    codes[frames["bureau"]["education"].isna().to_numpy()] = np.nan
    Xp = np.column_stack([codes, frames["bureau"]["days_late"]])
    assert [e["psi"] for e in bureau_sec["features"]] == pytest.approx(drift.feature_psi(pref, Xp))
    out = fed.predict_proba(frames, drift=True)
    raw_ref = fed.model.drift["score"]
    assert rep["score"]["features"][0]["psi"] == pytest.approx(drift.feature_psi(raw_ref, out[:, None])[0])
    assert {f["party"] for f in rep["flagged"]} >= {"bank", "bureau"}


def test_names_decline_and_the_row_floor():
    bank, bureau = credit_frames(500)
    fed = _fed(bank.drop(columns="w"), bureau, drift_policy="names")
    frames = _new_rows(bank, bureau)
    fed.predict_proba(frames, drift=True)
    assert [e["feature"] for e in fed.last_drift["parties"]["bureau"]["features"]] == ["education", "days_late"]
    fed.passives["bureau"].drift_policy = "decline"
    fed.predict_proba(frames, drift=True)
    sec = fed.last_drift["parties"]["bureau"]
    assert sec["status"] == "declined" and "does not share drift" in sec["reason"] and "features" not in sec
    fed.passives["bureau"].drift_policy = "names"
    small = {k: v.iloc[:40] for k, v in frames.items()}
    fed.predict_proba(small, drift=True)
    sec = fed.last_drift["parties"]["bureau"]
    assert sec["status"] == "declined" and "at least 100 rows" in sec["reason"]


def test_a_model_from_before_drift_counts_reports_no_training_counts(tmp_path):
    bank, bureau = credit_frames(400)
    fed = _fed(bank.drop(columns="w"), bureau)
    fed.model.drift = None                                  # as a file written before issue 34
    fed.passives["bureau"]._state.drift_reference = None
    fed.save(tmp_path / "old")
    assert "drift" not in json.loads((tmp_path / "old" / "bank.json").read_text())
    assert "drift_reference" not in json.loads((tmp_path / "old" / "bureau.json").read_text())
    old = Federation.load(tmp_path / "old")
    old.predict_proba(_new_rows(bank, bureau), drift=True)
    rep = old.last_drift
    assert rep["score"]["status"] == "no training counts"
    assert rep["parties"]["bank"]["status"] == "no training counts"
    assert rep["parties"]["bureau"]["status"] == "no training counts"
    assert rep["flagged"] == []


def test_a_damaged_reference_is_named(tmp_path):
    bank, bureau = credit_frames(300)
    fed = _fed(bank.drop(columns="w"), bureau)
    d = fed.passives["bureau"].model_dict()
    d["drift_reference"]["features"][0]["counts"] = [1]
    with pytest.raises(Exception, match="drift_reference.*counts"):
        PassiveParty.from_model_dict(d, "bureau.json")


def _run(args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_simulate_prints_credit_metrics_per_segment_and_drift(tmp_path):
    bank, bureau = credit_frames(600)
    bank.drop(columns="w").to_csv(tmp_path / "bank.csv", index=False)
    bureau.to_csv(tmp_path / "bureau.csv", index=False)
    r = _run(["simulate", "--active", tmp_path / "bank.csv", "--passive", tmp_path / "bureau.csv", "--mode", "plain",
              "--rounds", 3, "--depth", 3, "--quiet", "--segment", "segment", "--drift",
              "--output-json", tmp_path / "sim.json", "--predictions", tmp_path / "pred.csv"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "sim.json").read_text())
    pred = pd.read_csv(tmp_path / "pred.csv")
    y = bank.set_index("id").loc[pred["id"], "y"].to_numpy()
    p = pred["proba"].to_numpy()
    o = doc["credit"]["overall"]
    assert o["ks"] == pytest.approx(ks_2samp(p[y == 1], p[y == 0], method="asymp").statistic)
    assert o["gini"] == pytest.approx(2 * doc["test_auc"] - 1)
    seg = bank.set_index("id").loc[pred["id"], "segment"].to_numpy()
    assert set(doc["credit"]["segments"]) == set(seg)
    for v, rep in doc["credit"]["segments"].items():
        assert rep["n"] == int((seg == v).sum())
        assert rep["ks"] == pytest.approx(credit_metrics.ks(y[seg == v], p[seg == v])["ks"])
    assert f"KS {o['ks']:.4f}" in r.output and "credit [segment=region_north_Z3]" in r.output
    assert "drift over 120 rows" in r.output and "drift passive1: #0" in r.output
    assert doc["drift"]["parties"]["passive1"]["status"] == "ok"


@pytest.mark.parametrize("args, message", [
    (["--segment", "nope"], "segment column 'nope' is not a column of the active party 'active'"),
    (["--segment", "income"], "segment column 'income' has"),
])
def test_simulate_bad_segment(tmp_path, args, message):
    bank, bureau = credit_frames(200)
    bank.drop(columns="w").to_csv(tmp_path / "bank.csv", index=False)
    bureau.to_csv(tmp_path / "bureau.csv", index=False)
    r = _run(["simulate", "--active", tmp_path / "bank.csv", "--passive", tmp_path / "bureau.csv", "--mode", "plain",
              "--rounds", 2, "--quiet", *args])
    assert r.exit_code == 1 and message in r.output and "Traceback" not in r.output, r.output


def test_federation_evaluate_and_the_estimators_credit_report():
    bank, bureau = credit_frames(500)
    fed = _fed(bank.drop(columns="w"), bureau)
    rows = {"bank": bank.drop(columns="w").iloc[:200], "bureau": bureau.iloc[:200]}
    ev = fed.evaluate(rows, "y", segment="segment", drift=True)
    proba = fed.predict_proba({"bank": rows["bank"].drop(columns="y"), "bureau": rows["bureau"]})
    expected = credit_metrics.credit_report("binary", rows["bank"]["y"].to_numpy(), proba,
                                            segments=rows["bank"]["segment"].to_numpy(), segment_name="segment")
    assert ev["credit"] == expected and ev["drift"]["n_rows"] == 200
    with pytest.raises(Exception, match="no label column 'target'"):
        fed.evaluate(rows, "target")
    with pytest.raises(Exception, match="segment column 'nope'"):
        fed.evaluate(rows, "y", segment="nope")
    X = bank[["income"]].assign(days_late=bureau["days_late"])
    labels = np.where(bank["y"] == 1, "bad", "good")
    est = VerticalBoostingClassifier(n_estimators=3, max_depth=2, mode="plain", parties={"a": ["income"],
                                                                                        "b": ["days_late"]})
    est.fit(X, labels)
    rep = est.credit_report(X, labels, segments=bank["segment"])
    p_pos = est.predict_proba(X)[:, 1]
    assert rep["overall"]["auc"] == pytest.approx(roc_auc_score(labels == est.classes_[1], p_pos))
    assert set(rep["segments"]) == set(bank["segment"])


@pytest.mark.parametrize("params", [
    TrainParams(mode="dp", epsilon=2.0, n_estimators=2, max_depth=2),
    TrainParams(mode="plain", dp_model=4.0, n_estimators=2, max_depth=2, min_node_rows=1),
])
def test_dp_trainings_keep_no_exact_training_counts(params):
    """PSI against exact training counts would tell more than the printed epsilon covers."""
    bank, bureau = credit_frames(400)
    bank, bureau = bank.drop(columns=["w", "segment"]), bureau.drop(columns="education")     # numeric only
    fed = Federation(ActiveParty("bank", bank.iloc[:250]), [PassiveParty("bureau", bureau.iloc[:250])])
    fed.fit(params)
    d = fed.passives["bureau"].model_dict()
    assert "drift_reference" not in d and "DP training" in d["drift_withheld"]
    fed.predict_proba({"bank": bank.iloc[250:].drop(columns="y"), "bureau": bureau.iloc[250:]}, drift=True)
    sec = fed.last_drift["parties"]["bureau"]           # (mode dp never routes its released training rows)
    assert sec["status"] == "no training counts" and "DP training" in sec["reason"]
    if params.dp_model is not None:       # the released model holds no exact counts of the active party either
        assert set(fed.model.drift) == {"withheld"}
        assert fed.last_drift["score"]["status"] == "no training counts"
    reloaded = PassiveParty.from_model_dict(d)
    assert reloaded._state.drift_withheld == d["drift_withheld"]


def test_what_the_active_party_receives_for_drift():
    """Per scoring job: one DriftReply per batch and passive party; only the last holds numbers, one
    PSI per feature (names only by the party's choice), never counts or bin edges."""
    bank, bureau = credit_frames(500)
    p = PassiveParty("bureau", bureau)
    fed = Federation(ActiveParty("bank", bank.drop(columns="w")), [p], record=True)
    fed.fit(PARAMS)
    fed.transport.log.clear()
    fed.predict_proba(_new_rows(bank, bureau), drift=True, batch_rows=100)
    replies = [loads(frame) for sender, _, frame in fed.transport.log if sender == "bureau"]
    drift_replies = [r for r in replies if isinstance(r, m.DriftReply)]
    assert len(drift_replies) == 3
    assert [r.status for r in drift_replies] == ["counted", "counted", "psi"]
    assert all(r.psi.size == 0 and r.names == [] for r in drift_replies[:2])
    last = drift_replies[-1]
    assert last.psi.shape == (2,) and last.names == [] and last.n_rows == 300
    assert set(dataclasses.asdict(last)) == {"status", "psi", "names", "n_rows", "reason"}
