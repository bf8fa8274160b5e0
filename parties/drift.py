"""Drift of every party's own inputs on a scoring batch (issue 34): the ``DriftRequest`` family.

Each party computes the PSI of its own features locally, against the bin counts of its training
rows kept in its own model file (:mod:`vfl.core.drift`):

* passive side, :func:`drift_request` -> ``DriftReply``: the rows of a prediction session are
  counted into a drift run (one per scoring job, over all its batches); the last request of the
  run is answered with one PSI per feature: by position, or by name where the party's policy
  (its federation entry's ``drift``) says ``names``; ``decline`` answers nothing. A run is
  answered over at least :data:`DRIFT_MIN_ROWS` rows (the party's floor: PSI over a handful of
  rows would tell which bin each row falls in; a smaller run is declined), once, and then forgotten;
* active side, :class:`DriftRun`: its own features' and the score's counts, one ``DriftRequest``
  per passive party and batch, and the report (:meth:`DriftRun.report`).

What the active party learns: one number per passive feature per scoring job, never counts or
bins. Two runs over row sets that differ little still differ little: the floor does not stop an
active party that scores chosen batches from differencing them (docs/model-report.md).
"""
from __future__ import annotations

import secrets
from collections import OrderedDict

import numpy as np

from datasets.errors import ProtocolError
from parties.passive_state import PassiveState
from protocols import messages as m
from protocols.transport import Transport
from vfl.core import drift as core
from vfl.core.dp_bins import DPBinner
from vfl.core.objectives import get_objective
from vfl.core.params import Mode

#: the fewest rows a passive party answers a drift run over (a party may raise it)
DRIFT_MIN_ROWS = 100
#: drift runs a passive party keeps counting at once (the oldest is forgotten beyond)
MAX_DRIFT_RUNS = 16


# -- passive side -------------------------------------------------------------
def drift_request(s: PassiveState, req: m.DriftRequest) -> m.DriftReply:
    """Count the session's rows into the run; answer the PSI per feature on the final request."""
    s.check_model(req.model_id)
    X = s.session_rows(req.session_id)
    if s.drift_policy == "decline":
        return m.DriftReply(m.DriftStatus.DECLINED, reason=f"party {s.name!r} does not share drift")
    if req.session_id == s.eval_session:
        raise ProtocolError(f"party {s.name!r}: drift is asked of prediction sessions, not of the validation session")
    if s.drift_reference is None:
        why = s.drift_withheld or "its model file predates them"
        return m.DriftReply(m.DriftStatus.NO_REFERENCE, reason=f"party {s.name!r}: {core.NO_TRAINING_COUNTS} ({why})")
    runs: OrderedDict = s.drift_runs
    run = runs.get(req.drift_id)
    if run is None:
        run = runs[req.drift_id] = (core.DriftCounts(s.drift_reference), set())
        while len(runs) > MAX_DRIFT_RUNS:
            runs.popitem(last=False)
    counts, sessions = run
    if req.session_id in sessions:
        raise ProtocolError(f"party {s.name!r}: prediction session {req.session_id!r} was already counted in drift "
                            f"run {req.drift_id!r}")
    sessions.add(req.session_id)
    counts.add(X)
    if not req.final:
        return m.DriftReply(m.DriftStatus.COUNTED, n_rows=counts.n_rows)
    del runs[req.drift_id]
    floor = max(DRIFT_MIN_ROWS, int(s.drift_min_rows or 0))
    if counts.n_rows < floor:         # withheld, not an error: the scoring itself goes on
        return m.DriftReply(m.DriftStatus.DECLINED, n_rows=counts.n_rows,
                            reason=f"party {s.name!r} answers drift over at least {floor} rows (rule 'drift rows'), "
                                   f"this batch has {counts.n_rows}")
    values = np.array([np.nan if v is None else v for v in counts.psi()], dtype=np.float64)
    names = [f["name"] for f in s.drift_reference["features"]] if s.drift_policy == "names" else []
    return m.DriftReply(m.DriftStatus.PSI, values, names, counts.n_rows)


def fit_training_reference(s: PassiveState) -> None:
    """At the end of a completed training: the bin counts of this party's features on its aligned
    training rows (kept in its model file). A DP training (mode dp, or a DP released model) keeps
    none: PSI against exact training counts would tell the active party about the training rows
    beyond what the printed epsilon covers; such a model answers drift "no training counts"."""
    rows = s.train.rows
    if rows is None or s.X is None:
        return
    if s.train.mode == Mode.DP or isinstance(s.train.binner, DPBinner):
        s.drift_reference = None
        s.drift_withheld = "a DP training keeps no exact training counts (its epsilon would not hold)"
        return
    rows = np.asarray(rows)
    X = s.X[rows] if isinstance(s.X, np.ndarray) else np.asarray(s.X[rows], dtype=np.float64)
    s.drift_reference = core.fit_reference(X, s.feature_names, s.categories)


