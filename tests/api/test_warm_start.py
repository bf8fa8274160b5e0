"""Warm start (issue 37 item 9): continuing a completed model with more rounds gives, with the same
data and parameters, the trees of training all rounds at once (in he and plain, with row
sampling and GOSS: the round index keys every round's randomness), in one process and against a
passive party's server (its own model files); the passive party continues only its own completed
models, for their trainer, under the new total's round bound; the saved model stays usable."""
import json
import pickle

import numpy as np
import pytest
from click.testing import CliRunner
from support import KEY_BITS, small_frames

from cli import main
from parties.active import ActiveParty
from parties.checkpoint import Checkpoint
from parties.federation import Access
from parties.passive import PassiveParty
from parties.server import PassiveServer
from protocols import messages as m
from protocols.transport import InMemoryTransport, PeerError, frame_handler
from vfl.api import Federation, load_federation
from vfl.core.errors import InputError, ProtocolError
from vfl.core.params import TrainParams
from vfl.estimators import VerticalBoostingClassifier, VerticalBoostingRegressor

BASE = dict(max_depth=3, key_bits=KEY_BITS, min_node_rows=4)


def _fed(n=160):
    a, b, c = small_frames(n)
    return Federation(ActiveParty("bank", a), [PassiveParty("telco", b), PassiveParty("shop", c)])


def _trees(model):
    return [t.to_dict() for rnd in model.rounds for t in rnd]


def _new_rows():
    a, b, c = small_frames(50, seed=7)
    return {"bank": a.drop(columns="y"), "telco": b, "shop": c}


@pytest.mark.parametrize("mode", ["plain", pytest.param("he", marks=pytest.mark.slow)])
def test_three_rounds_then_two_more_equal_five_at_once_in_process(mode, tmp_path):
    params = TrainParams(mode=mode, n_estimators=5, **BASE)
    full = _fed()
    full.fit(params)
    part = _fed()
    base = part.fit(TrainParams(mode=mode, n_estimators=3, **BASE))
    part.save(tmp_path / "m3")
    warm = part.fit(params, warm_start=base)
    assert warm.model_id != base.model_id and warm.salt == base.salt
    assert warm.history["warm_start"] == {"model_id": base.model_id, "n_rounds": 3}
    assert _trees(warm) == _trees(full.model) and _trees(warm)[:3] == _trees(base)
    assert warm.base_score == full.model.base_score
    np.testing.assert_array_equal(part.predict_raw(_new_rows()), full.predict_raw(_new_rows()))
    # the saved 3-round model still predicts as before (its passive files are untouched)
    again = load_federation(tmp_path / "m3")
    assert again.model.model_id == base.model_id and again.model.n_rounds == 3


@pytest.mark.parametrize("options", [dict(subsample=0.7), dict(goss=True, learning_rate=0.5)],
                         ids=["subsample", "goss"])
def test_a_warm_start_from_a_directory_draws_the_same_row_samples(options, tmp_path):
    """Row sampling is keyed on the round index: the warm-started rounds draw what rounds 3 and 4
    of an all-at-once training draw (GOSS starts sampling at round 1/learning_rate = 2)."""
    params = TrainParams(mode="plain", n_estimators=5, **BASE, **options)
    full = _fed()
    full.fit(params)
    first = _fed()
    first.fit(TrainParams(mode="plain", n_estimators=3, **BASE, **options))
    first.save(tmp_path / "m3")
    fresh = _fed()          # another process's federation over the same data: the directory is the base
    warm = fresh.fit(params, warm_start=tmp_path / "m3")
    assert _trees(warm) == _trees(full.model)
    assert warm.history["train"] == full.model.history["train"]
    np.testing.assert_array_equal(fresh.predict_proba(_new_rows()), full.predict_proba(_new_rows()))
    # without the same row sample the trees differ: the test can tell
    other = _fed()
    other.fit(TrainParams(mode="plain", n_estimators=5, seed=1, **BASE, **options))
    assert _trees(other.model) != _trees(full.model)


def test_a_warm_start_must_continue_the_same_training(tmp_path):
    fed = _fed()
    base = fed.fit(TrainParams(mode="plain", n_estimators=3, **BASE))
    fed.save(tmp_path / "m3")
    with pytest.raises(InputError, match="training parameters differ from the saved model's: max_depth 3 -> 4"):
        fed.fit(TrainParams(mode="plain", n_estimators=5, **{**BASE, "max_depth": 4}), warm_start=base)
    with pytest.raises(InputError, match="the saved model has 3 rounds; n_estimators 3 is the new total"):
        fed.fit(TrainParams(mode="plain", n_estimators=3, **BASE), warm_start=base)
    with pytest.raises(InputError, match="dp-mode trainings and DP released models cannot be continued"):
        fed.fit(TrainParams(mode="dp", epsilon=1.0, n_estimators=5, **BASE), warm_start=base)
    a, b, c = small_frames(160)
    two = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    with pytest.raises(InputError, match="has no lookup table of party 'shop' here"):
        two.fit(TrainParams(mode="plain", n_estimators=5, **BASE), warm_start=tmp_path / "m3")
    with pytest.raises(InputError, match="is not this federation's current model"):
        _fed().fit(TrainParams(mode="plain", n_estimators=5, **BASE), warm_start=base)


