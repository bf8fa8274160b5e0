"""A training checkpoint read back field by field (parties.checkpoint.Checkpoint.from_dict), in
process: each damaged field is named ("... is damaged: field F: problem"), and a resume that would
not continue the same training is refused naming what differs."""
import base64
import copy

import numpy as np
import pytest
from support import small_frames

from parties.active import ActiveParty
from parties.checkpoint import Checkpoint
from parties.server import PassiveServer
from protocols.transport import InMemoryTransport
from vfl.core.errors import InputError
from vfl.core.params import TrainParams

PARAMS = TrainParams(mode="plain", n_estimators=2, max_depth=2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    a, b, _ = small_frames(40)
    server = PassiveServer("telco", b, "id", tmp_path_factory.mktemp("telco"))
    saved = []
    ActiveParty("bank", a).fit(InMemoryTransport("bank", {"telco": server.handle_frame}), ["telco"], PARAMS,
                               checkpoint=saved.append)
    return saved[-1]


def _raw(values, shape):
    return {"dtype": "<f8", "shape": list(shape),
            "data": base64.b64encode(np.asarray(values, "<f8").tobytes()).decode()}


def _damage(d, path, value):
    *keys, last = path
    for k in keys:
        d = d[k]
    if value is KeyError:
        del d[last]
    else:
        d[last] = value


@pytest.mark.parametrize("path, value, message", [
    (("raw", "dtype"), "<f4", "field raw.dtype: expected '<f8', got '<f4'"),
    (("raw", "shape"), [40], "field raw.shape: expected 2 dimensions, got 1"),
    (("raw", "data"), 7, "field raw.data: expected base64 text"),
    (("raw", "data"), "@@@@", "field raw.data: not base64"),
    (("raw", "data"), base64.b64encode(b"12345678").decode(), r"field raw.data: 8 bytes for shape \[40, 1\]"),
    (("raw",), _raw([np.inf], (1, 1)), "field raw: raw scores must be finite"),
    (("raw",), _raw([0.0, 0.0], (2, 1)), r"field raw: raw scores of shape \(2, 1\), expected \(40, 1\)"),
    (("raw",), None, "field raw: missing"),
    (("passive_parties",), ["telco", "bank"], "field passive_parties: party names must be unique"),
    (("salt",), "not hex", "field salt: expected hex digits"),
    (("data_digest_layout",), "diagonal", "field data_digest_layout: 'diagonal' is not one of"),
    (("records", "shop"), 0, "field records.shop: not a passive party of the checkpoint"),
    (("records", "telco"), 99, "field records.telco: 99 records, but the trees use"),
    (("n_rounds",), 5, "field n_rounds: 5, but the checkpoint holds 2 rounds"),
    (("history",), {"train": {"logloss": ["x"]}}, r"field history.train.logloss\[0\]"),
])
def test_each_damaged_field_is_named(checkpoint, path, value, message):
    d = copy.deepcopy(checkpoint.to_dict())
    _damage(d, path, value)
    with pytest.raises(InputError, match=f"^ck.json is damaged: {message}"):
        Checkpoint.from_dict(d, "ck.json")


def test_rounds_keep_their_number_of_trees(checkpoint):
    d = copy.deepcopy(checkpoint.to_dict())
    d["rounds"][1] = d["rounds"][1] * 2
    with pytest.raises(InputError, match=r"field rounds\[1\]: 2 trees, the first round has 1"):
        Checkpoint.from_dict(d, "ck.json")


def test_an_intact_checkpoint_reads_back_the_same(checkpoint):
    back = Checkpoint.from_dict(copy.deepcopy(checkpoint.to_dict()), "ck.json")
    assert back.to_dict() == checkpoint.to_dict() and back.source == "ck.json"


def test_a_resume_must_continue_the_same_training(checkpoint):
    ck = checkpoint
    params = ck.params
    args = (ck.data_digest, ck.n_rows)
    ck.check_resume("bank", ["telco"], params, *args)
    with pytest.raises(InputError, match="a dp-mode training cannot be resumed"):
        ck.check_resume("bank", ["telco"], dict(params, mode="dp"), *args)
    with pytest.raises(InputError, match="the checkpoint belongs to active party 'bank', not 'shop'"):
        ck.check_resume("shop", ["telco"], params, *args)
    with pytest.raises(InputError, match=r"trained with passive parties \['telco'\] \(in this order\), not "
                                         r"\['telco', 'shop'\]"):
        ck.check_resume("bank", ["telco", "shop"], params, *args)
    with pytest.raises(InputError, match="training parameters differ from the checkpoint's: max_depth 2 -> 3"):
        ck.check_resume("bank", ["telco"], dict(params, max_depth=3), *args)
    with pytest.raises(InputError, match=r"parameters differ .*: colour None -> 'red'"):
        ck.check_resume("bank", ["telco"], dict(params, colour="red"), *args)     # a key TrainParams lacks
    with pytest.raises(InputError, match="the checkpoint already has 2 rounds, more than n_estimators 1"):
        ck.check_resume("bank", ["telco"], dict(params, n_estimators=1), *args)
    with pytest.raises(InputError, match=r"the aligned training data differ from the checkpoint's \(39 rows now, "
                                         r"40 then\)"):
        ck.check_resume("bank", ["telco"], params, ck.data_digest, 39)
