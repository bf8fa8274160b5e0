"""DP-only mode on both sides of the wire (the mechanism itself is in :mod:`vfl.dp`).

Protocol after alignment and ``TrainSetup(mode="dp")`` (whose reply, as in
HE mode, gives the number of bucket slots per passive feature):

1. ``DPReleaseRequest(model_id, epsilon_per_feature)`` -> ``DPRelease``: the
   passive party randomizes every aligned row's bucket index of every feature
   once (:func:`vfl.dp.release_buckets`) and sends the noisy indices. It
   answers one release per training; a second request is refused, since it
   would spend the privacy budget again.
2. The active party trains alone over the release (:class:`vfl.dp.BucketSource`).
   For each split it chooses on a passive feature it sends
   ``DPSplitRegister(feature_idx, bin_idx, default_left)`` (batched per tree
   level) and gets a record id back; the passive party stores the true
   threshold under it, as in HE mode, so prediction (``RouteRequest``) is the
   same federated protocol: the owner maps a new row's raw value to its true
   bucket.

While a passive party trains in mode ``dp`` it refuses gradients, histogram
and split requests: answering them would reveal its true buckets and void the
privacy guarantee.
"""
from __future__ import annotations

import numpy as np

from datasets.errors import InputError, PeerError, ProtocolError
from parties.passive_state import PassiveState
from protocols import messages as m
from vfl.dp import BucketSource, check_epsilon, epsilon_budget, json_epsilon, release_buckets, stay_probability
from vfl.params import Mode

#: what a passive party training in mode dp refuses to answer
DP_REFUSED = frozenset({m.Gradients, m.GradientsStart, m.GradientShard, m.HistogramRequest, m.SplitRequest,
                        m.PublicKey})


# -- the passive party's side (a handler group over parties.passive_state.PassiveState) ----------
#
# Local settings of the passive party (never set by the active party), on its state:
#
# * ``dp_seed``: seed of the randomized response. ``None`` (default) draws fresh entropy from
#   the operating system for every release -- what a deployment must use. Simulations set it
#   for reproducible runs.
# * ``dp_max_epsilon_per_feature``: this party's own policy; a release request above it is
#   refused. ``None``: no cap.

def release_info(s: PassiveState) -> dict | None:
    """The release of the current model, if it was trained in mode dp."""
    for r in s.dp_ledger:
        if r["model_id"] == s.model_id:
            return dict(r)
    return None


def guard(s: PassiveState, request) -> None:
    """Refuse what would reveal the true buckets of a party training in mode dp."""
    if s.train.mode == Mode.DP and type(request) in DP_REFUSED:
        raise ProtocolError(f"party {s.name!r} trains in mode 'dp' and answers no {type(request).__name__}: "
                            f"only its one noisy release leaves it")


def _need_dp(s: PassiveState, req):
    if s.train.mode != Mode.DP:
        raise ProtocolError(f"party {s.name!r} is not training in mode 'dp'")
    if req.model_id != s.model_id:
        raise ProtocolError(f"party {s.name!r}: request for unknown model {req.model_id!r}")
    return s.need("setup", s.train.binner)


def release(s: PassiveState, req: m.DPReleaseRequest) -> m.DPRelease:
    binner = _need_dp(s, req)
    eps = check_epsilon(req.epsilon_per_feature, "epsilon_per_feature")
    cap = s.dp_max_epsilon_per_feature
    if cap is not None and eps > check_epsilon(cap, "dp_max_epsilon_per_feature"):
        raise InputError(f"party {s.name!r} releases at most epsilon_per_feature={cap}, "
                         f"asked for {eps}")
    if release_info(s) is not None:
        raise ProtocolError(f"party {s.name!r} already released its buckets for this training; "
                            f"a second release would spend the privacy budget again")
    rng = np.random.default_rng(s.dp_seed)
    n_bins = binner.n_bins
    # draw the noise in the party's own row order, not the salted alignment order, so a
    # seeded party (simulations) gets the same noise per row whatever the salt
    order = np.argsort(s.train.rows, kind="stable")
    noisy_own, domain = release_buckets(s.train.bin_idx[order], n_bins, eps, rng)
    noisy = np.empty_like(noisy_own)
    noisy[order] = noisy_own
    s.dp_ledger.append({
        "model_id": s.model_id, "n_samples": int(noisy.shape[0]), "n_features": int(noisy.shape[1]),
        "epsilon_per_feature": json_epsilon(eps), "epsilon_per_party": json_epsilon(eps * noisy.shape[1]),
        "rr_domain": [int(k) for k in domain]})
    return m.DPRelease(noisy, n_bins.astype(np.int32), domain, eps)


def register_splits(s: PassiveState, req: m.DPSplitRegister) -> m.DPSplitRecords:
    binner = _need_dp(s, req)
    if release_info(s) is None:
        raise ProtocolError(f"party {s.name!r}: split registration before the release")
    f_all, b_all, dl_all = req.feature_idx, req.bin_idx, req.default_left
    if not (f_all.ndim == b_all.ndim == dl_all.ndim == 1 and len(f_all) == len(b_all) == len(dl_all)):
        raise ProtocolError("DPSplitRegister: feature_idx, bin_idx and default_left differ in shape")
    record_ids = [s.table.add(s.name, s.feature_names, binner, f, b, dl, -1, -1, -1)
                  for f, b, dl in zip(f_all.tolist(), b_all.tolist(), dl_all.tolist())]
    return m.DPSplitRecords(np.array(record_ids, dtype=np.int64))


# -- the active party's side -----------------------------------------------------------------------
def _registrar(transport, peer: str, model_id: str):
    def register(feature_idx, bin_idx, default_left):
        reply = transport.call(peer, m.DPSplitRegister(model_id, np.asarray(feature_idx, np.int32),
                                                       np.asarray(bin_idx, np.int32),
                                                       np.asarray(default_left, bool)))
        return reply.record_ids
    return register


def dp_sources(transport, peers: list[str], infos: dict, params, model_id: str, n_samples: int):
    """Ask every passive party for its release; return ``(sources, report)``.

    ``report`` holds the accounting shown to the user: ``epsilon_per_feature``
    and ``epsilon_per_party`` (dicts by passive party; ``"inf"`` for no noise)
    and each feature's randomized-response stay probability.
    """
    n_features = {p: int(len(infos[p].n_bins)) for p in peers}
    budget = epsilon_budget(n_features, params.epsilon, params.epsilon_per_feature)
    replies = transport.call_many({p: m.DPReleaseRequest(model_id, budget["epsilon_per_feature"][p])
                                   for p in peers})
    sources, stay = [], {}
    for p in peers:
        r = replies[p]
        if r.buckets.shape != (n_samples, n_features[p]) or not np.array_equal(r.n_bins, infos[p].n_bins) \
                or r.rr_domain.shape != (n_features[p],) \
                or r.epsilon_per_feature != budget["epsilon_per_feature"][p]:
            raise PeerError(f"party {p!r} sent a release that does not match the request "
                            f"({r.buckets.shape} buckets for {n_samples} samples x {n_features[p]} features)")
        sources.append(BucketSource(p, r.buckets, r.n_bins, _registrar(transport, p, model_id)))
        eps = budget["epsilon_per_feature"][p]
        stay[p] = [1.0 if k < 2 else stay_probability(eps, int(k)) for k in r.rr_domain.tolist()]
    report = {key: {p: json_epsilon(v) for p, v in val.items()} for key, val in budget.items()}
    report["rr_stay_probability"] = stay
    return sources, report


__all__ = ["dp_sources", "DP_REFUSED", "check_epsilon", "guard", "release", "register_splits", "release_info"]
