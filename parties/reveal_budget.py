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

Prediction charges (one per answered request, online scoring many a second) are not rewritten
into that file: each is appended, as one JSON line of increments, to the journal beside it,
``FILE.predictions.jsonl`` (0600; written before the answer leaves, flushed to disk within a
second: :class:`_Flusher`)::

    {"fp": FINGERPRINT, "n_rows": N, "client": CLIENT, "model": MODEL, "add": {ROW_DIGEST: count}}

A row's total is the file's ``predictions`` count (journals folded in, and budgets of earlier
versions) plus every journal line's increment. Each process keeps the totals in memory and,
under the lock, reads only what other processes appended since its last charge: a charge costs
the request's rows, not the file's size. :meth:`RevealBudget.read` gives both merged. A line
torn by a crash (no newline at the end of the file) was never answered: it is sealed and
skipped. Once the journal holds more than :data:`COMPACT_BYTES` and more than twice the file,
its counts are folded into the file's ``predictions`` and an empty journal replaces it (the
journal grows with requests, the file only with distinct rows).

``vfl party passive`` keeps it in ``--reveal-budget FILE``, by default
``MODEL_DIR/ledgers/reveal-budget.json`` (beside ``MODEL_DIR/ledgers/dp-ledger.json``).
"""
from __future__ import annotations

import atexit
import base64
import binascii
import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np

from datasets.errors import InputError, ProtocolError
from datasets.files import write_bytes_atomic, write_json_atomic
from parties.dp_ledger import dataset_fingerprint
from parties.ledger_lock import locked
from parties.passive_limits import Limits

BUDGET_FORMAT = "vfl-reveal-budget"
BUDGET_VERSION = 1
#: where ``vfl party passive`` keeps its ledgers when no file is given: ``MODEL_DIR/ledgers/``
LEDGER_DIR = "ledgers"
REVEAL_FILE = "reveal-budget.json"
DP_LEDGER_FILE = "dp-ledger.json"
#: the prediction charges' journal beside the budget file ``FILE``: ``FILE`` + this
JOURNAL_SUFFIX = ".predictions.jsonl"
JOURNAL_FORMAT = "vfl-reveal-journal"
#: the journal is folded into the budget file once it holds more than this, and more than twice the file
COMPACT_BYTES = 32 << 20

log = logging.getLogger("vfl.passive")


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
        self.where = f"reveal budget {str(self.path)!r}"
        self.journal_path = Path(str(self.path) + JOURNAL_SUFFIX)

    def read(self) -> dict:
        """The budget as a document: the file with the journal's prediction charges merged in."""
        with locked(self.path, self.where):
            journal = _journal_for(self.journal_path)
            journal.refresh(self.where)
            return self._fold(self._read_file(), journal)

    def _fold(self, doc: dict, journal: "_Journal") -> dict:
        """``doc`` (the file's contents) with the journal's counts added to its predictions."""
        for fp, (n_rows, by_client) in journal.totals.items():
            d = self._dataset(doc, fp, n_rows)
            for client, by_model in by_client.items():
                for model, counts in by_model.items():
                    seen = d["predictions"].setdefault(client, {}).setdefault(model, {})
                    for k, n in counts.items():
                        seen[k] = seen.get(k, 0) + n
        return doc

    def _read_file(self) -> dict:
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
        self._same_rows(fp, d["n_rows"], n_rows)
        return d

    def _refuse(self, what: str, rule: str, detail: str):
        raise ProtocolError(f"party {self.party!r} refuses {what}: rule {rule!r}: {detail} (its lifetime budget "
                            f"across sessions, {self.where})")

    def charge_training(self, fp: str, n_rows: int, model_id: str | None, client: str | None) -> int:
        """One more training of the dataset; the number of trainings so far."""
        cap = self.limits.lifetime_trainings
        with locked(self.path, self.where):
            doc = self._read_file()
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
            doc = self._read_file()
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
        ``client`` by model ``model_id``: checked against the totals so far, then appended to the
        journal before the answer leaves (flushed to disk within a second: :class:`_Flusher`)."""
        decisions = np.asarray(decisions, dtype=np.int64)
        if not decisions.size or not int(decisions.max()):
            return
        cap = self.limits.lifetime_prediction_decisions_per_row
        client, model_id = str(client), str(model_id)
        with locked(self.path, self.where):
            journal = _journal_for(self.journal_path)
            journal.refresh(self.where)
            base = self._file_predictions(fp, n_rows, journal)
            known = journal.totals.get(fp)
            if known is not None:
                self._same_rows(fp, known[0], n_rows)
            have = known[1].get(client, {}).get(model_id, {}) if known is not None else {}
            old = base.get(client, {}).get(model_id, {})
            add: dict[str, int] = {}
            for k, n in zip(digests, decisions.tolist()):
                if n:
                    add[k] = add.get(k, 0) + n
            worst = max(old.get(k, 0) + have.get(k, 0) + n for k, n in add.items())
            if worst > cap:
                self._refuse(what, "lifetime prediction decisions",
                             f"a row would have {worst} split decisions of model {model_id!r} revealed to "
                             f"{client!r}, at most {cap} (lifetime_prediction_decisions_per_row)")
            journal.append({"fp": fp, "n_rows": int(n_rows), "client": client, "model": model_id, "add": add},
                           self.where)
            file_bytes = journal.file_sig[2] if journal.file_sig is not None else 0
            if journal.offset > max(COMPACT_BYTES, 2 * file_bytes):
                self._compact(journal)

    def _compact(self, journal: "_Journal") -> None:
        """Fold the journal's counts into the file's ``predictions`` and start an empty journal
        (under the lock), so that the journal grows with the requests only up to
        :data:`COMPACT_BYTES` or twice the file. The file is replaced first: a crash before the
        journal is replaced counts its lines twice, over and never under."""
        write_json_atomic(self.path, self._fold(self._read_file(), journal), indent=None)
        journal.restart()
        journal.file_sig, journal.file_datasets = None, None        # read the file again at the next charge

    def _file_predictions(self, fp: str, n_rows: int, journal: "_Journal") -> dict:
        """The ``predictions`` of dataset ``fp`` in the file itself (journals folded in, budgets of
        earlier versions), read again only when the file changed; its ``n_rows`` checked."""
        try:
            st = os.stat(self.path)
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            sig = None
        if journal.file_datasets is None or journal.file_sig != sig:
            doc = self._read_file()
            journal.file_datasets = {k: (d["n_rows"], d["predictions"]) for k, d in doc["datasets"].items()}
            journal.file_sig = sig
        have = journal.file_datasets.get(fp)
        if have is None:
            return {}
        self._same_rows(fp, have[0], n_rows)
        return have[1]

    def _same_rows(self, fp: str, there: int, here: int) -> None:
        if there != here:
            raise InputError(f"{self.where}: dataset {fp[:16]} has {there} rows there, {here} here")


def _name_line() -> bytes:
    """A new journal's first line: its format and a random id."""
    return (json.dumps({"format": JOURNAL_FORMAT, "version": 1, "id": os.urandom(12).hex()},
                       separators=(",", ":")) + "\n").encode("utf-8")


