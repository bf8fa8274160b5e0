"""The active party's --model-dir rules (parties.network._ModelFiles, load_active_model) in process:
what `vfl party active` checks before it connects to anyone, and the hint an interrupted training
prints. The network tests run the same commands in subprocesses."""
import json

import pytest
from support import small_frames

from parties.active import ActiveParty
from parties.network import (
    CHECKPOINT_FILE,
    _find_active_model,
    _ModelFiles,
    _predict_proba,
    _with_align,
    check_prediction,
    load_active_model,
    train_active,
)
from parties.server import PassiveServer
from protocols.transport import InMemoryTransport
from vfl.core.errors import InputError
from vfl.core.files import write_json_atomic
from vfl.core.params import TrainParams


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished active model (its file dict) and a checkpoint of its first round."""
    a, b, _ = small_frames(60)
    server = PassiveServer("telco", b, "id", tmp_path_factory.mktemp("telco"))
    active = ActiveParty("bank", a)
    saved = []
    active.fit(InMemoryTransport("bank", {"telco": server.handle_frame}), ["telco"],
               TrainParams(mode="plain", n_estimators=2, max_depth=2), checkpoint=saved.append)
    return active, saved[0]


def test_a_new_training_needs_a_clean_directory(tmp_path, trained):
    active, ck = trained
    files = _ModelFiles(tmp_path / "new", "bank", resumable=True)
    assert files.prepare(resume=False, force=False) is None and (tmp_path / "new").is_dir()
    d = tmp_path / "done"
    d.mkdir()
    write_json_atomic(d / "bank.json", active.model.file_dict())
    with pytest.raises(InputError, match=f"{d} already holds a finished model \\(bank.json\\); use another "
                                         "--model-dir or --force"):
        _ModelFiles(d, "bank", True).prepare(resume=False, force=False)
    assert _ModelFiles(d, "bank", True).prepare(resume=False, force=True) is None
    with pytest.raises(InputError, match=f"the training in {d} already completed \\(bank.json\\); nothing to resume"):
        _ModelFiles(d, "bank", True).prepare(resume=True, force=False)
    ck.save(d / CHECKPOINT_FILE)
    with pytest.raises(InputError, match=f"{d} holds an unfinished training \\({CHECKPOINT_FILE}\\): continue it "
                                         "with --resume"):
        _ModelFiles(d, "bank", True).prepare(resume=False, force=False)
    back = _ModelFiles(d, "bank", True).prepare(resume=True, force=False)
    assert back.model_id == ck.model_id and back.n_rounds == 1


def test_a_damaged_model_file_is_named_not_replaced(tmp_path):
    (tmp_path / "bank.json").write_text("")
    with pytest.raises(InputError, match="bank.json.*; use another --model-dir or --force to replace it"):
        _ModelFiles(tmp_path, "bank", True).prepare(resume=False, force=False)
    assert _ModelFiles(tmp_path, "bank", True).prepare(resume=False, force=True) is None
    with pytest.raises(InputError, match=f"no readable active-party model in {tmp_path}: "):
        load_active_model(tmp_path)


def test_the_directory_itself(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match=f"--model-dir {tmp_path / 'f'} is not a directory"):
        _ModelFiles(tmp_path / "f", "bank", True).prepare(resume=False, force=False)
    with pytest.raises(InputError, match=f"no checkpoint to resume in {tmp_path} \\({CHECKPOINT_FILE} is missing\\)"):
        _ModelFiles(tmp_path, "bank", True).prepare(resume=True, force=False)
    with pytest.raises(InputError, match="--resume is not available in dp mode"):
        _ModelFiles(tmp_path, "bank", resumable=False).prepare(resume=True, force=False)
    with pytest.raises(InputError, match="--resume is not available for a --dp-model training"):
        _ModelFiles(tmp_path, "bank", resumable=False, dp_model=True).prepare(resume=True, force=False)


def test_the_resume_hint_says_what_can_be_done(tmp_path, trained):
    _, ck = trained
    files = _ModelFiles(tmp_path, "bank", True)
    assert files.resume_hint(0) == "no round was finished, so there is nothing to resume: start again"
    ck.save(files.checkpoint)
    assert files.resume_hint(1).startswith(f"the checkpoint {files.checkpoint} keeps the first 1 round(s)")
    assert files.resume_hint(0).startswith("no round was finished")
    assert _ModelFiles(tmp_path, "bank", False).resume_hint(1) == "dp mode cannot be resumed: start again"
    assert _ModelFiles(tmp_path, "bank", False, True).resume_hint(1) == \
        "a --dp-model training cannot be resumed: start again"


def test_finish_replaces_another_model_with_force_and_drops_the_checkpoint(tmp_path, trained):
    active, ck = trained
    write_json_atomic(tmp_path / "old_bank.json", active.model.file_dict())
    ck.save(tmp_path / CHECKPOINT_FILE)
    files = _ModelFiles(tmp_path, "bank", True)
    files.existing = _find_active_model(tmp_path)
    files.finish(active.model, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank.json"]
    assert json.loads((tmp_path / "bank.json").read_text())["model_id"] == active.model.model_id
    assert load_active_model(tmp_path).model_id == active.model.model_id


def test_one_active_model_per_directory(tmp_path, trained):
    active, _ = trained
    for name in ("bank.json", "bank2.json"):
        write_json_atomic(tmp_path / name, active.model.file_dict())
    with pytest.raises(InputError, match=f"{tmp_path} holds several active-party models \\(bank.json, bank2.json\\); "
                                         "keep one model per --model-dir"):
        load_active_model(tmp_path)


def test_prediction_needs_a_finished_model(tmp_path, trained):
    _, ck = trained
    with pytest.raises(InputError, match=f"model directory {tmp_path / 'none'} does not exist"):
        load_active_model(tmp_path / "none")
    with pytest.raises(InputError, match=f"no active-party model in {tmp_path}$"):
        load_active_model(tmp_path)
    ck.save(tmp_path / CHECKPOINT_FILE)
    with pytest.raises(InputError, match=f"{tmp_path} holds only an unfinished training"):
        load_active_model(tmp_path)


def test_option_values_are_checked_before_any_connection(tmp_path, trained):
    active, _ = trained
    with pytest.raises(InputError, match="--align must be one of .*, got 'sorted'"):
        _with_align(TrainParams(), "sorted")
    assert _with_align(TrainParams(), "psi").align == "psi"
    with pytest.raises(InputError, match="--prediction must be one of .*, got 'batch'"):
        check_prediction("batch")
    with pytest.raises(InputError, match="--align must be one of .*, got 'sorted'"):
        _predict_proba(active, None, None, None, "one-round", "sorted")
    with pytest.raises(InputError, match="give at least one --peer NAME=HOST:PORT"):
        train_active("a.csv", "id", "y", "bank", {}, TrainParams(), tmp_path, None)
    with pytest.raises(InputError, match="the active party and a passive party are both named 'bank'"):
        train_active("a.csv", "id", "y", "bank", {"bank": "127.0.0.1:1"}, TrainParams(), tmp_path, None)
