"""A passive party's lifetime budget of what it reveals about its dataset (issue 31, Build 2, 5).

A training session ends at the first refused request, but a requester can open the next one at
once; a prediction session's path budget ended with the session. The reveal budget counts, per
dataset (keyed like the DP ledger by :func:`parties.dp_ledger.dataset_fingerprint`: its ids,
feature names and values), across sessions and restarts:

* ``trainings``: training setups accepted (rule 'lifetime trainings');
* ``split_answers``: per row of the dataset, the split decisions this party sent about it (each
  ``SplitRequest`` answers left/right for every row of the node; rule 'lifetime split answers');
* ``predictions``: per (client, model, row), the split decisions of this party's records a
  prediction revealed (node-by-node: one per record asked about the row; one-round: every record
  of the checked skeleton; rule 'lifetime prediction decisions').

The caps are the party's :class:`parties.passive_limits.Limits`. A charge is checked and written
before the answer leaves (a refused request writes nothing), under the file's lock
(:func:`parties.ledger_lock.locked`): two trainings or predictions charging at once are both
counted. The file (atomic, 0600)::

    {"format": "vfl-reveal-budget", "version": 1,
     "datasets": {FINGERPRINT: {"n_rows": N,
                                "trainings": [{"time": ..., "model_id": ..., "client": ...}, ...],
                                "split_answers": base64 of N little-endian uint32 counts, one per row,
                                "predictions": {CLIENT: {MODEL: {ROW_DIGEST: count}}}}}}

``vfl party passive`` keeps it in ``--reveal-budget FILE``, by default
``MODEL_DIR/ledgers/reveal-budget.json`` (beside ``MODEL_DIR/ledgers/dp-ledger.json``).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from pathlib import Path

import numpy as np

from datasets.errors import InputError, ProtocolError
from datasets.files import write_json_atomic
from parties.dp_ledger import dataset_fingerprint
from parties.ledger_lock import locked
from parties.passive_limits import Limits

BUDGET_FORMAT = "vfl-reveal-budget"
BUDGET_VERSION = 1
#: where ``vfl party passive`` keeps its ledgers when no file is given: ``MODEL_DIR/ledgers/``
LEDGER_DIR = "ledgers"
REVEAL_FILE = "reveal-budget.json"
DP_LEDGER_FILE = "dp-ledger.json"


def default_paths(model_dir) -> tuple[Path, Path]:
    """``(reveal budget, DP ledger)`` files of a party serving from ``model_dir``."""
    d = Path(model_dir) / LEDGER_DIR
    return d / REVEAL_FILE, d / DP_LEDGER_FILE


def _counts(text: str) -> np.ndarray:
    """The per-row counts of a ``split_answers`` field (base64 of little-endian uint32)."""
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % 4:
        raise ValueError("not a whole number of uint32")
    return np.frombuffer(raw, dtype="<u4")


def _encode(counts: np.ndarray) -> str:
    return base64.b64encode(np.asarray(counts, dtype="<u4").tobytes()).decode("ascii")


def split_answers(doc: dict, fingerprint: str) -> np.ndarray:
    """The split answers per row of one dataset of a budget file (for reports and tests)."""
    return _counts(doc["datasets"][fingerprint]["split_answers"]).astype(np.int64)


def row_digests(ids) -> list[str]:
    """A row's key in the prediction budget: sha256 of its id (the file holds no ids)."""
    return [hashlib.sha256(b"vfl-row\0" + str(i).encode()).hexdigest()[:24] for i in np.asarray(ids).tolist()]


