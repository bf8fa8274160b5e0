"""Warm start on the passive side: a new training that continues one of this party's completed
models with more rounds (``TrainContinue``, issue 37).

The active party sets a training up as usual (``TrainSetup`` with a *new* model id and the id
salt of the base model, ``n_rounds`` the new total), then names the base. This party copies the
base's lookup-table records into the new model (the active party's trees refer to them by
record id) and grows it from round ``n_rounds`` of the base on. The base model itself is never
changed: it keeps predicting, and a warm-started training that fails leaves only the new,
unfinished model behind.

The same checks as for any training hold (:mod:`parties.passive_checks`: the round bound is the
new total agreed at setup, and the rounds continue upwards from the base's), plus:

* the base is a *completed* model this party holds (its own file or its own object; the
  requester cannot send one), with the session's id salt and this party's feature columns;
* only the base's trainer continues it (the client recorded in the model file; a model trained
  without an identity is continued by a session without one);
* the base's records are exactly those of its first ``n_rounds`` rounds, ``n_records`` of them;
* not in mode dp nor for a DP released model (each noisy release happens once per training),
  and before any round.
"""
from __future__ import annotations

from datasets.errors import InputError, ProtocolError
from parties.passive_state import PassiveState
from protocols import messages as m
from vfl.core.dp_bins import DPBinner
from vfl.core.params import Mode


def base_entry(party: str, salt: str, features: list, records: list[dict], trainer, completed: bool,
               model_id: str) -> dict:
    """What a party keeps of a completed model it may continue (the records already checked)."""
    if not completed:
        raise InputError(f"party {party!r}: model {model_id!r} is unfinished: resume it (--resume) instead of "
                         "warm-starting from it")
    return {"model_id": model_id, "salt": salt, "features": list(features), "records": [dict(r) for r in records],
            "trainer": trainer}


def continue_model(s: PassiveState, req: m.TrainContinue) -> m.Ack:
    """Start the training set up by the last ``TrainSetup`` from the completed model ``req.base_model_id``."""
    t = s.train
    proto = s.need("TrainSetup", t.protocol)
    if t.mode == Mode.DP:
        raise ProtocolError(f"party {s.name!r} refuses TrainContinue: a dp-mode training cannot continue a model "
                            "(its noisy release happens once per training)")
    if isinstance(t.binner, DPBinner):
        raise ProtocolError(f"party {s.name!r} refuses TrainContinue: a DP released model (dp_model) cannot be "
                            "continued (its DP bin edges and noisy leaves are released once per training)")
    if proto.round is not None or len(s.table) or t.round_idx is not None:
        raise ProtocolError(f"party {s.name!r} refuses TrainContinue: the training of model {s.model_id!r} "
                            "already started its rounds")
    if req.base_model_id == s.model_id:
        raise ProtocolError(f"party {s.name!r} refuses TrainContinue: a warm start trains a new model, not "
                            f"{req.base_model_id!r} again")
    base = s.warm_bases.get(req.base_model_id)
    if base is None:
        raise InputError(f"party {s.name!r} holds no completed model {req.base_model_id!r} to continue")
    if base["trainer"] != s.trainer:
        raise ProtocolError(f"party {s.name!r} refuses TrainContinue: model {req.base_model_id!r} was trained by "
                            "another client; only its trainer may continue it")
    if s.salt is None or base["salt"] != s.salt.hex():
        raise InputError(f"party {s.name!r}: the session's id salt differs from the one of model "
                         f"{req.base_model_id!r} (a warm start keeps the base's salt)")
    if base["features"] != list(s.feature_names):
        raise InputError(f"party {s.name!r}: model {req.base_model_id!r} was trained on features "
                         f"{base['features'][:10]}, this party now has {list(s.feature_names)[:10]}")
    if req.n_rounds >= proto.n_rounds:
        raise ProtocolError(f"party {s.name!r} refuses TrainContinue: the base has {req.n_rounds} rounds and the "
                            f"setup agreed {proto.n_rounds} in all: no round is left to train")
    records = base["records"]
    late = [r for r in records if r["round"] >= req.n_rounds]
    if late or len(records) != req.n_records:
        raise InputError(f"party {s.name!r} holds {len(records)} records of model {req.base_model_id!r} "
                         f"({len(late)} beyond round {req.n_rounds}), the active party's model refers to "
                         f"{req.n_records} in {req.n_rounds} rounds: not the same model")
    s.table.records = [dict(r) for r in records]
    proto.round = req.n_rounds - 1          # the next rounds are numbered upwards from the base's
    return m.Ack({"n_records": len(records), "base_model_id": req.base_model_id})