# -- active side --------------------------------------------------------------
class DriftRun:
    """The drift of one scoring job (any number of batches) of ``model``: the active party's own
    features and score counted here, each passive party's PSI asked with :meth:`ask`."""

    def __init__(self, model):
        self.model = model
        self.drift_id = secrets.token_hex(8)
        ref = model.drift or {}
        self.withheld = ref.get("withheld")
        self.own = core.DriftCounts(ref["features"]) if ref.get("features") else None
        self.score = core.DriftCounts(ref["score"]) if ref.get("score") else None
        self.replies: dict[str, m.DriftReply] = {}
        self.n_rows = 0

    def ask(self, transport: Transport, session_id: str, final: bool) -> None:
        """Every passive party counts the session's rows (before its leaf masks end the session)."""
        replies = transport.call_many({p: m.DriftRequest(self.model.model_id, session_id, self.drift_id, final)
                                       for p in self.model.passives})
        for p, r in replies.items():
            if final or r.status != m.DriftStatus.COUNTED:
                self.replies[p] = r

    def add(self, X_active: np.ndarray, raw: np.ndarray) -> None:
        """Count a batch's active features and the model's score on it."""
        self.n_rows += len(raw)
        if self.own is not None:
            self.own.add(X_active)
        if self.score is not None:
            out = get_objective(self.model.objective).transform(raw)
            self.score.add(core.score_columns(self.model.objective, out, self.model.classes)[0])

    def _own_section(self, counts, what: str, withheld: str | None = None) -> dict:
        if counts is None:
            return {"status": "no training counts", "reason": withheld or self.withheld or
                    f"{core.NO_TRAINING_COUNTS}: the model file predates them ({what})"}
        names = [f["name"] for f in counts.reference["features"]]
        return {"status": "ok", "features": core.entries(names, counts.psi())}

    def report(self) -> dict:
        """``{"n_rows", "thresholds", "score", "parties": {party: {...}}, "flagged"}``: the score's PSI
        and every party's per feature, each with its flag; a passive party that declined or keeps no
        training counts is reported so."""
        parties = {self.model.active_party: self._own_section(self.own, "the active party's features",
                                                              (self.model.drift or {}).get("withheld_features"))}
        for p in self.model.passives:
            r = self.replies.get(p)
            if r is None:
                parties[p] = {"status": "not asked"}
            elif r.status == m.DriftStatus.DECLINED:
                parties[p] = {"status": "declined", "reason": r.reason}
            elif r.status == m.DriftStatus.NO_REFERENCE:
                parties[p] = {"status": "no training counts", "reason": r.reason}
            else:
                values = [None if np.isnan(v) else float(v) for v in r.psi.tolist()]
                named = len(r.names) == len(values)
                names = list(r.names) if named else [f"#{j}" for j in range(len(values))]
                parties[p] = {"status": "ok", "named": named, "n_rows": int(r.n_rows),
                              "features": core.entries(names, values)}
        score = self._own_section(self.score, "the score")
        flagged = [{"party": p, **e} for p, sec in parties.items() for e in sec.get("features", [])
                   if e["flag"] in ("moderate", "major")]
        flagged += [{"party": "score", **e} for e in score.get("features", []) if e["flag"] in ("moderate", "major")]
        return {"n_rows": self.n_rows, "thresholds": {"moderate": core.MODERATE, "major": core.MAJOR},
                "score": score, "parties": parties, "flagged": flagged}


def with_last(items):
    """``(item, is_last)`` for every item of an iterable (one item read ahead)."""
    it = iter(items)
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True


def format_drift(report: dict) -> list[str]:
    """The drift report as lines for a terminal: the score, then each party's features, flagged
    ones marked (``!`` moderate, ``!!`` major)."""
    marks = {"moderate": " !", "major": " !!"}

    def section(label, sec):
        if sec.get("status") != "ok":
            return [f"drift {label}: {sec.get('status')}" + (f" ({sec['reason']})" if sec.get("reason") else "")]
        parts = [f"{e['feature']} {'n/a' if e['psi'] is None else format(e['psi'], '.4f')}{marks.get(e['flag'], '')}"
                 for e in sec["features"]]
        return [f"drift {label}: " + ", ".join(parts)]
    lines = [f"drift over {report['n_rows']} rows (PSI; ! >= {report['thresholds']['moderate']}, "
             f"!! >= {report['thresholds']['major']})"]
    lines += section("score", report["score"])
    for p, sec in report["parties"].items():
        lines += section(p, sec)
    return lines