class _Journal:
    """A process's view of one prediction journal: the totals of every line read so far
    (``{fp: (n_rows, {client: {model: {digest: count}}})}``) and where reading stopped. Used only
    under the budget file's lock. The journal's first line names it (a random id): a journal
    deleted and made anew is read anew, even where the new file got the old one's inode."""

    def __init__(self, path: Path):
        self.path = path
        self.offset, self.head = 0, None
        self.totals: dict = {}
        self.file_sig, self.file_datasets = None, None      # the budget file's own predictions, cached

    def _reset(self, head) -> None:
        self.offset, self.head, self.totals = 0, head, {}

    def refresh(self, where: str) -> None:
        """Take in the lines appended since the last call (by this or another process)."""
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            self._reset(None)
            return
        except OSError as exc:
            raise InputError(f"{where}: cannot read its journal {str(self.path)!r}: {exc.strerror or exc}") from None
        with fh:
            head = fh.readline(512)
            size = os.fstat(fh.fileno()).st_size
            if head != self.head or size < self.offset:         # another journal, or cut short: read it whole
                self._reset(head)
            if size == self.offset:
                return
            fh.seek(self.offset)
            data = fh.read(size - self.offset)
        end = data.rfind(b"\n") + 1
        if end < len(data):
            # a torn last line: its writer died before the line was whole, so its answer was never sent
            log.warning("%s: the journal %s ends in a torn line (a charge interrupted before its answer left); it "
                        "is sealed and skipped", where, self.path)
            self._write(b"\n", where)
            end = len(data) + 1
        for line in data[:end].splitlines():
            if line.strip():
                self._apply(line, where)
        self.offset += end

    def _apply(self, line: bytes, where: str) -> None:
        try:
            e = json.loads(line)
            if isinstance(e, dict) and e.get("format") == JOURNAL_FORMAT:
                return
            fp, n_rows, client, model, add = e["fp"], int(e["n_rows"]), str(e["client"]), str(e["model"]), e["add"]
            if not isinstance(add, dict):
                raise TypeError("add")
            add = {str(k): int(v) for k, v in add.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("%s: a line of %s that is not a charge is skipped", where, self.path)
            return
        self._add(fp, n_rows, client, model, add)

    def _add(self, fp: str, n_rows: int, client: str, model: str, add: dict) -> None:
        seen = self.totals.setdefault(fp, (n_rows, {}))[1].setdefault(client, {}).setdefault(model, {})
        for k, v in add.items():
            seen[k] = seen.get(k, 0) + v

    def append(self, entry: dict, where: str) -> None:
        """One charge, written to the journal when this returns (the kernel holds it; on disk
        within a second). Call :meth:`refresh` first, under the lock."""
        line = (json.dumps(entry, separators=(",", ":"), sort_keys=True) + "\n").encode("utf-8")
        data = line
        if self.head is None:       # a new journal: its first line names it
            self.head = _name_line()
            data = self.head + line
        self._write(data, where)
        self.offset += len(data)
        self._add(entry["fp"], entry["n_rows"], entry["client"], entry["model"], entry["add"])

    def restart(self) -> None:
        """Replace the journal by a new, empty one (a new name line), atomically: every process
        reading it sees another journal and reads it anew."""
        head = _name_line()
        write_bytes_atomic(self.path, head)
        self._reset(head)
        self.offset = len(head)

    def _write(self, data: bytes, where: str) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        try:
            try:
                fd = os.open(self.path, flags, 0o600)
            except FileNotFoundError:       # its folder first
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise InputError(f"{where}: cannot open its journal {str(self.path)!r}: {exc.strerror or exc}") from None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            raise InputError(f"{where}: cannot append to its journal {str(self.path)!r}: "
                             f"{exc.strerror or exc}") from None
        finally:
            os.close(fd)
        _FLUSHER.mark(self.path)


class _Flusher:
    """Flushes the journals written to disk within :attr:`interval` seconds, off the answers' path.

    A charge is written (``write(2)``, ``O_APPEND``) before its answer leaves: a process killed at
    any point loses no charge whose answer left. Flushing each line to disk before answering cost
    a request 1-3 ms on a busy disk (two passive parties, their audit logs); a power loss can now
    lose the last ``interval`` seconds of charges, which no peer of the federation can cause."""

    interval = 1.0

    def __init__(self):
        self._dirty: set[Path] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def mark(self, path: Path) -> None:
        with self._lock:
            self._dirty.add(path)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vfl-journal-flush", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            self.flush()

    def flush(self) -> None:
        """Flush every journal written since the last flush (also at exit)."""
        with self._lock:
            paths, self._dirty = self._dirty, set()
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                continue            # removed meanwhile (a reset budget)
            try:
                os.fsync(fd)
            except OSError as exc:
                log.error("reveal budget journal %s could not be flushed to disk: %s", path, exc.strerror or exc)
            finally:
                os.close(fd)


_FLUSHER = _Flusher()
atexit.register(_FLUSHER.flush)

_JOURNALS: dict[str, _Journal] = {}
_JOURNALS_LOCK = threading.Lock()


def _journal_for(path: Path) -> _Journal:
    """This process's :class:`_Journal` of ``path`` (one per file, shared by its threads)."""
    key = os.path.abspath(path)
    with _JOURNALS_LOCK:
        j = _JOURNALS.get(key)
        if j is None:
            j = _JOURNALS[key] = _Journal(Path(key))
        return j


# -- the passive party's side: charge before the answer leaves ------------------------------------------
_BOOKS: dict[tuple, RevealBudget] = {}


def _budget(s) -> RevealBudget | None:
    """The party's :class:`RevealBudget` (one object per file, limits and party, made once: it is
    asked for every online request)."""
    if s.limits is None or s.reveal_budget_path is None:
        return None
    key = (str(s.reveal_budget_path), id(s.limits), s.name)
    book = _BOOKS.get(key)
    if book is None or book.limits is not s.limits:
        if len(_BOOKS) >= 64:       # parties come and go in one process (tests, the Python API)
            _BOOKS.clear()
        book = _BOOKS[key] = RevealBudget(s.reveal_budget_path, s.limits, s.name)
    return book


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
