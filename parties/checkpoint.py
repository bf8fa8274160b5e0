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
import binascii
import hashlib
import json
import secrets
from dataclasses import dataclass, field

import numpy as np

from datasets.errors import InputError
from protocols import alignment
from vfl.core.binning import feature_column, feature_matrix, n_features
from vfl.core.files import atomic_text_writer, write_json_atomic
from vfl.core.model import canonical_bytes, check_content_hash, content_hash, read_model_json, require_content_hash
from vfl.core.params import Mode, TrainParams
from vfl.core.rounds import RoundObserver, RoundRecord
from vfl.core.tree import Tree, damaged, need_dict, need_float, need_int, need_key, need_list, need_str

CHECKPOINT_FORMAT = "vfl-boost-checkpoint"
CHECKPOINT_VERSION = 1
# parameters that may change between the interrupted run and its resume
RESUMABLE_CHANGES = ("n_estimators", "key_bits", "encryption", "scheme")   # a resume makes a new key


_DIGEST_CHUNK = 65_536


#: how the features enter the fingerprint: "rows" (row after row, what checkpoints written before
#: the field existed hold) or "columns" (column after column: a table read one column at a time
#: is fingerprinted without its whole matrix; every new checkpoint)
DIGEST_LAYOUTS = ("rows", "columns")


def data_digest(ids, X, y, feature_names, rows=None, layout: str = "columns") -> str:
    """Fingerprint of the aligned training data (order matters): the ids, the features of ``X``
    (or of its rows ``rows``; ``X`` a matrix or a column reader, see :func:`vfl.core.binning.n_features`)
    in ``layout`` order, a chunk at a time, and the labels ``y``."""
    if layout not in DIGEST_LAYOUTS:
        raise ValueError(f"digest layout {layout!r} is not one of {DIGEST_LAYOUTS}")
    h = hashlib.sha256(json.dumps(list(feature_names)).encode())
    # the ids joined by NUL, a chunk of ids at a time; the arrays hashed in place (no copies)
    for i, keys in enumerate(alignment.normalized_chunks(ids, _DIGEST_CHUNK)):
        text = "\x00".join(keys)
        h.update((text if i == 0 else "\x00" + text).encode())
    if layout == "columns":
        for j in range(n_features(X)):
            col = feature_column(X, j)
            for start in range(0, len(col) if rows is None else len(rows), _DIGEST_CHUNK):
                part = col[start:start + _DIGEST_CHUNK] if rows is None else col[rows[start:start + _DIGEST_CHUNK]]
                h.update(np.ascontiguousarray(part))
            col = None
    else:
        if not isinstance(X, np.ndarray):       # an older checkpoint: its rows need the whole matrix
            X, rows = feature_matrix(X, rows), None
        if rows is None:
            h.update(np.ascontiguousarray(X, dtype=np.float64))
        else:
            for start in range(0, len(rows), _DIGEST_CHUNK):
                h.update(np.ascontiguousarray(X[rows[start:start + _DIGEST_CHUNK]], dtype=np.float64))
    h.update(np.ascontiguousarray(y, dtype=np.float64))
    return h.hexdigest()


def _encode_array(a: np.ndarray, data: str | None = None) -> dict:
    """``a`` as JSON: dtype, shape and its bytes in base64 (``data``: put this text there instead)."""
    a = np.ascontiguousarray(a, dtype="<f8")
    return {"dtype": "<f8", "shape": list(a.shape),
            "data": base64.b64encode(a.tobytes()).decode() if data is None else data}


#: raw-score bytes base64-encoded per step when a checkpoint is saved (a multiple of 3: the pieces'
#: base64 texts joined are the base64 text of the whole)
_SAVE_CHUNK = 3 << 18


def _base64_pieces(a: np.ndarray):
    """The base64 text of ``a``'s little-endian float64 bytes, as ASCII pieces of at most
    :data:`_SAVE_CHUNK` bytes of ``a`` each (never the whole text at once)."""
    buf = memoryview(np.ascontiguousarray(a, dtype="<f8").reshape(-1).view(np.uint8))
    for start in range(0, len(buf), _SAVE_CHUNK):
        yield base64.b64encode(buf[start:start + _SAVE_CHUNK])


