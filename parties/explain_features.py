"""The active party's side of the opt-in per-feature explanations of passive parties.

After an explanation batch (one one-round prediction session, exactly prediction's messages),
the active party opens one more prediction session over the same rows (hashed ids) at each
passive party it is asked to serve and sends it a :class:`protocols.messages.FeatureSplitRequest`
(:func:`vfl.core.explain.feature_split_input`): the party splits its grouped attribution among
its own features and keeps the values; the active party gets back a row count, no value. A party
whose own policy does not allow it (``explain_features``) refuses, naming the rule.
"""
from __future__ import annotations

import secrets

import numpy as np

from datasets.errors import InputError
from parties.remote import end_prediction
from protocols import alignment
from protocols import messages as m
from protocols.transport import Transport
from vfl.core.explain import feature_split_input
from vfl.core.model import BoostedModel, OneRound
from vfl.core.params import Alignment

#: the group weights of one request stay below this many bytes: more rows go in more sessions
MAX_WEIGHT_BYTES = 64 << 20


def chosen_parties(model: BoostedModel, passive_features) -> list[str]:
    """The passive parties asked to split their values: ``True`` every one, else a list of names."""
    if passive_features is None or passive_features is False:
        return []
    if passive_features is True:
        return list(model.passives)
    names = [passive_features] if isinstance(passive_features, str) else list(passive_features)
    unknown = [p for p in names if p not in model.passives]
    if unknown:
        raise InputError(f"passive_features: {unknown} are not passive parties of the model ({list(model.passives)})")
    return names


def send_feature_splits(transport: Transport, model: BoostedModel, one: OneRound, ids: np.ndarray,
                        parties: list[str], align: str) -> dict[str, int]:
    """Send each party in ``parties`` its :class:`FeatureSplitRequest` for the rows ``ids`` that
    ``one`` explained; ``{party: rows it explained}`` (its acknowledgement, nothing else)."""
    if not parties:
        return {}
    if str(align) != Alignment.HASH:
        raise InputError("a passive party's own features are explained over hashed ids: use align 'hash' with "
                         "passive_features (PSI alignment gives the party no ids to name its rows by)")
    hashes = alignment.hash_ids(ids, bytes.fromhex(model.salt))
    done = {}
    for p in parties:
        req = feature_split_input(model, one, p)
        done[p] = 0
        if not len(req.leaf_target):
            continue             # no split of the party: its value is 0, nothing to split
        step = max(1, MAX_WEIGHT_BYTES // (8 * len(req.leaf_target)))
        for s in range(0, len(ids), step):
            session_id = secrets.token_hex(8)
            transport.call(p, m.PredictStart(model.model_id, session_id, hashes[s:s + step],
                                             model.party_hashes.get(p, "")))
            try:
                reply = transport.call(p, m.FeatureSplitRequest(
                    session_id, int(model.n_targets), req.leaf_target, req.path_start, req.path_record,
                    req.path_left, req.path_z, np.ascontiguousarray(req.weights[s:s + step])))
            finally:
                end_prediction(transport, [p], session_id)
            done[p] += int(reply.n_rows)
    return done


__all__ = ["chosen_parties", "send_feature_splits"]
