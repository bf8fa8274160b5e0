"""PSI alignment, the active party's side of the flow, over any :class:`Transport`.

Messages: ``PsiRequest`` -> ``PsiResponse``, then ``PsiResult`` -> ``AlignAck``
(see :mod:`protocols.psi` for the math and what each party learns).

* Training (:func:`align_train`): the rows every party holds, in the canonical
  order: sorted by the salted mmh3-128 hash of the id, exactly the order of the
  hash alignment with the same salt, so ``psi`` and ``hash`` give the same
  training matrix and the same model. The active party computes it from its own
  ids (no hash is sent); each passive party receives only the positions of its
  intersection rows, in that order.
* Prediction (:func:`align_predict`): a fresh PSI per prediction batch (fresh
  salt and scalars, so nothing links it to training); every requested row must be
  held by every passive party, and the order is the active party's row order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datasets.errors import InputError, PeerError
from protocols import alignment, psi
from protocols import messages as m
from protocols.transport import Transport


@dataclass
class PsiMatch:
    """What the active party learns: per passive party, for each own row, the row's position
    in that party's blinded list (``PsiResponse.blinded``) or -1 if the party lacks it."""
    held: dict
    peer_sizes: dict


def psi_match(transport: Transport, passives: list[str], local_name: str, ids, salt: bytes,
              session_id: str, purpose: str, model_id: str = "", model_hashes: dict | None = None) -> PsiMatch:
    """Steps 1-3 of the PSI with every passive party (``PsiRequest`` / ``PsiResponse``)."""
    alignment.check_unique(alignment.normalize_ids(ids), local_name)
    if not passives:
        return PsiMatch({}, {})
    psi.require_backend()
    key = psi.BlindingKey()
    blinded = key.blind(psi.hash_to_points(ids, salt), "own ids")
    perm = psi.secret_permutation(len(blinded))        # sent[j] is own row perm[j]
    sent = blinded[perm]
    replies = transport.call_many({p: m.PsiRequest(session_id, salt, m.PsiPurpose(purpose), model_id, sent,
                                                              (model_hashes or {}).get(p, ""))
                                   for p in passives})
    held, sizes = {}, {}
    for p in passives:
        r = replies[p]
        dbl = psi.check_points(r.double_blinded, f"the double-blinded ids from party {p!r}")
        if len(dbl) != len(sent):
            raise PeerError(f"party {p!r} returned {len(dbl)} double-blinded ids for {len(sent)} sent")
        own_dbl = np.empty_like(dbl)
        own_dbl[perm] = dbl
        psi.check_distinct(own_dbl, f"the double-blinded ids from party {p!r}")
        theirs = key.blind(psi.check_points(r.blinded, f"the blinded ids of party {p!r}"),
                           f"the blinded ids of party {p!r}")
        held[p] = psi.match(own_dbl, theirs, f"the blinded ids of party {p!r}")
        sizes[p] = int(len(theirs))
    return PsiMatch(held, sizes)


def align_train(transport: Transport, passives: list[str], local_name: str, ids, salt: bytes,
                session_id: str) -> tuple[np.ndarray, dict]:
    """PSI alignment for training: ``(own rows in canonical order, alignment report)``."""
    match = psi_match(transport, passives, local_name, ids, salt, session_id, "train")
    n = len(ids)
    in_all = np.ones(n, dtype=bool)
    for h in match.held.values():
        in_all &= h >= 0
    rows = np.flatnonzero(in_all)
    if rows.size == 0:
        sizes = {local_name: n, **match.peer_sizes}
        raise InputError("the parties have no sample id in common: nothing to train on "
                         f"(rows per party: {sizes})")
    keys = alignment.hashes_to_keys(alignment.hash_ids(np.asarray(ids)[rows], salt))
    rows = rows[sorted(range(len(rows)), key=keys.__getitem__)]
    acks = transport.call_many({p: m.PsiResult(session_id, match.held[p][rows]) for p in passives})
    report = {local_name: {"n_rows": int(n), "n_kept": int(len(rows))}}
    for p, a in acks.items():
        if a.n_kept != len(rows):
            raise PeerError(f"party {p!r} did not confirm the {len(rows)} aligned rows")
        report[p] = {"n_rows": int(a.n_rows), "n_kept": int(a.n_kept)}
    return rows, report


def align_predict(transport: Transport, passives: list[str], local_name: str, ids, session_id: str,
                  model_id: str, model_hashes: dict | None = None) -> dict:
    """PSI for a prediction batch: every passive party must hold every row; its session rows
    are then in the active party's row order. Returns the acks' report."""
    match = psi_match(transport, passives, local_name, ids, alignment.new_salt(), session_id, "predict",
                      model_id, model_hashes)
    for p, h in match.held.items():
        missing = int(np.sum(h < 0))
        if missing:
            raise InputError(f"party {p!r} has no row for {missing} of the {len(h)} requested sample ids")
    acks = transport.call_many({p: m.PsiResult(session_id, h) for p, h in match.held.items()})
    for p, a in acks.items():
        if a.n_kept != len(ids):
            raise PeerError(f"party {p!r} did not confirm the {len(ids)} prediction rows")
    return {p: {"n_rows": int(a.n_rows), "n_kept": int(a.n_kept)} for p, a in acks.items()}
