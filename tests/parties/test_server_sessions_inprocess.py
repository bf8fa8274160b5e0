"""The passive party's server (parties.server.PassiveServer) in process, the twin of what the
network tests do over gRPC: the model directory it loads (foreign and damaged files ignored, each
named in the log), TrainResume refusals naming what does not match, prediction sessions owned by
their client, unfinished models refused for prediction."""
import json
import logging

import numpy as np
import pytest
from support import small_frames

from parties.active import ActiveParty
from parties.server import PassiveServer
from protocols import messages as m
from protocols.serialization import dumps, loads
from protocols.transport import InMemoryTransport, PeerError, frame_handler
from vfl.core.errors import InputError, ProtocolError
from vfl.core.params import TrainParams

PARAMS = TrainParams(mode="plain", n_estimators=3, max_depth=2)


class _Dies(Exception):
    pass


def _frames():
    a, b, _ = small_frames(60)
    return a, b


def _transport(server, tamper=None, seen=None):
    def handle(request):
        if seen is not None:
            seen.append(request)
        return server.handle(tamper(request) if tamper else request, "bank@test", "bank")
    return InMemoryTransport("bank", {"telco": frame_handler(handle)})


def _fit(server, a, resume=None, tamper=None, seen=None, **kw):
    active = ActiveParty("bank", a)
    active.fit(_transport(server, tamper, seen), ["telco"], PARAMS, resume=resume, **kw)
    return active


def _interrupted(tmp_path, a, b):
    """A training stopped after its first round: (server, the checkpoint of round 1)."""
    server = PassiveServer("telco", b, "id", tmp_path / "telco")
    saved = []

    def die(r, info):
        if r == 1:
            raise _Dies()
    with pytest.raises(_Dies):
        _fit(server, a, on_round=die, checkpoint=saved.append)
    return server, saved[0]


def test_the_model_dir_must_be_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=f"--model-dir {tmp_path / 'file'} is not a directory"):
        PassiveServer("telco", _frames()[1], "id", tmp_path / "file")


def test_foreign_and_damaged_files_in_the_model_dir_are_ignored_and_named(tmp_path, caplog):
    a, b = _frames()
    server = PassiveServer("telco", b, "id", tmp_path / "telco")
    _fit(server, a)
    (model_id,) = server.models
    good = json.loads(server.model_path(model_id).read_text())
    d = tmp_path / "telco"
    (d / "broken.json").write_text("{not json")
    (d / "other.json").write_text(json.dumps(dict(good, party="insurer", model_id="other")))
    (d / "notes.json").write_text(json.dumps({"format": "something else"}))
    (d / "bad.json").write_text(json.dumps(dict(good, model_id="bad", records="not a list")))
    logger = logging.getLogger("vfl.passive")       # the CLI's logging setup stops "vfl" propagating: listen here
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="vfl.passive"):
            again = PassiveServer("telco", b, "id", d)
    finally:
        logger.removeHandler(caplog.handler)
    assert set(again.models) == {model_id} and not again.unfinished
    text = caplog.text
    assert "ignoring unreadable file" in text and "broken.json" in text
    assert "other.json: it belongs to party 'insurer'" in text
    assert "ignoring model file" in text and "bad.json" in text
    assert "notes.json" not in text                   # not a model file at all: skipped quietly


def test_a_resume_must_name_the_session_model_and_match_its_records(tmp_path):
    a, b = _frames()
    server, ck = _interrupted(tmp_path, a, b)
    assert server.unfinished == {ck.model_id}

    def other_model(req):
        return m.TrainResume("another", req.n_rounds, req.n_records) if isinstance(req, m.TrainResume) else req
    with pytest.raises(PeerError, match=f"TrainResume for model 'another' but the session set up '{ck.model_id}'"):
        _fit(server, a, resume=ck, tamper=other_model)

    def more_records(req):
        return m.TrainResume(req.model_id, req.n_rounds, req.n_records + 1) if isinstance(req, m.TrainResume) \
            else req
    with pytest.raises(InputError, match=f"party 'telco' holds {ck.records['telco']} records for the first 1 rounds "
                                        f"of model '{ck.model_id}' but the active party's checkpoint refers to "
                                        f"{ck.records['telco'] + 1}"):
        _fit(server, a, resume=ck, tamper=more_records)
    resumed = _fit(server, a, resume=ck)              # the refusals changed nothing: the resume still works
    assert len(resumed.model.rounds) == PARAMS.n_estimators and server.models.keys() == {ck.model_id}


def test_a_complete_model_is_reopened_only_with_all_its_records(tmp_path):
    a, b = _frames()
    server = PassiveServer("telco", b, "id", tmp_path / "telco")
    saved = []
    _fit(server, a, checkpoint=saved.append)
    early = saved[0]                                  # after round 1 of 3: fewer records than the model holds
    n_all = len(json.loads(server.model_path(early.model_id).read_text())["records"])
    with pytest.raises(InputError, match=f"model '{early.model_id}' is complete with {n_all} records; the active "
                                        f"party's checkpoint refers to {early.records['telco']}: cannot resume it"):
        _fit(server, a, resume=early)


def test_an_unfinished_model_is_not_served_for_prediction(tmp_path):
    a, b = _frames()
    server, ck = _interrupted(tmp_path, a, b)
    start = m.PredictStart(ck.model_id, "s1", np.zeros((1, 16), np.uint8))
    with pytest.raises(InputError, match=f"model '{ck.model_id}' is unfinished \\(its training was interrupted\\): "
                                         "resume the training before predicting"):
        server.handle(start, "bank@test", "bank")
    with pytest.raises(InputError, match="party 'telco' holds no model 'nope'"):
        server.handle(m.PredictStart("nope", "s1", start.hashes), "bank@test", "bank")


def test_prediction_sessions_belong_to_their_client(tmp_path):
    a, b = _frames()
    server = PassiveServer("telco", b, "id", tmp_path / "telco")
    active = _fit(server, a)
    seen = []
    active.predict_raw(_transport(server, seen=seen), a, prediction="node")
    (start,) = [r for r in seen if isinstance(r, m.PredictStart)]
    route = next(r for r in seen if isinstance(r, m.RouteRequest))
    assert server.open_sessions() == 0
    server.handle(start, "bank@test", "bank")                  # the same session opened again, by hand
    assert server.open_sessions("bank") == 1
    with pytest.raises(ProtocolError, match=f"prediction session '{start.session_id}' is already open"):
        server.handle(start, "bank@test", "bank")
    with pytest.raises(ProtocolError, match=f"prediction session '{start.session_id}' belongs to another client"):
        server.handle(route, "mallory@test", "mallory")
    reply = server.handle(route, "bank@test", "bank")
    assert isinstance(reply, m.RouteResponse) and len(reply.go_left) == len(route.rows)
    server.handle(m.PredictEnd(start.session_id), "bank@test", "bank")
    assert server.open_sessions() == 0
    with pytest.raises(ProtocolError, match=f"unknown or expired prediction session '{start.session_id}'"):
        server.handle(route, "bank@test", "bank")
    assert isinstance(server.handle(m.PredictEnd(start.session_id), "bank@test", "bank"), m.Ack)
    # through bytes too: the refusal is an ErrorReply naming the session
    reply = loads(server.handle_frame(dumps(route), "bank@test", "bank"))
    assert isinstance(reply, m.ErrorReply) and "unknown or expired prediction session" in reply.message