def _decode_array(d, source: str = "checkpoint", where: str = "raw") -> np.ndarray:
    d = need_dict(d, source, where)
    if d.get("dtype", "<f8") != "<f8":
        raise damaged(source, f"{where}.dtype", f"expected '<f8', got {d.get('dtype')!r}")
    shape = need_list(need_key(d, "shape", source, where), source, f"{where}.shape")
    if len(shape) != 2:
        raise damaged(source, f"{where}.shape", f"expected 2 dimensions, got {len(shape)}")
    shape = [need_int(v, source, f"{where}.shape[{i}]", 0, 2 ** 40) for i, v in enumerate(shape)]
    data = need_key(d, "data", source, where)
    if not isinstance(data, str):
        raise damaged(source, f"{where}.data", "expected base64 text")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise damaged(source, f"{where}.data", f"not base64 ({exc})") from None
    if len(raw) != 8 * shape[0] * shape[1]:
        raise damaged(source, f"{where}.data", f"{len(raw)} bytes for shape {shape}")
    a = np.frombuffer(raw, dtype="<f8").reshape(shape).copy()
    if not np.all(np.isfinite(a)):
        raise damaged(source, where, "raw scores must be finite")
    return a


def _around(text, marker):
    """``text`` before and after the one occurrence of ``marker`` (inside a JSON string)."""
    parts = text.split(marker)
    if len(parts) != 2:
        raise RuntimeError(f"the checkpoint's raw-score marker occurs {len(parts) - 1} times")
    return parts[0], parts[1]


def records_per_party(rounds, passives) -> dict[str, int]:
    """How many lookup-table records of each passive party the trees refer to."""
    counts = {p: 0 for p in passives}
    for rnd in rounds:
        for tree in rnd:
            for node in tree.nodes:
                if not node.is_leaf and node.owner in counts:
                    counts[node.owner] += 1
    return counts


def _param(params: dict, key: str):
    """A parameter of a checkpoint's ``params``; one it predates (e.g. ``min_node_rows``) has its default."""
    if key in params:
        return params[key]
    try:
        return TrainParams.default(key)
    except KeyError:
        return None


