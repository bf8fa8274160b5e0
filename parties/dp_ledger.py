"""A passive party's lifetime privacy ledger (issue 23): what every DP release and training of its
dataset spent, on disk, across trainings and restarts.

Without it a party refuses a second release only within one ``model_id``, which the active party
chooses: a new training would get a fresh release of the same rows. With a ledger
(``PassiveParty.dp_ledger_path``, ``vfl party passive --dp-ledger FILE``) every charge is written
before the mechanism runs, keyed by the dataset's fingerprint (sha256 of its ids, feature names and
values), and ``dp_lifetime_epsilon`` (``--dp-lifetime-epsilon``) refuses whatever would take the
total above it. The total is basic composition (a sum), an upper bound on the per-row loss: each
entry is the largest loss of any row in that charge.

What is charged, per training of the party's data:

* mode dp: the DP histograms of the bucket edges (at setup) and each release's per-row loss beyond
  what this training's earlier releases already charged (releases of one training take disjoint
  rows: their loss is the largest, not the sum);
* ``--dp-model``: the released model's total epsilon, as the active party states it at setup;
* any training without DP (modes he, plain without ``--dp-model``, mode dp at epsilon inf):
  ``inf``; with a lifetime limit such a training is refused.

The file: JSON ``{"format": "vfl-dp-ledger", "version": 1, "datasets": {fingerprint: [entry...]}}``,
written atomically with mode 0600. ``vfl dp-ledger show FILE`` prints it.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np

from datasets.errors import InputError, ProtocolError
from datasets.files import write_json_atomic
from parties.ledger_lock import locked

LEDGER_FORMAT = "vfl-dp-ledger"
LEDGER_VERSION = 1
INF = float("inf")


def dataset_fingerprint(ids, X, feature_names) -> str:
    """sha256 of a party's dataset: its ids, feature names and values (NaN canonical)."""
    h = hashlib.sha256(b"vfl-dp-dataset-v1\0")
    h.update(json.dumps([str(f) for f in feature_names]).encode())
    h.update(b"\0")
    for i in np.asarray(ids).tolist():
        h.update(str(i).encode() + b"\0")
    if isinstance(X, np.ndarray):
        v = np.ascontiguousarray(X, dtype=np.float64).copy()
        v[np.isnan(v)] = np.nan
        h.update(v.tobytes())
    return h.hexdigest()


def _num(e):
    return "inf" if e == INF else float(e)


def check_lifetime(value, what: str = "dp_lifetime_epsilon"):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not value >= 0:
        raise InputError(f"{what} must be a number >= 0 (0: nothing may be spent), got {value!r}")
    return float(value)