# --- against a passive party's server (its model directory), in process -----------------------------
PARAMS3 = TrainParams(mode="plain", n_estimators=3, **BASE)
PARAMS5 = TrainParams(mode="plain", n_estimators=5, **BASE)


def _transport(server, client="bank", tamper=None):
    def handle(request):
        return server.handle(tamper(request) if tamper else request, f"{client}@test", client)
    return InMemoryTransport("bank", {"telco": frame_handler(handle)})


def _server(tmp_path, b, tls=True):
    return PassiveServer("telco", b, "id", tmp_path / "telco",
                         access=Access("telco", tls, allowed_clients=("bank", "mallory")))


def test_a_passive_server_continues_its_own_completed_model_into_a_new_file(tmp_path):
    a, b, _ = small_frames(160)
    server = _server(tmp_path, b)
    base = ActiveParty("bank", a).fit(_transport(server), ["telco"], PARAMS3)
    before = server.model_path(base.model_id).read_bytes()
    active = ActiveParty("bank", a)
    warm = active.fit(_transport(server), ["telco"], PARAMS5, warm_start=base)
    ref = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    ref.fit(PARAMS5)
    assert _trees(warm) == _trees(ref.model)
    assert server.model_path(base.model_id).read_bytes() == before        # the base is not changed
    new = json.loads(server.model_path(warm.model_id).read_text())
    assert new["completed"] and new["records"][:len(json.loads(before)["records"])] == json.loads(before)["records"]
    assert set(server.models) == {base.model_id, warm.model_id}
    _, p_warm = active.predict_proba(_transport(server), a.drop(columns="y"))     # the server scores its own rows
    np.testing.assert_array_equal(p_warm, ref.predict_proba({"bank": a.drop(columns="y"), "telco": b}))


def test_only_the_trainer_continues_a_model_and_only_a_completed_one(tmp_path):
    a, b, _ = small_frames(160)
    server = _server(tmp_path, b)
    base = ActiveParty("bank", a).fit(_transport(server), ["telco"], PARAMS3)
    # another client that got hold of the active model (and its scores) cannot continue the model
    with pytest.raises(PeerError, match=f"model '{base.model_id}' was trained by another client; only its "
                                        "trainer may continue it"):
        ActiveParty("bank", a).fit(_transport(server, "mallory"), ["telco"], PARAMS5, warm_start=base,
                                   warm_transport=_transport(server))
    # a base the party does not hold as a completed model
    def unknown(req):
        return m.TrainContinue("feedfeedfeedfeed", req.n_rounds, req.n_records) \
            if isinstance(req, m.TrainContinue) else req
    with pytest.raises(InputError, match="model 'feedfeedfeedfeed' is not in .*: nothing to continue"):
        ActiveParty("bank", a).fit(_transport(server, tamper=unknown), ["telco"], PARAMS5, warm_start=base)
    # rounds beyond what the setup agreed: nothing is left to train, refused
    def all_rounds(req):
        return m.TrainContinue(req.base_model_id, 5, req.n_records) if isinstance(req, m.TrainContinue) else req
    with pytest.raises(PeerError, match="the base has 5 rounds and the setup agreed 5 in all"):
        ActiveParty("bank", a).fit(_transport(server, tamper=all_rounds), ["telco"], PARAMS5, warm_start=base)
    # a record count that is not the base's
    def more(req):
        return m.TrainContinue(req.base_model_id, req.n_rounds, req.n_records + 1) \
            if isinstance(req, m.TrainContinue) else req
    with pytest.raises(InputError, match="not the same model"):
        ActiveParty("bank", a).fit(_transport(server, tamper=more), ["telco"], PARAMS5, warm_start=base)
    # the refusals changed nothing: the trainer's warm start still works
    warm = ActiveParty("bank", a).fit(_transport(server), ["telco"], PARAMS5, warm_start=base)
    assert warm.n_rounds == 5 and base.model_id in server.models


