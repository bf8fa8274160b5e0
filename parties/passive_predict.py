"""The passive party's prediction handlers: sessions of rows, routed through its own records.

* ``PredictStart`` -> ``Ack``: a prediction session over the rows whose hashed ids the active
  party sends (PSI sessions open in :mod:`parties.passive_align`);
* ``EvalStart`` -> ``Ack``: the validation session of the training under way;
* ``RouteRequest`` -> ``RouteResponse``: node-by-node prediction, the side of each (row, record);
* ``LeafMaskRequest`` -> ``LeafMaskResponse``: one-round prediction, the leaves each row can reach
  given this party's own splits;
* ``SplitGains`` -> ``Ack``: the gains of this party's splits, for its own gain importance.

Also the local side: the new rows and validation rows a party loads to answer these.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from datasets.errors import InputError, ProtocolError
from datasets.frames import party_data
from datasets.pieces import PieceTable
from parties import prediction_limits, reveal_budget
from parties.dp import check_prediction_ids, id_digests
from parties.passive_state import PassiveState
from protocols import alignment
from protocols import messages as m
from vfl.core.leafmask import Skeleton, leaf_masks
from vfl.core.params import Alignment, Prediction

#: the largest leaf-mask reply a passive party builds (rows x packed leaves of every tree)
MAX_MASK_BYTES = 1 << 28


# -- local data -------------------------------------------------------------
def _features(s: PassiveState, frame: pd.DataFrame, source: str | None):
    """``(ids, X, names)`` of new rows, categorical columns encoded with the training categories
    (a category never seen in training gets code -1 and goes right at every split on it)."""
    d = party_data(frame, s.name, s.id_col, None, source, require_features=True, categories=s.categories)
    return d.ids, d.X, d.feature_names


def load_prediction_data(s: PassiveState, frame: pd.DataFrame, source: str | None = None) -> None:
    if isinstance(frame, PieceTable):       # read per session, a batch of rows at a time
        if s.categories:
            raise InputError(f"party {s.name!r}: a model with categorical features needs its prediction "
                             "data read whole (read_party_table)")
        s.pred_ids, s.pred_X = frame.ids, frame.with_features(list(s.feature_names))
        return
    ids, X, names = _features(s, frame, source)
    missing = [f for f in s.feature_names if f not in names]
    if missing:
        raise InputError(f"party {s.name!r}: prediction data{' ' + source if source else ''} "
                         f"lacks the model's feature column(s) {missing}")
    idx = [names.index(f) for f in s.feature_names]
    s.pred_ids, s.pred_X = ids, X[:, idx]


def load_validation_data(s: PassiveState, frame: pd.DataFrame, source: str | None = None) -> None:
    try:
        ids, X, names = _features(s, frame, source)
    except InputError as exc:
        raise InputError(f"validation set: {exc}") from None
    if s.X is not None:
        missing = [f for f in s.feature_names if f not in names]
        if missing:
            raise InputError(f"validation set: party {s.name!r} lacks feature column(s) {missing}")
        X = X[:, [names.index(f) for f in s.feature_names]]
    s.val_ids, s.val_X = ids, X


# -- sessions ---------------------------------------------------------------
def predict_start(s: PassiveState, req: m.PredictStart) -> m.Ack:
    s.check_allowed(Alignment.HASH, s.allowed_align, "alignment")
    s.check_model(req.model_id)
    ids, X = s.prediction_data()
    own = alignment.hash_ids(ids, s.salt)
    rows = alignment.positions(own, req.hashes, s.name)
    check_prediction_ids(s, np.asarray(ids)[rows])
    prediction_limits.check_training_rows(s, np.asarray(ids)[rows])
    s.sessions[req.session_id] = X[rows]
    s.session_ids[req.session_id] = np.asarray(ids)[rows]
    return m.Ack({"n_rows": int(len(rows))})


def eval_start(s: PassiveState, req: m.EvalStart) -> m.Ack:
    s.check_allowed(Alignment.HASH, s.allowed_align, "alignment")
    s.check_model(req.model_id, "is not training model")
    ids, X = s.validation_data()
    own = alignment.hash_ids(ids, s.salt)
    alignment.check_unique_hashes(own, s.name, "validation ids")
    try:
        rows = alignment.positions(own, req.hashes, s.name)
    except InputError as exc:
        raise InputError(f"validation set does not align: {exc}") from None
    s.sessions[req.session_id] = X[rows]
    s.eval_session = req.session_id
    return m.Ack({"n_rows": int(len(rows))})


# -- answers ----------------------------------------------------------------
def route(s: PassiveState, req: m.RouteRequest) -> m.RouteResponse:
    s.check_allowed(Prediction.NODE, s.allowed_prediction, "prediction")
    X = s.session_rows(req.session_id)
    rec = req.record_ids
    s.table.check_ids(rec, s.name)
    if req.rows.size and (req.rows.min() < 0 or req.rows.max() >= len(X)):
        raise ProtocolError("row index out of range")
    if req.session_id != s.eval_session:
        prediction_limits.charge_routes(s, req.session_id, rec, req.rows)   # path budget, lifetime decisions
    x = X[req.rows, s.table.features(rec)] if rec.size else np.zeros(0)
    return m.RouteResponse(s.table.go_left(rec, x))


def leaf_mask(s: PassiveState, req: m.LeafMaskRequest) -> m.LeafMaskResponse:
    """One-round prediction: per (row, tree) the leaves reachable given our own splits."""
    s.check_allowed(Prediction.ONE_ROUND, s.allowed_prediction, "prediction")
    X = s.session_rows(req.session_id)
    sk = Skeleton(req.tree_sizes, req.left, req.right, req.record_ids).validate(len(s.table))
    prediction_limits.check_skeleton(s, sk)     # each record once, at its own (round, tree, node)
    size = int(sk.mask_bytes().astype(object).sum()) * len(X)
    if size > MAX_MASK_BYTES:
        raise ProtocolError(f"LeafMaskRequest: the masks of {len(X)} rows would take {size} bytes, more than "
                            f"party {s.name!r} builds ({MAX_MASK_BYTES})")
    own = np.flatnonzero(sk.record_ids >= 0)
    rec = sk.record_ids[own]
    go_left = s.table.go_left(rec[None, :], X[:, s.table.features(rec)])
    if req.session_id != s.eval_session:             # (validation: one request per round)
        prediction_limits.charge_leaf_mask(s, req.session_id, len(X), len(own))
        del s.sessions[req.session_id]              # a one-round session is complete
        s.session_ids.pop(req.session_id, None)
    return m.LeafMaskResponse(leaf_masks(sk, own, go_left))


def predict_end(s: PassiveState, req: m.PredictEnd) -> m.Ack:
    """The prediction session is over: forget its rows (idempotent: a one-round session is
    already gone after its leaf-mask request)."""
    known = req.session_id in s.sessions or req.session_id in s.psi_pending
    if req.session_id != s.eval_session:
        s.drop_session(req.session_id)
    return m.Ack({"known": bool(known)})


def split_gains(s: PassiveState, req: m.SplitGains) -> m.Ack:
    s.check_model(req.model_id)
    rec = np.asarray(req.record_ids, dtype=np.int64)
    if rec.shape != np.shape(req.gains) or (rec.size and (rec.min() < 0 or rec.max() >= len(s.table))):
        raise ProtocolError(f"split gains do not match the records of party {s.name!r}")
    for r, gain in zip(rec.tolist(), np.asarray(req.gains, dtype=np.float64).tolist()):
        s.table.records[r]["gain"] = float(gain)
    return m.Ack({"n_records": int(rec.size)})


# -- online scoring (vfl serve; the channels, quotas and audit: parties/passive_online.py) ------
def serve_index(s: PassiveState) -> tuple[object, np.ndarray, object]:
    """``(sorted hashed ids, their rows, X)``: the id index of online scoring over the prediction
    rows under the model's salt (:func:`serve_rows` looks applicants up in it; no Python object per
    row). Rows released in a DP-only training (mode dp) are left out: online they are answered as
    unknown applicants (by the default directions), never by their true values."""
    ids, X = s.prediction_data()
    hashes = alignment.hash_ids(ids, s.salt)
    rows = np.arange(len(ids), dtype=np.int64)
    if s.dp_training_ids is not None and len(ids):
        rows = rows[~np.isin(id_digests(ids), s.dp_training_ids)]
    try:
        index = alignment.check_unique_hashes(hashes[rows], s.name, "ids in its table")
    except InputError as exc:
        raise InputError(f"{exc}: online scoring needs unique ids") from None
    return index, rows, X


def serve_rows(index, rows: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """The table row of every hashed id (-1: not in the table)."""
    pos = alignment.find_rows(index, hashes)
    return np.where(pos >= 0, rows[np.maximum(pos, 0)], -1) if len(rows) else pos


def serve_plan(s: PassiveState, req: m.ServeOpen) -> tuple[Skeleton, np.ndarray, np.ndarray, np.ndarray]:
    """A scoring channel's skeleton, checked against this party's records, and what answering it
    takes: ``(skeleton, own flat nodes, their record ids, their feature columns)``."""
    s.check_allowed(Prediction.ONE_ROUND, s.allowed_prediction, "prediction")
    s.check_model(req.model_id)
    sk = Skeleton(req.tree_sizes, req.left, req.right, req.record_ids).validate(len(s.table))
    prediction_limits.check_skeleton(s, sk)     # each record once, at its own (round, tree, node) (issue 31)
    own = np.flatnonzero(sk.record_ids >= 0)
    rec = sk.record_ids[own]
    return sk, own, rec, s.table.features(rec)


def serve_charge(s: PassiveState, client: str, plan, rows: np.ndarray) -> None:
    """Before an online answer: the known applicants' table ``rows`` must not be training rows of
    the model (rule 'training rows'), and each is charged this party's decisions at every node of the
    channel to the lifetime budget per (client, model, row) (issue 31), as batch prediction is."""
    if not len(rows):
        return
    ids = np.asarray(s.prediction_data()[0])[np.asarray(rows, dtype=np.int64)]
    prediction_limits.check_training_rows(s, ids)
    reveal_budget.on_online(s, client, ids, np.full(len(ids), len(plan[2]), dtype=np.int64))


def serve_decisions(s: PassiveState, plan, X_rows: np.ndarray) -> np.ndarray:
    """This party's decisions at its own nodes of the channel (in node order) for ``X_rows``
    (NaN rows: unknown applicants, by the default directions), packed along axis 1."""
    _, _, rec, feats = plan
    if len(rec) * len(X_rows) > MAX_MASK_BYTES * 8:
        raise ProtocolError(f"ScoreRequest: {len(X_rows)} rows x {len(rec)} nodes is more than party {s.name!r} "
                            "answers")
    go_left = s.table.go_left(rec[None, :], X_rows[:, feats]) if len(rec) else np.zeros((len(X_rows), 0), bool)
    return np.packbits(np.asarray(go_left, dtype=bool), axis=1)
