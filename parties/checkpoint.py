"""The active party's training checkpoint: enough to continue an interrupted training.

Written after every boosting round (``checkpoint.json`` in the active party's
model directory; atomically, so a crash leaves the previous one). It holds:

* the federation's identity: ``model_id`` and the id-hashing ``salt`` (a
  resumed run re-aligns with the same salt, which gives the same rows in the
  same order), the party names and the training parameters;
* a fingerprint of the active party's aligned training data (ids, features,
  labels) so a resume on changed data is refused;
* the trees grown so far (the active party's view: its own thresholds,
  ``(party, record_id)`` for passive splits) and the raw scores of the
  training rows after them, bit for bit, so the next round's gradients are
  exactly those of an uninterrupted run;
* the per-round metric history (``parties.monitor``; the validation scores are
  recomputed on resume, from the trees);
* per passive party, how many of its lookup-table records the trees refer to
  (the passive party must still hold exactly those; it drops records of the
  unfinished round).

It holds **no Paillier key**: a resumed run generates a fresh key pair and
sends the new public key (the model does not depend on the key: ``he`` and
``plain`` grow identical trees). The file is the active party's own state on
its own disk; it contains no passive threshold. ``completed`` is always
``false``: the finished model is written to its own file only at the end.
"""
from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from datasets.errors import InputError
from protocols import alignment
from vfl.files import write_json_atomic
from vfl.params import Mode
from vfl.rounds import RoundObserver, RoundRecord
from vfl.tree import Tree

CHECKPOINT_FORMAT = "vfl-boost-checkpoint"
CHECKPOINT_VERSION = 1
# parameters that may change between the interrupted run and its resume
RESUMABLE_CHANGES = ("n_estimators", "key_bits", "encryption")


def data_digest(ids, X, y, feature_names) -> str:
    """Fingerprint of the aligned training data (order matters)."""
    h = hashlib.sha256(json.dumps(list(feature_names)).encode())
    h.update("\x00".join(alignment.normalize_ids(ids)).encode())
    h.update(np.ascontiguousarray(X, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.float64).tobytes())
    return h.hexdigest()