def test_a_passive_party_numbers_the_continued_rounds_upwards(tmp_path):
    """After TrainContinue the round bound starts past the base's rounds: a request for one of the
    base's rounds is refused (the protocol's 'round bound')."""
    a, b, _ = small_frames(160)
    server = _server(tmp_path, b)
    base = ActiveParty("bank", a).fit(_transport(server), ["telco"], PARAMS3)

    def old_round(req):
        if hasattr(req, "round_idx"):       # every round-numbered request names round 1 of the base
            req.round_idx = 1
        return req
    with pytest.raises(PeerError, match="round bound"):
        ActiveParty("bank", a).fit(_transport(server, tamper=old_round), ["telco"], PARAMS5, warm_start=base)


def test_a_passive_party_refuses_continue_outside_a_fresh_setup():
    """TrainContinue comes right after TrainSetup, before any round: not before a setup, not
    once the rounds started (a requester cannot swap the records of a training under way)."""
    a, b, _ = small_frames(60)
    p = PassiveParty("telco", b)
    with pytest.raises(ProtocolError, match="received a request before TrainSetup"):
        p.handle(m.TrainContinue("abcd", 1, 0))
    fed = Federation(ActiveParty("bank", a), [p])
    fed.fit(TrainParams(mode="plain", n_estimators=2, **BASE))
    p.allow_warm_start()
    with pytest.raises(ProtocolError, match=f"the training of model '{fed.model.model_id}' already started its rounds"):
        p.handle(m.TrainContinue(fed.model.model_id, 1, 0))
    # a DP released model is never continued, whatever the requester sends
    dp_party = PassiveParty("telco", small_frames(200)[1])
    dp_fed = Federation(ActiveParty("bank", small_frames(200)[0]), [dp_party])
    dp_fed.fit(TrainParams(mode="plain", n_estimators=2, max_depth=2, dp_model=4.0))
    with pytest.raises(ProtocolError, match="a DP released model .dp_model. cannot be continued"):
        dp_party.handle(m.TrainContinue(dp_fed.model.model_id, 1, 0))


# --- the estimators: fit(..., xgb_model=...) as in XGBoost's scikit-learn API ------------------------
def _table(n=200):
    a, b, c = small_frames(n)
    X = a.drop(columns=["id", "y"]).join(b.drop(columns="id")).join(c.drop(columns="id"))
    return X, a["y"].to_numpy()


def test_estimators_continue_a_fitted_estimator_or_a_directory(tmp_path):
    X, y = _table()
    kw = dict(mode="plain", max_depth=3, n_parties=3, subsample=0.8)
    full = VerticalBoostingClassifier(n_estimators=5, **kw).fit(X, y)
    part = VerticalBoostingClassifier(n_estimators=3, **kw).fit(X, y)
    warm = VerticalBoostingClassifier(n_estimators=5, **kw).fit(X, y, xgb_model=part)
    assert not np.array_equal(part.predict_proba(X), full.predict_proba(X))
    np.testing.assert_array_equal(warm.predict_proba(X), full.predict_proba(X))
    assert _trees(warm.model_) == _trees(full.model_) and part.model_.n_rounds == 3   # the base is kept
    part.federation_.save(tmp_path / "m3")
    again = VerticalBoostingClassifier(n_estimators=5, **kw).fit(X, y, xgb_model=tmp_path / "m3")
    np.testing.assert_array_equal(again.predict_proba(X), full.predict_proba(X))
    target = X.to_numpy() @ np.arange(1.0, 7.0)
    reg_full = VerticalBoostingRegressor(n_estimators=4, **kw).fit(X, target)
    reg_part = VerticalBoostingRegressor(n_estimators=2, **kw).fit(X, target)
    reg_warm = VerticalBoostingRegressor(n_estimators=4, **kw).fit(X, target, xgb_model=reg_part)
    np.testing.assert_array_equal(reg_warm.predict(X), reg_full.predict(X))
    # scikit-learn's warm_start=True: the next fit continues the estimator's own model (also unpickled)
    est = VerticalBoostingClassifier(n_estimators=3, warm_start=True, **kw).fit(X, y)
    est = pickle.loads(pickle.dumps(est))
    est.set_params(n_estimators=5).fit(X, y)
    np.testing.assert_array_equal(est.predict_proba(X), full.predict_proba(X))
    with pytest.raises(InputError, match="parameter warm_start must be True or False, got 'yes'"):
        VerticalBoostingClassifier(n_estimators=3, warm_start="yes", **kw).fit(X, y)
    with pytest.raises(InputError, match="a VerticalBoostingRegressor cannot be continued by a "
                                         "VerticalBoostingClassifier"):
        VerticalBoostingClassifier(n_estimators=5, **kw).fit(X, y, xgb_model=reg_part)
    with pytest.raises(InputError, match="the estimator given is not fitted"):
        VerticalBoostingClassifier(n_estimators=5, **kw).fit(X, y, xgb_model=VerticalBoostingClassifier())


class _Dies(Exception):
    pass


