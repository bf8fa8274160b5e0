"""Saved models on disk (issue 10 #4, #11, #15, #17): Federation.save writes every party's file and
then a manifest, all or nothing; load checks the manifest, the model ids and each party's model
hash; damaged and edited files are named; every file is private (0600)."""
from __future__ import annotations

import errno
import json
import os
import stat

import numpy as np
import pytest
from click.testing import CliRunner
from support import small_frames

from cli import main
from datasets import files as wf
from datasets.errors import InputError, WriteError
from parties.passive import model_hash
from vfl.api import ActiveParty, Federation, PassiveParty, TrainParams

PARAMS = TrainParams(mode="plain", n_estimators=3, max_depth=2)


def _fed(seed=0, params=PARAMS):
    a, b, c = small_frames(seed=seed)
    fed = Federation(ActiveParty("a", a), [PassiveParty("b", b), PassiveParty("c", c)])
    fed.fit(params)
    return fed, (a, b, c)


@pytest.fixture(scope="module")
def two_models():
    return _fed(0), _fed(1, TrainParams(mode="plain", n_estimators=4, max_depth=3))


def _snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_save_writes_private_files_and_a_manifest_that_load_checks(tmp_path, two_models):
    (fed, (a, b, c)), _ = two_models
    paths = fed.save(tmp_path / "m")
    assert [p.name for p in paths] == ["a.json", "b.json", "c.json"]
    for p in (tmp_path / "m").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    man = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert set(man["files"]) == {"a.json", "b.json", "c.json"} and man["model_id"] == fed.model.model_id
    again = Federation.load(tmp_path / "m")
    np.testing.assert_array_equal(again.predict_proba({"a": a, "b": b, "c": c}),
                                  fed.predict_proba({"a": a, "b": b, "c": c}))


def test_a_model_saved_under_the_old_default_names_still_loads_and_predicts(tmp_path):
    """Before one vocabulary, `vfl simulate --save-model` named the parties guest, host1, host2 (FATE's
    words); the names are data of the model files, so such a model loads and predicts unchanged."""
    a, b, c = small_frames(seed=2)
    old = Federation(ActiveParty("guest", a), [PassiveParty("host1", b), PassiveParty("host2", c)])
    old.fit(PARAMS)
    paths = old.save(tmp_path / "m")
    assert [p.name for p in paths] == ["guest.json", "host1.json", "host2.json"]
    doc = json.loads((tmp_path / "m" / "guest.json").read_text())
    assert doc["passive_parties"] == ["host1", "host2"]         # the file format's key, with the old names
    again = Federation.load(tmp_path / "m")
    frames = {"guest": a, "host1": b, "host2": c}
    np.testing.assert_array_equal(again.predict_proba(frames), old.predict_proba(frames))
    owners = {n.owner for rnd in again.model.rounds for t in rnd for n in t.nodes if not n.is_leaf}
    assert owners and owners <= {"guest", "host1", "host2"}


def test_a_full_disk_while_saving_keeps_the_previous_model_whole(tmp_path, two_models, monkeypatch):
    (fed1, frames), (fed2, _) = two_models
    d = tmp_path / "m"
    fed1.save(d)
    before = _snapshot(d)
    real_write, calls = os.write, {"n": 0}

    def write_then_full(fd, data):         # the first file fits, the second fills the disk midway
        calls["n"] += 1
        if calls["n"] >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(wf.os, "write", write_then_full)
    with pytest.raises(WriteError, match=r"cannot write .*b\.json: no space left on the device"):
        fed2.save(d)
    monkeypatch.undo()
    assert _snapshot(d) == before                     # no temp file, no file of the new model
    loaded = Federation.load(d)
    assert loaded.model.model_id == fed1.model.model_id


def test_load_refuses_a_directory_that_mixes_two_models(tmp_path, two_models):
    (fed1, _), (fed2, _) = two_models
    fed1.save(tmp_path / "one")
    fed2.save(tmp_path / "two")
    (tmp_path / "one" / "b.json").write_bytes((tmp_path / "two" / "b.json").read_bytes())
    with pytest.raises(InputError, match=r"b\.json is not the file .*manifest\.json lists"):
        Federation.load(tmp_path / "one")
    (tmp_path / "one" / "manifest.json").unlink()     # without a manifest (older saves): the model ids
    with pytest.raises(InputError, match=r"b\.json holds model .* of party 'b', but the active party's model is"):
        Federation.load(tmp_path / "one")


def test_edited_thresholds_and_record_ids_are_refused(tmp_path, two_models):
    (fed, _), _ = two_models
    d = tmp_path / "m"
    fed.save(d)
    (d / "manifest.json").unlink()        # the files' own hashes, without the manifest's help
    doc = json.loads((d / "b.json").read_text())
    doc["records"][0]["threshold"] = float(doc["records"][0]["threshold"]) + 1.0
    (d / "b.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"b\.json was modified after it was written.*model_hash"):
        Federation.load(d)
    # the attacker recomputes the passive file's own hash: the active party's record of it still differs
    doc["model_hash"] = model_hash(doc)
    (d / "b.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"party 'b': its model .* is not the one the active party trained"):
        Federation.load(d)
    fed.save(d)
    act = json.loads((d / "a.json").read_text())
    node = next(n for r in act["rounds"] for t in r for n in t["nodes"] if not n["is_leaf"])
    node["value"] = 5.0
    (d / "a.json").write_text(json.dumps(act))
    (d / "manifest.json").unlink()
    with pytest.raises(InputError, match=r"a\.json was modified after it was written.*content_hash"):
        Federation.load(d)


@pytest.mark.parametrize("content, message", [
    ("", r"model file .*a\.json is empty"),
    ('{"format": "vfl-boost-model", "role": "act', r"a\.json is damaged: not valid JSON"),
    ("[1, 2]", r"a\.json is damaged: expected a JSON object"),
])
def test_empty_or_truncated_model_files_are_named(tmp_path, two_models, content, message):
    (fed, _), _ = two_models
    fed.save(tmp_path / "m")
    (tmp_path / "m" / "manifest.json").unlink()
    (tmp_path / "m" / "a.json").write_text(content)
    with pytest.raises(InputError, match=message):
        Federation.load(tmp_path / "m")


def test_simulate_refuses_an_unwritable_save_model_directory_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = CliRunner().invoke(main, ["simulate", "--mode", "plain", "--rounds", "2", "--quiet",
                                    "--save-model", str(blocker / "models")])
    assert res.exit_code == 1
    assert "cannot create --save-model directory" in res.output and "file/models" in res.output
    assert "train time" not in res.output            # refused up front


def test_every_file_simulate_writes_is_private_but_its_report(tmp_path):
    """Models and predictions 0600; the --output-json summary, a report meant to be shared (it holds
    no secret and no row), 0644 (issue 37, item 8)."""
    out, preds, models = tmp_path / "r.json", tmp_path / "p.csv", tmp_path / "models"
    res = CliRunner().invoke(main, ["simulate", "--mode", "plain", "--rounds", "2", "--quiet", "--output-json",
                                    str(out), "--predictions", str(preds), "--save-model", str(models)])
    assert res.exit_code == 0, res.output
    written = [preds, *models.iterdir()]
    assert len(written) == 4
    for p in written:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
