"""Categorical features, sample weights and monotone constraints in network mode: `vfl party
passive --categorical/--monotone`, `vfl party active --categorical/--monotone/--weight-col` and
`vfl predict`, against the same federation in memory (issue 15)."""
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

pytestmark = pytest.mark.slow   # real party processes
pytest.importorskip("grpc")

ROOT = Path(__file__).resolve().parents[2]


def test_network_mode_matches_the_in_memory_federation(tmp_path, children):
    bank, bureau = credit_frames(300)
    bank["grade"] = (np.arange(300) % 5).astype(float)        # a numeric column declared categorical
    bank.to_csv(tmp_path / "bank.csv", index=False)
    bureau.to_csv(tmp_path / "bureau.csv", index=False)
    bank.drop(columns=["y"]).to_csv(tmp_path / "new.csv", index=False)
    addr = start_passive(children, tmp_path, "bureau", "--data", tmp_path / "bureau.csv",
                         "--model-dir", tmp_path / "m_b", "--insecure", "--monotone", "days_late=+1")
    out = tmp_path / "train.json"
    r = subprocess.run(cli_command("party", "active", "--name", "bank", "--data", tmp_path / "bank.csv",
                                   "--peer", f"bureau={addr}", "--model-dir", tmp_path / "m_a", "--insecure",
                                   "--mode", "plain", "--quiet", "--rounds", 3, "--depth", 3, "--learning-rate", 0.5,
                                   "--min-data-per-group", 5, "--cat-smooth", 1.0, "--categorical", "grade",
                                   "--monotone", "income=-1", "--weight-col", "w", "--output-json", out),
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    pred = tmp_path / "pred.csv"
    r = subprocess.run(cli_command("predict", "--model-dir", tmp_path / "m_a", "--data", tmp_path / "new.csv",
                                   "--peer", f"bureau={addr}", "--out", pred, "--insecure"),
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    model = json.loads(Path(json.loads(out.read_text())["model_path"]).read_text())
    assert model["categories"]["grade"] == [0, 1, 2, 3, 4]
    assert model["params"]["monotone_constraints"] == {"income": -1}
    passive_files = list((tmp_path / "m_b").glob("*.json"))
    assert len(passive_files) == 1
    saved = json.loads(passive_files[0].read_text())
    assert saved["monotone"] == {"days_late": 1} and "education" in saved["categories"]
    ref = Federation(ActiveParty("bank", bank, weight_col="w", categorical=["grade"]),
                     [PassiveParty("bureau", bureau, monotone={"days_late": 1})])
    ref.fit(TrainParams(mode="plain", n_estimators=3, max_depth=3, learning_rate=0.5, min_data_per_group=5,
                        cat_smooth=1.0, monotone_constraints={"income": -1}))
    proba = ref.predict_proba({"bank": bank.drop(columns="y"), "bureau": bureau})
    np.testing.assert_allclose(pd.read_csv(pred)["proba"].to_numpy(), proba, atol=1e-12)