class RevealBudget:
    """The budget file at ``path`` under ``limits`` for party ``party``."""

    def __init__(self, path, limits: Limits, party: str = ""):
        self.path, self.limits, self.party = Path(path), limits, party

    @property
    def where(self) -> str:
        return f"reveal budget {str(self.path)!r}"

    def read(self) -> dict:
        if not self.path.exists():
            return {"format": BUDGET_FORMAT, "version": BUDGET_VERSION, "datasets": {}}
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{self.where} cannot be read: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != BUDGET_FORMAT or doc.get("version") != BUDGET_VERSION \
                or not isinstance(doc.get("datasets"), dict):
            raise InputError(f"{self.where} is not a {BUDGET_FORMAT} version {BUDGET_VERSION} file")
        for fp, d in doc["datasets"].items():
            ok = isinstance(d, dict) and isinstance(d.get("n_rows"), int) and isinstance(d.get("trainings"), list) \
                and isinstance(d.get("split_answers"), str) and isinstance(d.get("predictions"), dict)
            if ok:
                try:
                    ok = len(_counts(d["split_answers"])) == d["n_rows"]
                except (ValueError, binascii.Error, UnicodeEncodeError):
                    ok = False
            if not ok:
                raise InputError(f"{self.where}: dataset {fp!r} must hold n_rows, trainings, split_answers (base64 "
                                 "of one little-endian uint32 count per row) and predictions")
        return doc

    def _dataset(self, doc: dict, fp: str, n_rows: int) -> dict:
        d = doc["datasets"].setdefault(fp, {"n_rows": int(n_rows), "trainings": [],
                                            "split_answers": _encode(np.zeros(n_rows, np.int64)), "predictions": {}})
        if d["n_rows"] != n_rows:
            raise InputError(f"{self.where}: dataset {fp[:16]} has {d['n_rows']} rows there, {n_rows} here")
        return d

    def _refuse(self, what: str, rule: str, detail: str):
        raise ProtocolError(f"party {self.party!r} refuses {what}: rule {rule!r}: {detail} (its lifetime budget "
                            f"across sessions, {self.where})")

    def charge_training(self, fp: str, n_rows: int, model_id: str | None, client: str | None) -> int:
        """One more training of the dataset; the number of trainings so far."""
        cap = self.limits.lifetime_trainings
        with locked(self.path, self.where):
            doc = self.read()
            d = self._dataset(doc, fp, n_rows)
            if len(d["trainings"]) >= cap:
                self._refuse("TrainSetup", "lifetime trainings", f"the dataset was trained {len(d['trainings'])} "
                                                                 f"times, at most {cap} (lifetime_trainings)")
            d["trainings"].append({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                   "model_id": model_id, "client": client})
            write_json_atomic(self.path, doc, indent=None)
            return len(d["trainings"])

    def charge_splits(self, fp: str, n_rows: int, rows: np.ndarray) -> None:
        """A split answer about each of ``rows`` (indices into the dataset, one per decision sent)."""
        rows = np.asarray(rows, dtype=np.int64)
        if not rows.size:
            return
        cap = self.limits.lifetime_split_answers_per_row
        with locked(self.path, self.where):
            doc = self.read()
            d = self._dataset(doc, fp, n_rows)
            counts = _counts(d["split_answers"]).astype(np.int64) + np.bincount(rows, minlength=n_rows)
            if counts.size and int(counts.max()) > cap:
                self._refuse("SplitRequest", "lifetime split answers",
                             f"row {int(counts.argmax())} of its data would get {int(counts.max())} split answers, at "
                             f"most {cap} (lifetime_split_answers_per_row); the training ends")
            d["split_answers"] = _encode(counts)
            write_json_atomic(self.path, doc, indent=None)

    def charge_predictions(self, fp: str, n_rows: int, client: str, model_id: str, digests: list[str],
                           decisions: np.ndarray, what: str) -> None:
        """``decisions[i]`` split decisions revealed about the row with digest ``digests[i]`` to
        ``client`` by model ``model_id``."""
        decisions = np.asarray(decisions, dtype=np.int64)
        if not decisions.size or not int(decisions.max()):
            return
        cap = self.limits.lifetime_prediction_decisions_per_row
        with locked(self.path, self.where):
            doc = self.read()
            d = self._dataset(doc, fp, n_rows)
            seen = d["predictions"].setdefault(str(client), {}).setdefault(str(model_id), {})
            new = {}
            for k, n in zip(digests, decisions.tolist()):
                if n:
                    new[k] = new.get(k, seen.get(k, 0)) + n
            worst = max(new.values())
            if worst > cap:
                self._refuse(what, "lifetime prediction decisions",
                             f"a row would have {worst} split decisions of model {model_id!r} revealed to "
                             f"{client!r}, at most {cap} (lifetime_prediction_decisions_per_row)")
            seen.update(new)
            write_json_atomic(self.path, doc, indent=None)


# -- the passive party's side: charge before the answer leaves ------------------------------------------
def _budget(s) -> RevealBudget | None:
    if s.limits is None or s.reveal_budget_path is None:
        return None
    return RevealBudget(s.reveal_budget_path, s.limits, s.name)


def _fp(s) -> tuple[str, int]:
    ids, X = (s.ids, s.X) if s.ids is not None else (s.pred_ids, s.pred_X)    # a served model: its rows
    if s.fingerprint is None:
        s.fingerprint = dataset_fingerprint(ids if ids is not None else [], X, s.feature_names)
    return s.fingerprint, 0 if ids is None else len(ids)


def on_setup(s, req) -> None:
    """A ``TrainSetup`` against this party's own limits (rounds x depth, DP-only without a domain),
    then one training charged to its lifetime budget."""
    limits = s.limits
    if limits is None:
        return
    limits.check_setup(s.name, int(req.n_rounds), int(req.max_depth))
    if req.mode == "dp" and req.dp_binning is None and not limits.dp_allow_unbounded:
        raise ProtocolError(f"party {s.name!r} refuses TrainSetup: rule 'dp unbounded': a DP-only training (mode "
                            "dp) without a data-independent domain releases every row's exact quantile bin (epsilon "
                            "= inf); this party allows it only with dp_allow_unbounded = true in its federation entry")
    book = _budget(s)
    if book is not None:
        fp, n = _fp(s)
        book.charge_training(fp, n, req.model_id, s.trainer)


def on_split(s, members) -> None:
    """The split answers about to be sent: one per row of each node (``members``: aligned rows)."""
    book = _budget(s)
    if book is None or not members:
        return
    fp, n = _fp(s)
    rows = np.concatenate([np.asarray(r, dtype=np.int64) for r in members])
    try:
        book.charge_splits(fp, n, np.asarray(s.train.rows)[rows])
    except ProtocolError as exc:
        if s.train.protocol is not None:        # the training ends (the server drops the session)
            s.train.protocol.refused = str(exc)
        raise


def on_online(s, client: str, ids, decisions: np.ndarray) -> None:
    """Online scoring (no session): ``decisions[i]`` split decisions about the row with id ``ids[i]``
    about to be sent to ``client``."""
    book = _budget(s)
    if book is None or not len(ids):
        return
    fp, n = _fp(s)
    book.charge_predictions(fp, n, client, str(s.model_id), row_digests(ids), decisions, "ScoreRequest")


def on_prediction(s, session_id: str, rows: np.ndarray, decisions: np.ndarray, what: str) -> None:
    """``decisions[i]`` split decisions about session row ``rows[i]`` about to be sent."""
    book = _budget(s)
    ids = s.session_ids.get(session_id)
    if book is None or ids is None:
        return
    fp, n = _fp(s)
    digests = row_digests(np.asarray(ids)[np.asarray(rows, dtype=np.int64)])
    book.charge_predictions(fp, n, s.session_owner.get(session_id, "local"), str(s.model_id), digests, decisions,
                            what)
