"""The credit-risk learner through the public face (issue 15, items 1-3): he training with
categorical features, weights and monotone constraints at both parties; what the active party
receives (no category value); model files; `vfl simulate` options."""
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from credit_support import EDUCATION, REGION, credit_frames
from support import KEY_BITS

import cli
from datasets.errors import InputError
from protocols.serialization import loads
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams, load_federation

PARAMS = dict(n_estimators=3, max_depth=3, learning_rate=0.5, min_data_per_group=5, cat_smooth=1.0,
              monotone_constraints={"income": -1})


def _fed(bank, bureau, record=False):
    return Federation(ActiveParty("bank", bank, weight_col="w"),
                      [PassiveParty("bureau", bureau, monotone={"days_late": +1})], record=record)


@pytest.mark.parametrize("scheme", ["paillier", "ou"])
def test_he_splits_on_categories_at_both_parties(scheme):
    """(he == plain here: tests/test_he_equals_plain.py, credit-categorical-weights-monotone-*)"""
    bank, bureau = credit_frames()
    fed = _fed(bank, bureau)
    fed.fit(TrainParams(mode="he", key_bits=KEY_BITS, scheme=scheme, **PARAMS))
    nodes = [n for r in fed.model.rounds for t in r for n in t.nodes if not n.is_leaf]
    assert any(n.categories is not None for n in nodes)                   # active categorical split
    assert any(r.get("categories") is not None for r in fed.passives["bureau"].records)


def test_the_active_party_never_receives_a_category_value():
    bank, bureau = credit_frames()
    fed = _fed(bank, bureau, record=True)
    fed.fit(TrainParams(mode="plain", **PARAMS))
    assert any(r.get("categories") for r in fed.passives["bureau"].records)
    for prediction in ("one-round", "node"):
        fed.predict_proba({"bank": bank.drop(columns="y"), "bureau": bureau}, prediction=prediction)
    received = [frame for sender, receiver, frame in fed.transport.log if receiver == "bank"]
    assert received
    blob = b"".join(received)
    # whole values only: a 2-byte fragment like "Q7" turns up by chance in random id hashes
    for value in EDUCATION + ["education"]:
        assert value.encode() not in blob
    for frame in received:
        loads(frame)                                 # every frame is a protocol message
    # what the bureau declared at setup: positions only (categorical, monotone)
    info = next(loads(f) for s, r, f in fed.transport.log if r == "bank" and type(loads(f)).__name__ == "BinningInfo")
    assert info.categorical.tolist() == [True, False] and info.monotone.tolist() == [0, 1]


def test_model_files_keep_categories_and_unseen_categories_go_right(tmp_path):
    bank, bureau = credit_frames()
    fed = _fed(bank, bureau)
    fed.fit(TrainParams(mode="plain", **PARAMS))
    fed.save(tmp_path)
    saved = json.loads((tmp_path / "bureau.json").read_text())
    assert saved["categories"]["education"] == sorted(EDUCATION)
    assert saved["monotone"] == {"days_late": 1}
    loaded = load_federation(tmp_path)
    frames = {"bank": bank.drop(columns=["y", "w"]), "bureau": bureau}
    assert np.allclose(loaded.predict_raw(frames), fed.predict_raw(frames), atol=0)
    # an unseen category routes like a category that is in no left set: right at every split
    unseen = dict(frames, bureau=bureau.assign(education="edu_phd_never_seen"))
    never_left = sorted(set(EDUCATION) - {EDUCATION[c] for r in fed.passives["bureau"].records
                                           if r.get("categories") for c in r["categories"]})
    assert np.all(np.isfinite(loaded.predict_raw(unseen)))
    if never_left:
        assert np.allclose(loaded.predict_raw(unseen),
                           loaded.predict_raw(dict(frames, bureau=bureau.assign(education=never_left[0]))))


