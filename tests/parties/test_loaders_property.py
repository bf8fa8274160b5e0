"""Property tests of the passive lookup-table loader and the checkpoint loader (issue 10 #6, #11):
any mutation of a valid file either loads as something usable or is refused with an InputError
naming the file and the field -- never an IndexError/KeyError/TypeError."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import examples, mutated, small_frames

from datasets.errors import InputError
from parties.active import ActiveParty
from parties.checkpoint import Checkpoint
from parties.passive import PassiveParty, check_model_dict, model_hash
from protocols.transport import InMemoryTransport, frame_handler
from vfl.api import Federation
from vfl.core.params import TrainParams

SETTINGS = settings(max_examples=examples(250), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def docs():
    a, b, c = small_frames(n=120)
    fed = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)])
    params = TrainParams(mode="plain", n_estimators=3, max_depth=3)
    fed.fit(params)
    passive = fed.passives["b"].file_dict()
    saved = []
    t = InMemoryTransport("a", {"b": frame_handler(PassiveParty("b", b).handle),
                                "c": frame_handler(PassiveParty("c", c).handle)})
    ActiveParty("a", a).fit(t, ["b", "c"], params, checkpoint=saved.append)
    ck = saved[-1].to_dict()
    return json.loads(json.dumps(passive)), json.loads(json.dumps(ck)), len(a.columns) - 2


def _passive_usable(p: PassiveParty):
    n = len(p.records)
    if n:
        rec = np.arange(n)
        x = np.linspace(-3, 3, n)
        x[::3] = np.nan
        assert p._state.table.go_left(rec, x).shape == (n,)
    p.feature_importance("split")
    PassiveParty.from_model_dict(json.loads(json.dumps(p.file_dict())), "again.json")


def test_valid_files_load(docs):
    passive, ck, n_features = docs
    _passive_usable(PassiveParty.from_model_dict(copy.deepcopy(passive), "b.json"))
    c = Checkpoint.from_dict(copy.deepcopy(ck), "checkpoint.json")
    c.check_features(n_features)
    assert c.n_rounds == 3 and c.raw.shape == (120, 1)


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_a_mutated_lookup_table_is_usable_or_refused_naming_the_file(docs, data):
    passive, _, _ = docs
    base = {k: v for k, v in passive.items() if k != "model_hash"}     # fuzz the structure, not the hash
    doc, _, _ = data.draw(mutated(base))
    try:
        p = PassiveParty.from_model_dict(doc, "b.json")
    except InputError as exc:
        assert "b.json" in str(exc)
        return
    _passive_usable(p)


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_a_mutated_checkpoint_is_usable_or_refused_naming_the_file(docs, data):
    _, ck, n_features = docs
    doc, _, _ = data.draw(mutated(ck))
    try:
        c = Checkpoint.from_dict(doc, "checkpoint.json")
        c.check_features(n_features)
    except InputError as exc:
        assert "checkpoint.json" in str(exc)
        return
    again = Checkpoint.from_dict(json.loads(json.dumps(c.to_dict())), "again.json")
    assert again.n_rounds == c.n_rounds and again.records == c.records
    if c.raw is not None:
        assert c.raw.shape[0] == c.n_rows and np.all(np.isfinite(c.raw))


def test_the_recorded_hashes_catch_edits(docs):
    passive, _, _ = docs
    doc = copy.deepcopy(passive)
    assert doc["model_hash"] == model_hash(doc)
    doc["records"][0]["default_left"] = not doc["records"][0]["default_left"]
    with pytest.raises(InputError, match=r"b\.json was modified after it was written"):
        check_model_dict(doc, "b.json")
    doc = copy.deepcopy(passive)
    doc["records"][0]["gain"] = 1.0                 # shared split gains do not change the model
    assert check_model_dict(doc, "b.json")


def test_a_saved_checkpoint_records_its_hash(docs, tmp_path):
    _, ck, _ = docs
    Checkpoint.from_dict(copy.deepcopy(ck)).save(tmp_path / "checkpoint.json")
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    assert len(doc["content_hash"]) == 64
    doc["n_rows"] += 0
    doc["model_id"] = "other"
    (tmp_path / "checkpoint.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"checkpoint\.json was modified after it was written"):
        Checkpoint.load(tmp_path / "checkpoint.json")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["rounds"][0][0]["nodes"][0].__setitem__("left", 99), r"rounds\[0\]\[0\]\.nodes\[0\]\.left"),
    (lambda d: d["records"].__setitem__("b", 1), r"records\.b"),
    (lambda d: d["raw"].__setitem__("shape", [3, 1]), r"raw\.data"),
    (lambda d: d["raw"].__setitem__("data", "!!"), r"raw\.data"),
    (lambda d: d.__setitem__("n_rows", 7), r"raw"),
    (lambda d: d.__setitem__("rounds", [[]]), r"rounds\[0\]"),
])
def test_checkpoint_damage_is_named_by_field(docs, edit, field):
    _, ck, _ = docs
    doc = copy.deepcopy(ck)
    edit(doc)
    with pytest.raises(InputError, match=rf"checkpoint\.json is damaged: field {field}"):
        Checkpoint.from_dict(doc, "checkpoint.json")


def test_a_checkpoint_naming_a_feature_the_active_party_lacks_is_refused(docs):
    _, ck, n_features = docs
    doc = copy.deepcopy(ck)
    node = next(n for r in doc["rounds"] for t in r for n in t["nodes"] if not n["is_leaf"] and n["owner"] == "a")
    node["feature_idx"] = n_features
    c = Checkpoint.from_dict(doc, "checkpoint.json")
    with pytest.raises(InputError, match=r"feature_idx: 2 is out of range"):
        c.check_features(n_features, "checkpoint.json")