def _encode_array(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a, dtype="<f8")
    return {"dtype": "<f8", "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}


def _decode_array(d: dict) -> np.ndarray:
    raw = base64.b64decode(d["data"])
    return np.frombuffer(raw, dtype="<f8").reshape(d["shape"]).copy()


def records_per_party(rounds, passive_parties) -> dict[str, int]:
    """How many lookup-table records of each passive party the trees refer to."""
    counts = {p: 0 for p in passive_parties}
    for rnd in rounds:
        for tree in rnd:
            for node in tree.nodes:
                if not node.is_leaf and node.owner in counts:
                    counts[node.owner] += 1
    return counts


@dataclass
class Checkpoint:
    active_party: str
    passive_parties: list[str]
    model_id: str
    salt: str                       # hex
    params: dict
    n_rows: int
    data_digest: str
    rounds: list[list[Tree]] = field(default_factory=list)
    raw: np.ndarray | None = None   # (n_rows, n_targets) after the saved rounds
    records: dict[str, int] = field(default_factory=dict)
    completed: bool = False
    history: dict = field(default_factory=dict)     # per-round metrics so far (parties.monitor)

    @property
    def n_rounds(self) -> int:
        return len(self.rounds)

    def to_dict(self) -> dict:
        return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "role": "checkpoint",
                "completed": False, "active_party": self.active_party,
                "passive_parties": list(self.passive_parties), "model_id": self.model_id, "salt": self.salt,
                "params": self.params, "n_rows": self.n_rows, "data_digest": self.data_digest,
                "n_rounds": self.n_rounds, "records": dict(self.records),
                "raw": _encode_array(self.raw) if self.raw is not None else None,
                "rounds": [[t.to_dict() for t in rnd] for rnd in self.rounds], "history": self.history}

    @classmethod
    def from_dict(cls, d: dict, source: str = "checkpoint") -> "Checkpoint":
        if not isinstance(d, dict) or d.get("format") != CHECKPOINT_FORMAT:
            raise InputError(f"{source} is not a training checkpoint of this toolkit")
        if d.get("version") != CHECKPOINT_VERSION:
            raise InputError(f"{source}: checkpoint version {d.get('version')} is not supported")
        try:
            ck = cls(d["active_party"], list(d["passive_parties"]), d["model_id"], d["salt"], dict(d["params"]),
                     int(d["n_rows"]), d["data_digest"], [[Tree.from_dict(t) for t in rnd] for rnd in d["rounds"]],
                     _decode_array(d["raw"]) if d.get("raw") else None,
                     {str(k): int(v) for k, v in d.get("records", {}).items()},
                     history=dict(d.get("history") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{source} is damaged: {type(exc).__name__}: {exc}") from None
        if ck.raw is not None and ck.raw.shape[0] != ck.n_rows:
            raise InputError(f"{source} is damaged: raw scores for {ck.raw.shape[0]} rows, expected {ck.n_rows}")
        return ck

    def save(self, path) -> None:
        write_json_atomic(path, self.to_dict(), indent=None)

    @classmethod
    def load(cls, path) -> "Checkpoint":
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise InputError(f"cannot read checkpoint {path}: {exc}") from None
        return cls.from_dict(d, str(path))

    # -- resuming -----------------------------------------------------------
    def check_resume(self, active_party: str, passive_parties, params: dict, digest: str, n_rows: int) -> None:
        """Refuse a resume that would not continue the same training."""
        if Mode.DP in (params.get("mode"), self.params.get("mode")):
            raise InputError("a dp-mode training cannot be resumed: each passive party's noisy release happens "
                             "once per training, and a resumed run would release again")
        if active_party != self.active_party:
            raise InputError(f"the checkpoint belongs to active party {self.active_party!r}, not {active_party!r}")
        if list(passive_parties) != list(self.passive_parties):
            raise InputError(f"the checkpoint was trained with passive parties {self.passive_parties} (in this "
                             f"order), not {list(passive_parties)}")
        diff = sorted(k for k in set(params) | set(self.params)
                      if k not in RESUMABLE_CHANGES and params.get(k) != self.params.get(k))
        if diff:
            raise InputError("training parameters differ from the checkpoint's: " + ", ".join(
                f"{k} {self.params.get(k)!r} -> {params.get(k)!r}" for k in diff))
        if params.get("n_estimators", 0) < self.n_rounds:
            raise InputError(f"the checkpoint already has {self.n_rounds} rounds, more than n_estimators "
                             f"{params.get('n_estimators')}")
        if n_rows != self.n_rows or digest != self.data_digest:
            raise InputError(f"the aligned training data differ from the checkpoint's ({n_rows} rows now, "
                             f"{self.n_rows} then): the data files or a party's ids changed; cannot resume")


class CheckpointTracker(RoundObserver):
    """Checkpoints as a round observer: restores the booster's state on resume and saves a
    checkpoint after every round."""

    def __init__(self, active_party: str, passive_parties, params, salt: bytes, model_id: str, ids, X, y,
                 feature_names, resume: Checkpoint | None = None, save=None):
        self.save = save
        digest = data_digest(ids, X, y, feature_names)
        if resume is not None:
            resume.check_resume(active_party, passive_parties, params.to_dict(), digest, len(y))
        self.template = Checkpoint(active_party, list(passive_parties), model_id, salt.hex(), params.to_dict(),
                                   int(len(y)), digest)
        self.resume = resume
        self.rounds: list = [list(r) for r in resume.rounds] if resume is not None else []

    def booster_kwargs(self) -> dict:
        if self.resume is None:
            return {"rounds": self.rounds}
        raw = None if self.resume.raw is None else self.resume.raw.copy()
        return {"rounds": self.rounds, "start_round": self.resume.n_rounds, "raw": raw}

    def round_finished(self, record: RoundRecord) -> None:
        if self.save is not None:
            t = self.template
            self.save(Checkpoint(t.active_party, t.passive_parties, t.model_id, t.salt, t.params, t.n_rows,
                                 t.data_digest, list(self.rounds), np.array(record.raw, dtype=np.float64),
                                 records_per_party(self.rounds, t.passive_parties), history=record.history))