def test_simulate_with_categorical_columns_monotone_constraints_and_weights(tmp_path):
    bank, bureau = credit_frames()
    bank.to_csv(tmp_path / "bank.csv", index=False)
    bureau.to_csv(tmp_path / "bureau.csv", index=False)
    out = tmp_path / "r.json"
    args = ["simulate", "--active", tmp_path / "bank.csv", "--passive", tmp_path / "bureau.csv", "--mode", "plain",
            "--rounds", 3, "--weight-col", "w", "--monotone", "days_late=+1", "--monotone", "income=-1",
            "--min-data-per-group", 5, "--quiet", "--output-json", out, "--save-model", tmp_path / "m"]
    res = CliRunner().invoke(cli.main, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    assert r["params"]["monotone_constraints"] == {"days_late": 1, "income": -1} and r["test_auc"] > 0.7
    assert set(r["test_weighted"]) == {"auc", "logloss", "error"} and r["test_weighted"]["auc"] > 0.7
    passive = json.loads((tmp_path / "m" / "passive1.json").read_text())
    active = json.loads((tmp_path / "m" / "active.json").read_text())
    assert passive["monotone"] == {"days_late": 1} and "education" in passive["categories"]
    assert active["params"]["monotone_constraints"] == {"income": -1} and "w" not in active["active_features"]
    assert f"active ({len(active['active_features'])} features)" in res.output    # the weights are no feature
    assert out.stat().st_mode & 0o777 == 0o644                                    # a report: shareable
    assert (tmp_path / "m" / "active.json").stat().st_mode & 0o777 == 0o600       # a model: private
    assert active["categories"] == {"segment": sorted(REGION)}


@pytest.mark.parametrize("extra, message", [
    (["--monotone", "days_late"], "expected COLUMN=\\+1"),
    (["--monotone", "education=+1"], "categorical feature cannot be constrained"),
    (["--monotone", "nope=-1"], "'nope' is not a feature column of any party"),
    (["--categorical", "nope"], "categorical column 'nope' is not a feature column"),
    (["--weight-col", "nope"], "weight column 'nope' not found"),
])
def test_simulate_bad_credit_options(tmp_path, extra, message):
    bank, bureau = credit_frames(60)
    bank.to_csv(tmp_path / "bank.csv", index=False)
    bureau.to_csv(tmp_path / "bureau.csv", index=False)
    res = CliRunner().invoke(cli.main, ["simulate", "--active", str(tmp_path / "bank.csv"), "--passive",
                                        str(tmp_path / "bureau.csv"), "--mode", "plain", "--rounds", "1",
                                        "--quiet", *extra])
    assert res.exit_code != 0
    assert re.search(message, res.output), res.output


def test_weights_through_the_api_are_checked():
    bank, bureau = credit_frames(50)
    fed = Federation(ActiveParty("bank", bank.drop(columns="w")), [PassiveParty("bureau", bureau)])
    with pytest.raises(InputError, match="negative"):
        fed.fit(TrainParams(mode="plain", n_estimators=1), sample_weight=-np.ones(50))


def test_mode_dp_refuses_passive_categories_and_constraints_clearly():
    bank, bureau = credit_frames(80)
    fed = Federation(ActiveParty("bank", bank.drop(columns="w")), [PassiveParty("bureau", bureau)])
    with pytest.raises(InputError, match="party 'bureau': categorical features are not supported in mode dp"):
        fed.fit(TrainParams(mode="dp", epsilon=4.0, n_estimators=1))
    fed = Federation(ActiveParty("bank", bank.drop(columns="w")),
                     [PassiveParty("bureau", bureau.drop(columns="education"), monotone={"days_late": 1})])
    with pytest.raises(InputError, match="monotone constraints are not supported in mode dp"):
        fed.fit(TrainParams(mode="dp", epsilon=4.0, n_estimators=1))


def test_simulate_categorical_column_of_one_party_when_both_use_the_name(tmp_path):
    bank, bureau = credit_frames(120)
    bank["score"] = np.linspace(0, 1, 120)
    bureau["score"] = np.arange(120) % 3
    bank.to_csv(tmp_path / "bank.csv", index=False)
    bureau.to_csv(tmp_path / "bureau.csv", index=False)
    base = ["simulate", "--active", str(tmp_path / "bank.csv"), "--passive", str(tmp_path / "bureau.csv"),
            "--mode", "plain", "--rounds", "1", "--quiet", "--save-model", str(tmp_path / "m")]
    res = CliRunner().invoke(cli.main, base + ["--categorical", "score"])
    assert res.exit_code != 0 and "write PARTY:score" in res.output
    res = CliRunner().invoke(cli.main, base + ["--categorical", "passive1:score"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "m" / "passive1.json").read_text())["categories"]["score"] == [0, 1, 2]
    assert "score" not in json.loads((tmp_path / "m" / "active.json").read_text()).get("categories", {})