def test_a_warm_started_training_resumes_with_the_saved_models_base_score(tmp_path):
    """A warm-started training interrupted after its first new round resumes from its checkpoint
    (which holds the saved rounds too and the saved model's base score) to the all-at-once trees."""
    a, b, _ = small_frames(160)
    server = _server(tmp_path, b)
    base = ActiveParty("bank", a).fit(_transport(server), ["telco"], PARAMS3)
    saved = []

    def die(r, info):
        if r == 3:
            raise _Dies()
    with pytest.raises(_Dies):
        ActiveParty("bank", a).fit(_transport(server), ["telco"], PARAMS5, warm_start=base, on_round=die,
                                   checkpoint=saved.append)
    saved[-1].save(tmp_path / "ck.json")
    ck = Checkpoint.load(tmp_path / "ck.json")
    assert ck.n_rounds == 4 and ck.base_score == base.base_score and ck.salt == base.salt
    resumed = ActiveParty("bank", a).fit(_transport(server), ["telco"], PARAMS5, resume=ck)
    ref = Federation(ActiveParty("bank", a), [PassiveParty("telco", b)])
    ref.fit(PARAMS5)
    assert _trees(resumed) == _trees(ref.model) and resumed.base_score == ref.model.base_score


def test_a_warm_start_on_more_rows_keeps_the_saved_trees_and_base_score(tmp_path):
    """New rows (as in XGBoost): the saved model scores every training row first; its trees and
    base score stay, the new rounds fit the larger table."""
    a, b, c = small_frames(200)
    old = Federation(ActiveParty("bank", a.iloc[:150]), [PassiveParty("telco", b.iloc[:150]),
                                                         PassiveParty("shop", c.iloc[:150])])
    base = old.fit(TrainParams(mode="plain", n_estimators=3, **BASE))
    old.save(tmp_path / "m3")
    new = _fed(200)
    warm = new.fit(TrainParams(mode="plain", n_estimators=5, **BASE), warm_start=tmp_path / "m3")
    assert _trees(warm)[:3] == _trees(base) and warm.base_score == base.base_score
    raw = new.predict_raw({"bank": a.drop(columns="y"), "telco": b, "shop": c})
    assert raw.shape == (200, 1) and np.isfinite(raw).all()
    ref = _fed(200)
    ref.fit(TrainParams(mode="plain", n_estimators=5, **BASE))
    assert _trees(warm) != _trees(ref.model)        # the first rounds saw 150 rows only


# --- vfl simulate --warm-start ---------------------------------------------------------------------
def _simulate(*args):
    result = CliRunner().invoke(main, ["simulate", "--quiet", "--mode", "plain", "--depth", "3", *map(str, args)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_vfl_simulate_warm_start_equals_all_rounds_at_once(tmp_path):
    _simulate("--rounds", 5, "--predictions", tmp_path / "p5.csv")
    _simulate("--rounds", 3, "--save-model", tmp_path / "m3")
    base_id = load_federation(tmp_path / "m3").model.model_id
    out = _simulate("--rounds", 5, "--warm-start", tmp_path / "m3", "--predictions", tmp_path / "p35.csv",
                    "--save-model", tmp_path / "m35", "--output-json", tmp_path / "r.json")
    assert f"warm start: continued model {base_id} after 3 round(s)" in out
    assert json.loads((tmp_path / "r.json").read_text())["warm_start"] == {"model_id": base_id, "n_rounds": 3}
    assert (tmp_path / "p35.csv").read_bytes() == (tmp_path / "p5.csv").read_bytes()
    result = CliRunner().invoke(main, ["simulate", "--quiet", "--mode", "plain", "--rounds", "5", "--depth", "4",
                                       "--warm-start", str(tmp_path / "m3")])
    assert result.exit_code != 0 and "max_depth 3 -> 4" in result.output


def test_a_warm_start_with_a_validation_set_continues_the_metric_history():
    """The saved rounds' validation scores are recomputed from their trees: the history (and so
    early stopping) is that of all rounds at once."""
    a, b, c = small_frames(300)

    def fed():
        return Federation(ActiveParty("bank", a.iloc[:200]), [PassiveParty("telco", b.iloc[:200]),
                                                              PassiveParty("shop", c.iloc[:200])])
    val = {"bank": a.iloc[200:], "telco": b.iloc[200:], "shop": c.iloc[200:]}
    kw = dict(mode="plain", max_depth=3, eval_metric="auc", min_node_rows=4)
    full = fed().fit(n_estimators=8, validation=val, **kw)
    part = fed()
    part.fit(n_estimators=4, validation=val, **kw)
    warm = part.fit(n_estimators=8, validation=val, warm_start=part.model, **kw)
    assert {k: v for k, v in warm.history.items() if k != "warm_start"} == full.history
    assert len(full.history["validation"]["auc"]) == 8 and _trees(warm) == _trees(full)