class PrivacyLedger:
    """The ledger file at ``path``; ``lifetime``: the most epsilon any dataset may spend (None: no cap)."""

    def __init__(self, path, lifetime: float | None = None, party: str = "", dp_cap: float | None = None):
        """``dp_cap``: the default cap (:data:`parties.passive_limits.DEFAULT_DP_LIFETIME_EPSILON`) on what
        the dataset's DP releases spend (its finite charges); a training without DP is recorded (inf)
        but refused only under an explicit ``lifetime``."""
        self.path = Path(path)
        self.lifetime = check_lifetime(lifetime)
        self.dp_cap = check_lifetime(dp_cap, "dp_lifetime_epsilon (default cap)")
        self.party = party

    def read(self) -> dict:
        where = f"DP ledger {str(self.path)!r}"
        if not self.path.exists():
            return {"format": LEDGER_FORMAT, "version": LEDGER_VERSION, "datasets": {}}
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{where} cannot be read: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != LEDGER_FORMAT or doc.get("version") != LEDGER_VERSION \
                or not isinstance(doc.get("datasets"), dict):
            raise InputError(f"{where} is not a {LEDGER_FORMAT} version {LEDGER_VERSION} file")
        for fp, entries in doc["datasets"].items():
            if not isinstance(entries, list) or not all(isinstance(e, dict) and "epsilon" in e for e in entries):
                raise InputError(f"{where}: dataset {fp!r} must list entries with an epsilon")
            for e in entries:       # every entry checked on read: `show --json` prints no NaN, no list kind
                if not isinstance(e.get("kind", ""), str):
                    raise InputError(f"{where}: dataset {fp!r}: an entry's kind must be a string, got {e['kind']!r}")
                try:
                    self._eps(e)
                except InputError as exc:
                    raise InputError(f"{where}: dataset {fp!r}: {exc}") from None
        return doc

    @staticmethod
    def _eps(e) -> float:
        v = e["epsilon"]
        if v == "inf":
            return INF
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise InputError(f"DP ledger entry {e!r}: epsilon must be a number >= 0 or 'inf'")
        return float(v)

    def spent(self, fingerprint: str) -> float:
        return float(sum(self._eps(e) for e in self.read()["datasets"].get(fingerprint, [])))

    def check(self, fingerprint: str, epsilon: float, what: str) -> None:
        """Refuse (ProtocolError) if spending ``epsilon`` more would exceed the lifetime limit."""
        self._refuse_above(self.spent(fingerprint), epsilon, what)

    def charge(self, fingerprint: str, epsilon: float, kind: str, model_id: str | None, planned: float | None = None,
               **detail) -> float:
        """Record ``epsilon`` spent on the dataset, first refusing it if the total would exceed the
        lifetime limit (then nothing is written and the mechanism must not run), or if ``planned``
        (the whole training's cost, of which this is the first part) would. The read, the check and
        the write hold the ledger's file lock (:func:`parties.ledger_lock.locked`): two trainings
        charging at once are both counted. Returns the new total."""
        eps = INF if epsilon == INF else float(epsilon)
        if not eps >= 0:
            raise InputError(f"a DP charge must be >= 0, got {epsilon!r}")
        with locked(self.path, f"DP ledger {str(self.path)!r}"):
            doc = self.read()
            entries = doc["datasets"].setdefault(fingerprint, [])
            total = float(sum(self._eps(e) for e in entries))
            if planned is not None:
                self._refuse_above(total, planned, f"a training at epsilon {planned:.6g}")
            what = "a training without differential privacy (unbounded epsilon)" if eps == INF else \
                f"{kind} at epsilon {eps:.6g}"
            self._refuse_above(total, eps, what)
            if self.lifetime is None and self.dp_cap is not None and eps != INF:
                spent = float(sum(v for v in map(self._eps, entries) if v != INF))
                for amount, about in ((planned, f"a training at epsilon {planned or 0:.6g}"), (eps, what)):
                    if amount is not None and spent + amount > self.dp_cap * (1 + 1e-12):
                        raise ProtocolError(
                            f"party {self.party!r} refuses {about}: its dataset's DP releases have spent epsilon "
                            f"{spent:.6g} of the default lifetime cap {self.dp_cap:.6g} (dp_lifetime_epsilon; DP "
                            f"ledger {str(self.path)!r})")
            entries.append({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kind": kind,
                            "model_id": model_id, "epsilon": _num(eps), **detail})
            write_json_atomic(self.path, doc)
        return total + eps

    def _refuse_above(self, total: float, eps: float, what: str) -> None:
        if self.lifetime is not None and total + eps > self.lifetime * (1 + 1e-12):
            raise ProtocolError(f"party {self.party!r} refuses {what}: its dataset has spent epsilon {total:.6g} "
                                f"of its lifetime budget {self.lifetime:.6g} (DP ledger {str(self.path)!r})")


def summary(doc: dict) -> dict:
    """``{fingerprint: {"epsilon": total, "entries": n, "kinds": {kind: epsilon}}}`` of a ledger."""
    out = {}
    for fp, entries in doc["datasets"].items():
        kinds: dict = {}
        for e in entries:
            v = PrivacyLedger._eps(e)
            kinds[e.get("kind", "?")] = kinds.get(e.get("kind", "?"), 0.0) + v
        total = sum(kinds.values())
        out[fp] = {"epsilon": _num(total), "entries": len(entries), "kinds": {k: _num(v) for k, v in kinds.items()}}
    return out
