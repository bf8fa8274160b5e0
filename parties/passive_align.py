"""The passive party's alignment handlers: salted id hashes and ECDH-PSI.

* ``AlignRequest`` -> ``IdHashes``, ``AlignResult`` -> ``AlignAck``: hash alignment of the
  training rows (a new training session starts).
* ``PsiRequest`` -> ``PsiResponse``, ``PsiResult`` -> ``AlignAck``: PSI (see
  :mod:`protocols.psi`) for training (a new session), prediction or the validation rows; the
  active party's side is :mod:`parties.psi_align`.
"""
from __future__ import annotations

import numpy as np

from datasets.errors import ProtocolError
from parties import prediction_limits
from parties.dp import check_prediction_ids
from parties.passive_state import PassiveState
from protocols import alignment, psi
from protocols import messages as m
from vfl.core.params import Alignment


def align_request(s: PassiveState, req: m.AlignRequest) -> m.IdHashes:
    s.check_allowed(Alignment.HASH, s.allowed_align, "alignment")
    if len(req.salt) < 16:
        raise ProtocolError("salt must have at least 16 bytes")
    s.need("any training data", s.X)
    s.reset_training()
    s.salt = req.salt
    hashes = alignment.hash_ids(s.ids, req.salt)
    # kept sorted for the result (sorted once); the reply's array goes once it is sent
    s.train.hashes = alignment.check_unique_hashes(hashes, s.name)
    return m.IdHashes(hashes)


def align_result(s: PassiveState, req: m.AlignResult) -> m.AlignAck:
    s.train.rows = alignment.positions(s.need("alignment", s.train.hashes), req.hashes, s.name)
    s.train.hashes = None       # aligned: the rows are all the training keeps
    return m.AlignAck(int(len(s.ids)), int(len(s.train.rows)))


def psi_request(s: PassiveState, req: m.PsiRequest) -> m.PsiResponse:
    """ECDH-PSI step 2: blind the active party's values again; send own ids blinded."""
    s.check_allowed(Alignment.PSI, s.allowed_align, "alignment")
    if req.purpose == m.PsiPurpose.TRAIN:
        s.need("any training data", s.X)
        ids, X = s.ids, None
    elif req.purpose == m.PsiPurpose.PREDICT:
        s.check_model(req.model_id)
        ids, X = s.prediction_data()
    elif req.purpose == m.PsiPurpose.VALIDATE:       # the validation set of the training under way (issue 4)
        s.check_model(req.model_id, "is not training model")
        ids, X = s.validation_data()
    else:
        raise ProtocolError(f"unknown PSI purpose {req.purpose!r}")
    alignment.check_unique(alignment.normalize_ids(ids), s.name)
    points = psi.hash_to_points(ids, req.salt)          # checks the salt
    key = psi.BlindingKey()
    double = key.blind(req.blinded, "the active party's blinded ids")
    perm = psi.secret_permutation(len(points))          # sent[j] is own row perm[j]
    own = key.blind(points[perm], "own ids")
    if req.purpose == m.PsiPurpose.TRAIN:
        s.reset_training()
        s.salt = req.salt
    pending = s.psi_pending
    pending[req.session_id] = {"purpose": req.purpose, "perm": perm, "X": X, "ids": ids}
    while len(pending) > s.psi_pending_cap:                # forget abandoned sessions
        pending.pop(next(iter(pending)))
    return m.PsiResponse(double, own)


def psi_result(s: PassiveState, req: m.PsiResult) -> m.AlignAck:
    """ECDH-PSI end: the positions (in our blinded list) of the rows to use, in order."""
    state = s.psi_pending.pop(req.session_id, None)
    if state is None:
        raise ProtocolError(f"unknown PSI session {req.session_id!r} at party {s.name!r}")
    perm = state["perm"]
    pos = psi.check_positions(req.positions, len(perm), "PSI result positions")
    rows = perm[pos]
    if state["purpose"] == m.PsiPurpose.TRAIN:
        if rows.size == 0:
            raise ProtocolError("the PSI result is empty")
        s.train.rows = rows
    else:
        if state["purpose"] == m.PsiPurpose.PREDICT:
            check_prediction_ids(s, np.asarray(state["ids"])[rows])
            prediction_limits.check_training_rows(s, np.asarray(state["ids"])[rows])
            s.session_ids[req.session_id] = np.asarray(state["ids"])[rows]
        s.sessions[req.session_id] = state["X"][rows]
        if state["purpose"] == m.PsiPurpose.VALIDATE:
            s.eval_session = req.session_id
    return m.AlignAck(int(len(perm)), int(len(rows)))
