"""What a passive party's prediction answers may reveal (issue 31, Build 5; finding 5).

* ``skeleton``: a one-round request (:class:`vfl.core.leafmask.Skeleton`) names each of this
  party's records at most once, and a record of a known tree only at its own position: all
  records of one skeleton tree belong to one (round, tree) of the model, each (round, tree) to
  at most one skeleton tree, and each record sits at the node id its split was recorded at. A
  reply then reveals each record's decision about a row at most once, as the model's own trees
  do (one three-node tree per record, each record's decision in its own tree, is refused).
* ``path budget``: node-by-node prediction reveals about a row at most ``max_depth`` distinct
  records of one tree (a path's nodes), counted per (client, row, tree) across the client's
  sessions, not per session: a new session asks about the records asked before for free, and
  no more. (In memory, for the model's lifetime in the serving process; the lifetime reveal
  budget :mod:`parties.reveal_budget` counts every decision per (client, model, row) on disk.)
* ``training rows``: prediction over the rows a model was trained on is refused unless the
  party's limits allow it (``predict_training_rows``): routing a training row by its true values
  reveals its decisions at every record, which the training already exchanged with the same
  active party.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from datasets.errors import InputError, ProtocolError
from datasets.files import write_json_atomic
from parties import reveal_budget
from parties.dp import id_digests


def check_skeleton(s, sk) -> None:
    """Refuse a one-round skeleton that does not place this party's records where they are."""
    rec = np.asarray(sk.record_ids, dtype=np.int64)
    own = rec[rec >= 0]
    what = f"party {s.name!r} refuses LeafMaskRequest: rule 'skeleton'"
    if len(np.unique(own)) != len(own):
        raise ProtocolError(f"{what}: a record is named more than once (each split of the model is one node)")
    off = sk.offsets()
    tree_of: dict = {}
    for t in range(sk.n_trees):
        a, b = int(off[t]), int(off[t + 1])
        local = np.flatnonzero(rec[a:b] >= 0)
        keys = set()
        for node in local.tolist():
            r = s.table.records[int(rec[a + node])]
            if r["round"] < 0 or r["tree"] < 0:      # mode dp's records: no recorded position
                continue
            if int(r["node_id"]) != node:
                raise ProtocolError(f"{what}: tree {t}: record {int(rec[a + node])} is at node {node}, this party "
                                    f"recorded it at node {r['node_id']} of its tree")
            keys.add((int(r["round"]), int(r["tree"])))
        if len(keys) > 1:
            raise ProtocolError(f"{what}: tree {t} holds records of {len(keys)} trees of the model")
        for k in keys:
            if k in tree_of:
                raise ProtocolError(f"{what}: trees {tree_of[k]} and {t} both hold records of round {k[0]}, "
                                    f"tree {k[1]} of the model")
            tree_of[k] = t


def charge_leaf_mask(s, session_id: str, n_rows: int, n_own: int) -> None:
    """One-round: every row learns the decisions of the ``n_own`` records of the skeleton."""
    if n_own and n_rows:
        reveal_budget.on_prediction(s, session_id, np.arange(n_rows), np.full(n_rows, n_own), "LeafMaskRequest")


def charge_routes(s, session_id: str, rec: np.ndarray, rows: np.ndarray) -> None:
    """Node-by-node: the path budget per (client, row, tree) across sessions, then the lifetime
    decisions per (client, model, row)."""
    if not rec.size:
        return
    ids = s.session_ids.get(session_id)
    client = s.session_owner.get(session_id, session_id if ids is None else "local")
    if s.max_depth is not None:
        keys = s.table.tree_keys()
        known = keys[rec] >= 0          # records of a known tree (mode dp's have none: no budget)
        if known.any():
            # a row's code: its id's index among the rows this client asked about (else the session's row)
            codes = _row_codes(s, client, session_id, rows[known], ids)
            pair = (codes << 32) | rec[known].astype(np.int64)     # distinct (row, record) asked
            seen = s.route_counts.get(("client", client), np.zeros(0, np.int64))
            merged = np.union1d(seen, pair)
            touched = np.isin(merged >> 32, codes)
            sub = merged[touched]
            per_tree = (sub >> 32) * (int(keys.max()) + 1) + keys[sub & 0xFFFFFFFF]
            if np.unique(per_tree, return_counts=True)[1].max() > s.max_depth:
                raise ProtocolError(f"party {s.name!r} refuses RouteRequest: rule 'path budget': a row's path through "
                                    f"a tree meets at most {s.max_depth} nodes (the model's max_depth), more of this "
                                    "party's records of one tree were asked for a row by this client (counted over "
                                    "all its sessions)")
            s.route_counts[("client", client)] = merged
    counts = np.bincount(rows, minlength=int(rows.max()) + 1)
    at = np.flatnonzero(counts)
    reveal_budget.on_prediction(s, session_id, at, counts[at], "RouteRequest")


def _row_codes(s, client, session_id: str, rows: np.ndarray, ids) -> np.ndarray:
    book = s.route_counts.setdefault(("codes", client), {})
    if ids is None:         # no row ids (an in-memory session): the session's rows, for this session only
        names = [f"{session_id}\0{r}" for r in rows.tolist()]
    else:
        names = np.asarray(ids)[rows].astype(str).tolist()
    return np.array([book.setdefault(n, len(book)) for n in names], dtype=np.int64)


def check_training_rows(s, ids) -> None:
    """Refuse prediction over the rows the model was trained on (rule 'training rows')."""
    if s.limits is None or s.limits.predict_training_rows or s.training_rows is None or not len(ids):
        return
    hit = np.isin(id_digests(ids), s.training_rows)
    if hit.any():
        raise ProtocolError(f"party {s.name!r} refuses to predict {int(hit.sum())} row(s) model {s.model_id!r} was "
                            "trained on: rule 'training rows': their decisions at every record were exchanged in "
                            "training already (predict_training_rows = true in its federation entry allows it)")


# -- the training rows of a model, beside its lookup table ---------------------------------------------
def rows_path(model_dir, model_id: str) -> Path:
    return Path(model_dir) / reveal_budget.LEDGER_DIR / f"{model_id}.training-rows.json"


def save_training_rows(path, ids) -> np.ndarray:
    digests = np.sort(id_digests(ids))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"format": "vfl-training-rows", "version": 1, "rows": digests.tolist()}, indent=None)
    return digests


def load_training_rows(path) -> np.ndarray | None:
    p = Path(path)
    if not p.exists():
        return None
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"training rows file {str(p)!r} cannot be read: {exc}") from None
    if not isinstance(d, dict) or d.get("format") != "vfl-training-rows" or not isinstance(d.get("rows"), list):
        raise InputError(f"training rows file {str(p)!r} is not a vfl-training-rows file")
    return np.array(d["rows"], dtype=str)
