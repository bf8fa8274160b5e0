"""The passive party's opt-in handler for explanations of its own features.

* ``FeatureSplitRequest`` -> ``FeatureSplitDone``: in a prediction session over the rows being
  explained, the active party sends per leaf under one of this party's nodes the leaf's group
  weight (:meth:`vfl.core.explain.ShapPlan.group_weights`); this party decides its own nodes on
  its own rows and splits its grouped attribution among its own features
  (:func:`vfl.core.explain.own_feature_values`). The values stay here: they are kept in memory
  (:attr:`PassiveState.feature_explanations`) and, with an explanations directory, written there
  as a CSV file per session; the reply says only how many rows were explained.

Refused unless this party's own policy says so (``explain_features``: its federation entry's
``explain_features = true``, or ``PassiveParty.explain_features = True`` in one process): the
weights tell the party things about the model and the other parties' decisions that prediction
does not (docs/threat-model.md).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from datasets.errors import ProtocolError
from parties.passive_state import PassiveState
from protocols import messages as m
from vfl.core.explain import own_feature_values
from vfl.core.files import write_text_atomic

#: the folder under a passive server's --model-dir where it writes them
EXPLAIN_DIR = "explanations"
#: explanations of this many sessions are kept in memory (the oldest are dropped first)
MAX_KEPT = 64


def feature_table(ids, values: np.ndarray, features: list[str], id_col: str = "id") -> pd.DataFrame:
    """Per-feature attributions ``values`` ``(n, K, F)`` as a table: ``id``, (``target`` when
    K > 1, one line per row and target), one column per own feature."""
    n, K, _ = values.shape
    parts = []
    for k in range(K):
        d = {id_col: np.asarray(ids)}
        if K > 1:
            d["target"] = np.full(n, k)
        for j, f in enumerate(features):
            d[f] = values[:, k, j]
        parts.append(pd.DataFrame(d))
    if K == 1:
        return parts[0]
    order = np.argsort(np.tile(np.arange(n), K), kind="stable")
    return pd.concat(parts, ignore_index=True).iloc[order].reset_index(drop=True)


def _check_leaf_count(s: PassiveState, n_leaves: int) -> None:
    """A tree of the model has at most ``2 ** max_depth`` leaves: a request may name at most that
    many per tree this party has a split in (rule 'leaf budget'; the work is linear in it). A model
    file without max_depth: no budget."""
    if s.max_depth is None:
        return
    keys = s.table.tree_keys()
    n_trees = len(np.unique(keys[keys >= 0]))
    cap = n_trees * 2 ** int(s.max_depth)
    if n_leaves > cap:
        raise ProtocolError(f"party {s.name!r} refuses FeatureSplitRequest: rule 'leaf budget': {n_leaves} leaves, "
                            f"more than its {n_trees} tree(s) of depth <= {s.max_depth} hold ({cap})")


def feature_split(s: PassiveState, req: m.FeatureSplitRequest) -> m.FeatureSplitDone:
    if not s.explain_features:
        raise ProtocolError(f"party {s.name!r} refuses FeatureSplitRequest: rule 'explain_features': its federation "
                            "entry does not say explain_features = true (per-feature explanations are opt-in: "
                            "docs/threat-model.md)")
    X = s.session_rows(req.session_id)
    ids = s.session_ids.get(req.session_id)
    if ids is None:
        raise ProtocolError(f"party {s.name!r}: FeatureSplitRequest needs a prediction session by hashed ids "
                            f"(session {req.session_id!r} is not one)")
    if req.weights.shape[0] != len(X):
        raise ProtocolError(f"FeatureSplitRequest: weights of {req.weights.shape[0]} rows for a session of "
                            f"{len(X)} rows")
    rec = np.asarray(req.path_record, dtype=np.int64)
    s.table.check_ids(rec, s.name)
    _check_leaf_count(s, len(req.leaf_target))
    feats = s.table.features(rec)
    agree = s.table.go_left(np.broadcast_to(rec, (len(X), len(rec))), X[:, feats]) == req.path_left[None, :]
    values = own_feature_values(req.weights, req.leaf_target, req.path_start, feats, agree, req.path_z,
                                req.n_targets, len(s.feature_names))
    s.drop_session(req.session_id)                  # the session is complete
    table = feature_table(ids, values, list(s.feature_names), s.id_col)
    s.feature_explanations.append(table)
    del s.feature_explanations[:-MAX_KEPT]
    if s.explain_dir is not None:
        Path(s.explain_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        write_text_atomic(Path(s.explain_dir) / f"{s.model_id}-{req.session_id}.csv", table.to_csv(index=False))
    return m.FeatureSplitDone(int(len(X)))


__all__ = ["EXPLAIN_DIR", "feature_split", "feature_table"]