@dataclass
class Checkpoint:
    active_party: str
    passives: list[str]
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
    digest_layout: str = "columns"                  # how data_digest read the features (DIGEST_LAYOUTS)
    base_score: list | None = None                  # a warm start's: the saved model's (else from the labels)

    @property
    def n_rounds(self) -> int:
        return len(self.rounds)

    def to_dict(self, raw_data: str | None = None) -> dict:
        """The checkpoint as JSON (``raw_data``: this text in place of the raw scores' base64)."""
        return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "role": "checkpoint",
                "completed": False, "active_party": self.active_party,
                "passive_parties": list(self.passives), "model_id": self.model_id, "salt": self.salt,
                "params": self.params, "n_rows": self.n_rows, "data_digest": self.data_digest,
                "data_digest_layout": self.digest_layout,
                "n_rounds": self.n_rounds, "records": dict(self.records),
                "raw": _encode_array(self.raw, raw_data) if self.raw is not None else None,
                "rounds": [[t.to_dict() for t in rnd] for rnd in self.rounds], "history": self.history} \
            | ({"base_score": list(self.base_score)} if self.base_score is not None else {})

    @classmethod
    def from_dict(cls, d: dict, source: str = "checkpoint") -> "Checkpoint":
        """A checkpoint from its dict, checked: schema, trees (:meth:`vfl.core.tree.Tree.check_dict`),
        raw scores of the right shape, record counts that match the trees. Anything else: an
        InputError naming ``source`` and the field."""
        if not isinstance(d, dict) or d.get("format") != CHECKPOINT_FORMAT:
            raise InputError(f"{source} is not a training checkpoint of this toolkit")
        if d.get("version") != CHECKPOINT_VERSION:
            raise InputError(f"{source}: checkpoint version {d.get('version')!r} is not supported")
        check_content_hash(d, source)
        g = lambda k: need_key(d, k, source, "")          # noqa: E731
        active = need_str(g("active_party"), source, "active_party")
        passives = need_list(g("passive_parties"), source, "passive_parties")
        passives = [need_str(p, source, f"passive_parties[{i}]") for i, p in enumerate(passives)]
        if len(set(passives) | {active}) != len(passives) + 1:
            raise damaged(source, "passive_parties", "party names must be unique (the active one included)")
        model_id = need_str(g("model_id"), source, "model_id")
        salt = need_str(g("salt"), source, "salt")
        try:
            bytes.fromhex(salt)
        except ValueError:
            raise damaged(source, "salt", "expected hex digits") from None
        params = need_dict(g("params"), source, "params")
        n_rows = need_int(g("n_rows"), source, "n_rows", 0)
        digest = need_str(g("data_digest"), source, "data_digest")
        layout = need_str(d.get("data_digest_layout", "rows"), source, "data_digest_layout")
        if layout not in DIGEST_LAYOUTS:
            raise damaged(source, "data_digest_layout", f"{layout!r} is not one of {list(DIGEST_LAYOUTS)}")
        # the active party's feature count is checked on resume (CheckpointTracker): any index >= 0 here
        owners = {active: 2 ** 31, **{p: None for p in passives}}
        rounds, n_targets = [], None
        for r, rnd in enumerate(need_list(g("rounds"), source, "rounds")):
            rnd = need_list(rnd, source, f"rounds[{r}]", min_len=1)
            if n_targets is not None and len(rnd) != n_targets:
                raise damaged(source, f"rounds[{r}]", f"{len(rnd)} trees, the first round has {n_targets}")
            n_targets = len(rnd)
            rounds.append([Tree.from_dict(t, source, f"rounds[{r}][{k}]", owners) for k, t in enumerate(rnd)])
        raw = _decode_array(d["raw"], source) if d.get("raw") is not None else None
        if raw is None and rounds:
            raise damaged(source, "raw", "missing (the raw scores after the saved rounds)")
        if raw is not None and (raw.shape[0] != n_rows or (n_targets is not None and raw.shape[1] != n_targets)):
            raise damaged(source, "raw", f"raw scores of shape {tuple(raw.shape)}, expected ({n_rows}, "
                                         f"{n_targets if n_targets is not None else 'targets'})")
        records = need_dict(d.get("records", {}), source, "records")
        records = {str(k): need_int(v, source, f"records.{k}", 0) for k, v in records.items()}
        expected = records_per_party(rounds, passives)
        for p in passives:
            if records.get(p, 0) != expected[p]:
                raise damaged(source, f"records.{p}", f"{records.get(p, 0)} records, but the trees use "
                                                      f"{expected[p]} of party {p!r}")
            used = sorted(nd.record_id for rnd in rounds for t in rnd for nd in t.nodes
                          if not nd.is_leaf and nd.owner == p)
            if used != list(range(len(used))):
                raise damaged(source, "rounds", f"the record ids of party {p!r} are not 0..{len(used) - 1} "
                                                "each used once")
        unknown = sorted(set(records) - set(passives))
        if unknown:
            raise damaged(source, f"records.{unknown[0]}", "not a passive party of the checkpoint")
        if "n_rounds" in d and d["n_rounds"] != len(rounds):
            raise damaged(source, "n_rounds", f"{d['n_rounds']!r}, but the checkpoint holds {len(rounds)} rounds")
        history = need_dict(d.get("history") or {}, source, "history")
        for part in ("train", "validation"):          # what a resumed run's monitor reads back
            if history.get(part) is None:
                continue
            for k, vals in need_dict(history[part], source, f"history.{part}").items():
                for i, v in enumerate(need_list(vals, source, f"history.{part}.{k}")):
                    if v is not None:
                        need_float(v, source, f"history.{part}.{k}[{i}]", finite=False, allow_nan=True)
        base = d.get("base_score")
        if base is not None:
            base = [need_float(b, source, f"base_score[{i}]")
                    for i, b in enumerate(need_list(base, source, "base_score", min_len=1))]
            if n_targets is not None and len(base) != n_targets:
                raise damaged(source, "base_score", f"{len(base)} values for {n_targets} target(s)")
        ck = cls(active, passives, model_id, salt, dict(params), n_rows, digest, rounds, raw, records,
                 history=dict(history), digest_layout=layout, base_score=base)
        ck.source = source          # named by the later checks (check_features)
        return ck

    def check_features(self, n_features: int, source: str | None = None) -> None:
        """The active party's splits must name its own features (known only on resume); errors
        name ``source`` (default: the file the checkpoint was read from)."""
        source = source or getattr(self, "source", None) or "checkpoint"
        for r, rnd in enumerate(self.rounds):
            for k, tree in enumerate(rnd):
                for nd in tree.nodes:
                    if not nd.is_leaf and nd.owner == self.active_party and not 0 <= nd.feature_idx < n_features:
                        raise damaged(source, f"rounds[{r}][{k}].nodes[{nd.node_id}].feature_idx",
                                      f"{nd.feature_idx} is out of range (the active party has {n_features} "
                                      "features)")

    def save(self, path) -> None:
        """Write the checkpoint atomically, with its content hash. The raw scores (8 bytes per
        training row) are streamed: their base64 text goes into the hash and the file a piece at a
        time, in the place a one-off marker holds in the rest of the JSON, so a large training's
        checkpoint never exists as one text (the file is the same as ``json.dumps`` of
        :meth:`to_dict` with its ``content_hash``)."""
        if self.raw is None:
            d = self.to_dict()
            d["content_hash"] = content_hash(d)
            write_json_atomic(path, d, indent=None)
            return
        marker = f"vfl-raw-{secrets.token_hex(16)}"
        d = self.to_dict(raw_data=marker)
        head, tail = _around(canonical_bytes(d), marker.encode("ascii"))
        h = hashlib.sha256(head)
        for piece in _base64_pieces(self.raw):
            h.update(piece)
        h.update(tail)
        d["content_hash"] = h.hexdigest()
        head, tail = _around(json.dumps(d, indent=None), marker)
        with atomic_text_writer(path) as fh:
            fh.write(head)
            for piece in _base64_pieces(self.raw):
                fh.write(piece.decode("ascii"))
            fh.write(tail)

    @classmethod
    def load(cls, path) -> "Checkpoint":
        return cls.from_dict(require_content_hash(read_model_json(path, "checkpoint"), str(path)), str(path))

    # -- resuming -----------------------------------------------------------
    def check_resume(self, active_party: str, passives, params: dict, digest: str, n_rows: int) -> None:
        """Refuse a resume that would not continue the same training."""
        if Mode.DP in (params.get("mode"), self.params.get("mode")):
            raise InputError("a dp-mode training cannot be resumed: each passive party's noisy release happens "
                             "once per training, and a resumed run would release again")
        if active_party != self.active_party:
            raise InputError(f"the checkpoint belongs to active party {self.active_party!r}, not {active_party!r}")
        if list(passives) != list(self.passives):
            raise InputError(f"the checkpoint was trained with passive parties {self.passives} (in this "
                             f"order), not {list(passives)}")
        diff = sorted(k for k in set(params) | set(self.params)
                      if k not in RESUMABLE_CHANGES and _param(params, k) != _param(self.params, k))
        if diff:
            raise InputError("training parameters differ from the checkpoint's: " + ", ".join(
                f"{k} {_param(self.params, k)!r} -> {_param(params, k)!r}" for k in diff))
        if params.get("n_estimators", 0) < self.n_rounds:
            raise InputError(f"the checkpoint already has {self.n_rounds} rounds, more than n_estimators "
                             f"{params.get('n_estimators')}")
        if n_rows != self.n_rows or digest != self.data_digest:
            raise InputError(f"the aligned training data differ from the checkpoint's ({n_rows} rows now, "
                             f"{self.n_rows} then): the data files or a party's ids changed; cannot resume")


class CheckpointTracker(RoundObserver):
    """Checkpoints as a round observer: restores the booster's state on resume and saves a
    checkpoint after every round."""

    def __init__(self, active_party: str, passives, params, salt: bytes, model_id: str, ids, X, y,
                 feature_names, resume: Checkpoint | None = None, save=None, rows=None):
        self.save = save
        layout = resume.digest_layout if resume is not None else "columns"     # a resume: the checkpoint's way
        digest = data_digest(ids, X, y, feature_names, rows, layout)
        if resume is not None:
            resume.check_resume(active_party, passives, params.to_dict(), digest, len(y))
            resume.check_features(len(feature_names))
        self.template = Checkpoint(active_party, list(passives), model_id, salt.hex(), params.to_dict(),
                                   int(len(y)), digest, digest_layout=layout,
                                   base_score=resume.base_score if resume is not None else None)
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
            self.save(Checkpoint(t.active_party, t.passives, t.model_id, t.salt, t.params, t.n_rows,
                                 t.data_digest, list(self.rounds), np.array(record.raw, dtype=np.float64),
                                 records_per_party(self.rounds, t.passives), history=record.history,
                                 digest_layout=t.digest_layout, base_score=t.base_score))
