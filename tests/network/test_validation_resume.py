"""The learner in network deployments: passive servers with validation rows, checkpoints that keep
the metric history, resume with a validation set, and `vfl party` / `vfl predict` processes for
multiclass string labels and regression."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support import cli_command, start_passive

from parties.active import ActiveParty
from parties.checkpoint import Checkpoint
from parties.server import PassiveServer
from protocols.transport import InMemoryTransport
from vfl.api import Federation, PassiveParty
from vfl.core.params import TrainParams

pytestmark = pytest.mark.slow   # real party processes / worker pools, multi-second

ROOT = Path(__file__).resolve().parents[2]


def frames(n=240, seed=0, labels=("bus", "car", "van")):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    z = X[:, 0] + X[:, 2] - 0.5 * X[:, 3] + 0.6 * rng.normal(size=n)
    y = np.array(labels, dtype=object)[np.digitize(z, [-0.6, 0.6])]
    ids = np.arange(n) * 3 + 1
    a = pd.DataFrame({"id": ids, "y": y, "a0": X[:, 0], "a1": X[:, 1]})
    b = pd.DataFrame({"id": ids, "b0": X[:, 2], "b1": X[:, 3]})
    cut = int(0.75 * n)
    return (a.iloc[:cut], b.iloc[:cut]), (a.iloc[cut:], b.iloc[cut:])


def _server(tmp, frame, val_frame, name="b"):
    return PassiveServer(name, frame, "id", tmp / name, validation_frame=val_frame)


def _fit(active, servers, params, **kw):
    t = InMemoryTransport(active.name, {n: s.handle_frame for n, s in servers.items()})
    return active.fit(t, list(servers), params, **kw)


PARAMS = TrainParams(mode="plain", objective="multiclass", n_estimators=40, max_depth=4, learning_rate=1.0,
                     min_child_weight=0.0, early_stopping_rounds=3)


def test_passive_server_with_validation_rows_matches_the_in_memory_federation(tmp_path):
    (a, b), (va, vb) = frames()
    model = _fit(ActiveParty("a", a), {"b": _server(tmp_path, b, vb)}, PARAMS, validation=va)
    ref = Federation(ActiveParty("a", a), [PassiveParty("b", b)])
    ref.fit(PARAMS, validation={"a": va, "b": vb})
    assert model.history == ref.model.history and model.best_iteration == ref.model.best_iteration
    assert model.n_rounds == model.best_iteration + 4 < 40 and model.classes == ["bus", "car", "van"]
    assert [t.structure() for r in model.rounds for t in r] == \
        [t.structure() for r in ref.model.rounds for t in r]


class _Dies(Exception):
    pass


def test_resume_with_a_validation_set_continues_history_and_early_stopping(tmp_path):
    (a, b), (va, vb) = frames()
    full = _fit(ActiveParty("a", a), {"b": _server(tmp_path / "full", b, vb)}, PARAMS, validation=va)
    saved = []

    def die(r, info):
        if r == 2:
            raise _Dies()

    with pytest.raises(_Dies):
        _fit(ActiveParty("a", a), {"b": _server(tmp_path, b, vb)}, PARAMS, validation=va, on_round=die,
             checkpoint=saved.append)
    ck = saved[-1]
    ck.save(tmp_path / "ck.json")
    ck = Checkpoint.load(tmp_path / "ck.json")
    assert ck.n_rounds == 3 and len(ck.history["train"]["mlogloss"]) == 3      # history in the checkpoint
    resumed = _fit(ActiveParty("a", a), {"b": _server(tmp_path, b, vb)}, PARAMS, validation=va, resume=ck)
    assert resumed.history == full.history
    assert resumed.best_iteration == full.best_iteration and resumed.n_rounds == full.n_rounds


# --------------------------------------------------------------------------- processes
pytest.importorskip("grpc")


def test_processes_multiclass_string_labels_with_validation_and_predict(tmp_path, children):
    (a, b), (va, vb) = frames(n=160)
    # the passive party's data holds all its rows (training and validation ids): it scores them later
    for df, f in ((a, "a.csv"), (pd.concat([b, vb]), "b.csv"), (va, "va.csv"), (vb, "vb.csv"),
                  (va.drop(columns="y"), "vx.csv")):
        df.to_csv(tmp_path / f, index=False)
    addr = start_passive(children, tmp_path, "b", "--data", tmp_path / "b.csv",
                         "--validation-data", tmp_path / "vb.csv", "--model-dir", tmp_path / "m_b", "--insecure")
    out = tmp_path / "train.json"
    r = subprocess.run(cli_command("party", "active", "--name", "a", "--data", tmp_path / "a.csv",
                                   "--peer", f"b={addr}",
                                   "--model-dir", tmp_path / "m_a", "--insecure", "--mode", "plain", "--quiet",
                                   "--objective", "multiclass", "--rounds", 30, "--learning-rate", 1.0,
                                   "--validation-data", tmp_path / "va.csv", "--early-stopping-rounds", 2,
                                   "--output-json", out), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["classes"] == ["bus", "car", "van"] and res["n_validation"] == 40
    assert res["n_rounds"] == res["best_iteration"] + 3 < 30 and "best iteration" in r.stdout
    pred = tmp_path / "pred.csv"
    r = subprocess.run(cli_command("predict", "--model-dir", tmp_path / "m_a", "--data", tmp_path / "vx.csv",
                                   "--peer", f"b={addr}", "--out", pred, "--insecure"),
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    p = pd.read_csv(pred)
    assert list(p.columns) == ["id", "prediction", "proba_bus", "proba_car", "proba_van"]
    assert np.mean(p["prediction"].to_numpy() == va["y"].to_numpy()) > 0.6
    # the same model in memory gives the same probabilities
    ref = Federation(ActiveParty("a", a), [PassiveParty("b", b)])
    ref.fit(TrainParams(mode="plain", objective="multiclass", n_estimators=30, learning_rate=1.0,
                        early_stopping_rounds=2), validation={"a": va, "b": vb})
    proba = ref.predict_proba({"a": va.drop(columns="y"), "b": vb})
    np.testing.assert_allclose(p[["proba_bus", "proba_car", "proba_van"]].to_numpy(), proba, atol=1e-12)
