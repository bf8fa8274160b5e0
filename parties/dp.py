"""DP-only mode on both sides of the wire (the mechanism itself is in :mod:`vfl.core.dp`).

Protocol after alignment and ``TrainSetup(mode="dp", dp_binning=...)`` (whose reply gives the
number of bucket slots per passive feature, from ``max_bin`` and the party's public bins only, and
what its DP bucket edges spent: :class:`vfl.core.dp.ReleaseDomain`, issue 23):

1. ``DPReleaseRequest(model_id, epsilon_per_feature)`` -> ``DPRelease``: the
   passive party randomizes every aligned row's bucket index of every feature
   once (:func:`vfl.core.dp.release_buckets`) and sends the noisy indices. It
   answers one release per training; a second request is refused, since it
   would spend the privacy budget again.
2. The active party trains alone over the release (:class:`vfl.core.dp.BucketSource`).
   For each split it chooses on a passive feature it sends
   ``DPSplitRegister(feature_idx, bin_idx, default_left)`` (batched per tree
   level) and gets a record id back; the passive party stores the true
   threshold under it, as in HE mode, so prediction (``RouteRequest``) is the
   same federated protocol: the owner maps a new row's raw value to its true
   bucket.

While a passive party trains in mode ``dp`` it refuses gradients, histogram
and split requests: answering them would reveal its true buckets and void the
privacy guarantee. After it, it refuses to route its training rows
(:func:`check_prediction_ids`). Its lifetime ledger (:mod:`parties.dp_ledger`) is charged before
every mechanism runs (:func:`charge`).
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from datasets.errors import InputError, PeerError, ProtocolError
from parties.dp_ledger import PrivacyLedger, dataset_fingerprint
from parties.passive_state import PassiveState, unsafe_seed
from protocols import messages as m
from vfl.core.binning import Binner
from vfl.core.boosting import Booster
from vfl.core.dp import (
    BucketSource,
    bucketize,
    check_epsilon,
    epsilon_budget,
    json_epsilon,
    release_buckets,
    stay_probability,
)
from vfl.core.dp_debias import DebiasedBucketSource, DPBooster, auto_buckets, auto_select, coarse_buckets, root_gains
from vfl.core.dp_noise import NOT_PRIVATE, noise_source
from vfl.core.params import Mode

#: what a passive party training in mode dp refuses to answer
DP_REFUSED = frozenset({m.Gradients, m.GradientsStart, m.GradientShard, m.HistogramRequest, m.SplitRequest,
                        m.PublicKey})


# -- the passive party's side (a handler group over parties.passive_state.PassiveState) ----------
#
# Local settings of the passive party (never set by the active party), on its state:
#
# * ``dp_unsafe_noise_seed``: ``None`` (default): cryptographic noise (os.urandom), what any
#   release must use. A seed makes the noise reproducible and the release NOT PRIVATE (tests
#   only; the ledger entry and the model file then say "NOT PRIVATE").
# * ``dp_max_epsilon_per_feature``: this party's own policy; a release request above it is
#   refused. ``None``: no cap.

def release_info(s: PassiveState) -> dict | None:
    """The release of the current model, if it was trained in mode dp (with ``--dp-select``,
    the pilot and the main release: their entries under ``releases``, and the per-row total)."""
    mine = [dict(r) for r in s.dp_ledger if r["model_id"] == s.model_id]
    if len(mine) <= 1:
        return mine[0] if mine else None
    per_row = [check_epsilon(r["epsilon_per_party"]) for r in mine]
    return {"model_id": s.model_id, "releases": mine,
            "n_samples": int(sum(r["n_samples"] for r in mine)),
            "epsilon_per_party": json_epsilon(max(per_row))}     # disjoint rows: parallel composition


def _entries(s: PassiveState) -> list[dict]:
    return [r for r in s.dp_ledger if r["model_id"] == s.model_id]


def guard(s: PassiveState, request) -> None:
    """Refuse what would reveal the true buckets of a party training in mode dp."""
    if s.train.mode == Mode.DP and type(request) in DP_REFUSED:
        raise ProtocolError(f"party {s.name!r} trains in mode 'dp' and answers no {type(request).__name__}: "
                            f"only its one noisy release leaves it")


# -- the lifetime ledger and the training rows (issue 23) ---------------------------------------------
def ledger(s: PassiveState) -> PrivacyLedger | None:
    """This party's lifetime privacy ledger (None: none configured)."""
    if s.dp_ledger_path is None:
        if s.dp_lifetime_epsilon is not None:
            raise InputError(f"party {s.name!r}: dp_lifetime_epsilon needs a ledger file (dp_ledger_path, "
                             "--dp-ledger) to count what every training spent")
        return None
    cap = getattr(s.limits, "dp_lifetime_epsilon", None) if s.limits is not None else None
    return PrivacyLedger(s.dp_ledger_path, s.dp_lifetime_epsilon, s.name, dp_cap=cap)


def charge(s: PassiveState, epsilon: float, kind: str, planned: float | None = None, **detail) -> None:
    """Charge ``epsilon`` (per row, of this party's dataset) to the ledger before a mechanism runs:
    refused (ProtocolError naming the budget) when it would exceed the lifetime epsilon, or when
    ``planned`` (the whole training's cost, of which this is the first part) would."""
    book = ledger(s)
    if book is None:
        return
    fp = dataset_fingerprint(s.ids if s.ids is not None else [], s.X, s.feature_names)
    book.charge(fp, epsilon, kind, s.model_id, planned, **detail)


def id_digests(ids) -> np.ndarray:
    return np.array([hashlib.sha256(str(i).encode()).hexdigest()[:24] for i in np.asarray(ids).tolist()])


def check_prediction_ids(s: PassiveState, ids) -> None:
    """Prediction refuses the rows of a DP-only training (mode dp): routing a training row by its true
    values would reveal its buckets without noise (issue 23). Refused, not charged."""
    if s.dp_training_ids is None or len(ids) == 0:
        return
    hit = np.isin(id_digests(ids), s.dp_training_ids)
    if hit.any():
        raise ProtocolError(f"party {s.name!r} refuses to route {int(hit.sum())} row(s) that were released in its "
                            "DP-only training (mode dp): their true values would reveal their buckets without "
                            "noise; predict on rows outside the training")


def _need_dp(s: PassiveState, req):
    if s.train.mode != Mode.DP:
        raise ProtocolError(f"party {s.name!r} is not training in mode 'dp'")
    if req.model_id != s.model_id:
        raise ProtocolError(f"party {s.name!r}: request for unknown model {req.model_id!r}")
    return s.need("setup", s.train.binner if s.train.dp_domain is None else s.train.dp_domain)


def _domain_buckets(s: PassiveState, n_buckets, features: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
    """Mode dp with noise: the training rows' buckets of ``features`` in the release domain
    (:class:`vfl.core.dp.ReleaseDomain`: public bins or charged DP histograms, never the raw data);
    ``n_buckets[i]`` value buckets (None: the domain's most), the missing slot last (randomized over
    unless the public schema says the feature is never missing). Returns
    ``(bucket_idx, n_slots, edges)``."""
    dom = s.train.dp_domain
    want = np.array([dom.max_buckets(int(f)) for f in features]) if n_buckets is None else np.asarray(n_buckets)
    if want.shape != features.shape or not np.issubdtype(want.dtype, np.integer) or np.any(want < 2):
        raise ProtocolError(f"party {s.name!r}: DPReleaseRequest.n_buckets must give an integer >= 2 "
                            f"per released feature ({len(features)}), got {want.tolist()}")
    cols, slots, edges = [], [], {}
    for f, q in zip(features.tolist(), want.tolist()):
        e = dom.edges(int(f), int(q))
        edges[int(f)] = e
        col = bucketize(s.train.dp_X[:, f], e)
        if not dom.missing_slot(int(f)):        # the schema says never missing: a missing value -> bucket 0
            col[col == len(e) + 1] = 0
        cols.append(col)
        slots.append(len(e) + 2)
    return np.column_stack(cols), np.array(slots, dtype=np.int64), edges


def _coarsen(s: PassiveState, binner, n_buckets, features: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
    """The training rows' release buckets of ``features``: each feature's training bins merged
    into at most ``n_buckets[i]`` value buckets (:func:`vfl.core.dp_debias.coarse_buckets`, counted
    over all training rows), the missing slot last. Returns ``(bucket_idx, n_slots, last_bin)``:
    ``last_bin[f][b]`` is the last training bin of feature ``f``'s bucket ``b``, the boundary
    registered for a split after it (kept by this party)."""
    all_bins, all_n = s.train.bin_idx, binner.n_bins
    bin_idx, n_bins = all_bins[:, features], all_n[features]
    if n_buckets is None:
        return bin_idx, n_bins, {int(f): list(range(int(all_n[f]) - 1)) for f in features}
    want = np.asarray(n_buckets)
    if want.shape != features.shape or not np.issubdtype(want.dtype, np.integer) or np.any(want < 2):
        raise ProtocolError(f"party {s.name!r}: DPReleaseRequest.n_buckets must give an integer >= 2 "
                            f"per released feature ({len(features)}), got {want.tolist()}")
    out = np.empty_like(bin_idx)
    slots, last = np.empty_like(n_bins), {}
    for i, (f, nb, q) in enumerate(zip(features.tolist(), n_bins.tolist(), want.tolist())):
        col = bin_idx[:, i].astype(np.int64)
        counts = np.bincount(col, minlength=nb)[:nb - 1]
        group = coarse_buckets(counts, int(q))
        n_groups = int(group.max()) + 1 if group.size else 0
        out[:, i] = np.where(col == nb - 1, n_groups, group[np.minimum(col, nb - 2)])
        slots[i] = n_groups + 1
        last[int(f)] = [int(np.flatnonzero(group == g).max()) for g in range(n_groups)]
    return out, slots, last


def _indices(name: str, value, size: int, what: str, dtype=np.int64) -> np.ndarray:
    if value is None:
        return np.arange(size, dtype=dtype)
    v = np.asarray(value)
    if v.ndim != 1 or v.size == 0 or not np.issubdtype(v.dtype, np.integer) or v.min() < 0 \
            or v.max() >= size or np.unique(v).size != v.size:
        raise ProtocolError(f"party {name!r}: DPReleaseRequest.{what} must be distinct indices in [0, {size})")
    return v.astype(dtype)


def release(s: PassiveState, req: m.DPReleaseRequest) -> m.DPRelease:
    binner = _need_dp(s, req)
    eps = check_epsilon(req.epsilon_per_feature, "epsilon_per_feature")
    cap = s.dp_max_epsilon_per_feature
    if cap is not None and not eps <= float(cap):       # a cap of 0 refuses every release
        raise InputError(f"party {s.name!r} releases at most epsilon_per_feature={cap}, "
                         f"asked for {eps}")
    dom = s.train.dp_domain
    if dom is None and eps != float("inf"):
        raise ProtocolError(f"party {s.name!r} refuses DPReleaseRequest: rule 'dp domain': a release at epsilon "
                            f"{eps:g} needs a data-independent domain (TrainSetup.dp_binning: DP edges or public "
                            "bins); this training's bins are the data's quantiles, and which features have missing "
                            "values would show in rr_domain")
    n_rows, n_feat = s.train.bin_idx.shape if dom is None else s.train.dp_X.shape
    rows = _indices(s.name, req.rows, n_rows, "rows")
    features = _indices(s.name, req.features, n_feat, "features")
    released = s.train.dp_released if s.train.dp_released is not None else np.zeros(n_rows, dtype=bool)
    if _entries(s) and (req.rows is None or released[rows].any()):
        raise ProtocolError(f"party {s.name!r} already released its buckets of these rows for this training; "
                            f"a second release would spend the privacy budget again")
    noise = noise_source(unsafe_seed(s, "release"))
    edge = 0.0 if dom is None else float(dom.spent)
    # the ledger: this release's per-row loss beyond what this training's releases charged already
    before = max([check_epsilon(r["epsilon_per_party"]) - r.get("edge_epsilon", 0.0) for r in _entries(s)],
                 default=0.0)
    charge(s, max(eps * len(features) - before, 0.0) if eps != float("inf") else eps, "dp-release",
           n_rows=int(rows.size), n_features=int(len(features)), epsilon_per_feature=json_epsilon(eps))
    if dom is not None and s.dp_training_ids is None:
        s.dp_training_ids = np.sort(id_digests(s.ids[s.train.rows]))
    if dom is None:     # epsilon inf: no noise, nothing to protect (the training bins, as before)
        bucket_idx, n_bins, last_bin = _coarsen(s, binner, req.n_buckets, features)
        has_missing = np.any(bucket_idx == (n_bins - 1)[None, :], axis=0)
        edges = None
    else:               # every feature's domain has its missing slot, whatever the data
        bucket_idx, n_bins, edges = _domain_buckets(s, req.n_buckets, features)
        has_missing = np.array([dom.missing_slot(int(f)) for f in features], dtype=bool)
        last_bin = {}
    # draw the noise in the party's own row order, not the salted alignment order, so a
    # seeded party (simulations) gets the same noise per row whatever the salt
    asked, rows = rows, rows[np.argsort(s.train.rows[rows], kind="stable")]
    noisy_own, domain = release_buckets(bucket_idx[rows], n_bins, eps, noise, has_missing)
    noisy = np.empty((n_rows, len(features)), dtype=noisy_own.dtype)
    noisy[rows] = noisy_own
    keep = np.zeros(n_rows, dtype=bool)
    keep[rows] = True
    released |= keep
    s.train.dp_released = released
    s.train.dp_edges.update(edges or {})      # the latest release of a feature defines its buckets
    s.dp_ledger.append({
        "model_id": s.model_id, "n_samples": int(rows.size), "n_features": int(len(features)),
        "noise": noise.label(), **({} if noise.private else {"privacy": NOT_PRIVATE}),
        # a row's loss in this training: the edges' histograms (every training row is in them) plus
        # this release of it (the releases of one training take disjoint rows: the max is the total)
        "epsilon_per_feature": json_epsilon(eps), "epsilon_per_party": json_epsilon(eps * len(features) + edge),
        "rr_domain": [int(k) for k in domain], "n_buckets": [int(nb) - 1 for nb in n_bins],
        **({} if req.features is None else {"features": [int(f) for f in features]}),
        **({"bucket_last_bin": {str(f): v for f, v in last_bin.items()}} if dom is None else
           {"edge_epsilon": edge})})
    return m.DPRelease(noisy[asked], n_bins.astype(np.int32), domain, eps)


def register_splits(s: PassiveState, req: m.DPSplitRegister) -> m.DPSplitRecords:
    binner = _need_dp(s, req)
    if release_info(s) is None:
        raise ProtocolError(f"party {s.name!r}: split registration before the release")
    f_all, b_all, dl_all = req.feature_idx, req.bin_idx, req.default_left
    if not (f_all.ndim == b_all.ndim == dl_all.ndim == 1 and len(f_all) == len(b_all) == len(dl_all)):
        raise ProtocolError("DPSplitRegister: feature_idx, bin_idx and default_left differ in shape")
    if s.train.dp_domain is not None:
        return _register_on_edges(s, f_all, b_all, dl_all)
    last: dict = {}
    for r in _entries(s):       # the latest release of a feature defines its buckets
        last.update(r.get("bucket_last_bin", {}))
    record_ids = []
    for f, b, dl in zip(f_all.tolist(), b_all.tolist(), dl_all.tolist()):
        buckets = last.get(str(f))
        if buckets is None or not 0 <= b < len(buckets):
            raise ProtocolError(f"DPSplitRegister: party {s.name!r} released no bucket {b} of feature {f}")
        b = buckets[b]          # a released bucket -> the last training bin in it
        record_ids.append(s.table.add(s.name, s.feature_names, binner, f, b, dl, -1, -1, -1))
    return m.DPSplitRecords(np.array(record_ids, dtype=np.int64))


def _register_on_edges(s: PassiveState, f_all, b_all, dl_all) -> m.DPSplitRecords:
    """A split "bucket <= b" of a feature released in the domain: the threshold is the release's edge
    ``b`` (DP or public, so a prediction's route reveals nothing about the training rows)."""
    edges = s.train.dp_edges
    binner = Binner(m.MAX_BINS - 1)
    binner.thresholds_ = [np.asarray(edges.get(j, np.empty(0)), dtype=np.float64)
                          for j in range(len(s.feature_names))]
    record_ids = []
    for f, b, dl in zip(f_all.tolist(), b_all.tolist(), dl_all.tolist()):
        if f not in edges or not 0 <= b <= len(edges[f]):
            raise ProtocolError(f"DPSplitRegister: party {s.name!r} released no bucket {b} of feature {f}")
        record_ids.append(s.table.add(s.name, s.feature_names, binner, f, b, dl, -1, -1, -1))
    return m.DPSplitRecords(np.array(record_ids, dtype=np.int64))


# -- the active party's side -----------------------------------------------------------------------
def _registrar(transport, party: str, model_id: str, features: np.ndarray | None = None):
    """Register splits with passive party ``party``; ``features`` maps the source's columns to the party's
    feature indices (``--dp-select``: only some were released)."""
    def register(feature_idx, bin_idx, default_left):
        f = np.asarray(feature_idx, np.int64)
        f = f if features is None else np.asarray(features, np.int64)[f]
        reply = transport.call(party, m.DPSplitRegister(model_id, f.astype(np.int32),
                                                       np.asarray(bin_idx, np.int32),
                                                       np.asarray(default_left, bool)))
        return reply.record_ids
    return register


def release_buckets_wanted(n_bins: np.ndarray, epsilon_per_feature: float, dp_buckets) -> np.ndarray | None:
    """How many value buckets to ask a party for, per feature (None: its training bins).

    ``dp_buckets="auto"``: :func:`vfl.core.dp_debias.auto_buckets` of the feature's epsilon, never
    more than its training bins (one per distinct value when it has few values); at
    ``epsilon = inf`` the training bins are kept (no noise, nothing to trade). An integer ``q``:
    at most ``q`` buckets (``q >= max_bin`` keeps the training bins)."""
    values = np.asarray(n_bins, dtype=np.int64) - 1
    if dp_buckets == "auto":
        if epsilon_per_feature == float("inf"):
            return None
        want = [max(2, auto_buckets(epsilon_per_feature, int(v))) for v in values.tolist()]
    else:
        want = [max(2, min(int(dp_buckets), int(v))) for v in values.tolist()]
    want = np.array(want, dtype=np.int32)
    return None if np.all(want >= np.maximum(values, 2)) else want


#: ``--dp-select auto`` selects only when its pilot has at least this many rows per feature of the
#: party (fewer cannot rank the features: the pick would be noise and could hurt)
MIN_PILOT_ROWS_PER_FEATURE = 200

#: ``selected_count``'s answer when the pilot decides how many features (``--dp-select auto``)
AUTO = "auto"


def selected_count(dp_select, n_features: int, epsilon_per_party: float,
                   n_samples: int | None = None) -> int | str | None:
    """How many features a party releases under ``dp_select``: ``None`` (no selection: every
    feature; also at ``epsilon = inf``, where there is no noise to concentrate), an integer
    ``k``, or ``AUTO`` (``"auto"``): a pilot ranks the features and
    :func:`vfl.core.dp_debias.auto_select` picks how many from their pilot gains. ``"auto"`` selects
    nothing (``None``) for a party of one feature, or when the pilot (``PILOT_FRACTION`` of
    ``n_samples`` aligned rows) would have fewer than ``MIN_PILOT_ROWS_PER_FEATURE`` rows per
    feature of the party."""
    if dp_select is None or epsilon_per_party == float("inf"):
        return None
    if dp_select == AUTO:
        if n_features < 2 or (n_samples is not None
                              and pilot_size(n_samples) < MIN_PILOT_ROWS_PER_FEATURE * n_features):
            return None
        return AUTO
    return int(dp_select)


def buckets_at(n_bins, epsilon_per_feature: float, dp_buckets) -> np.ndarray:
    """The value buckets each feature (``n_bins``: its training bins + the missing slot) is released
    in at ``epsilon_per_feature`` under ``dp_buckets``: what :func:`release_buckets_wanted` asks
    for, never more than the feature's values."""
    values = np.asarray(n_bins, dtype=np.int64) - 1
    wanted = release_buckets_wanted(n_bins, epsilon_per_feature, dp_buckets)
    return values if wanted is None else np.minimum(np.asarray(wanted, dtype=np.int64), values)


#: share of the aligned rows a ``--dp-select`` pilot releases (all features; disjoint from the rest)
PILOT_FRACTION = 0.2


def pilot_size(n_samples: int) -> int:
    """Rows in the pilot of ``n_samples`` aligned rows: ``PILOT_FRACTION``, at least one, leaving one."""
    return min(max(1, int(round(n_samples * PILOT_FRACTION))), n_samples - 1)


def pilot_rows(n_samples: int, seed: int, own_rows=None) -> np.ndarray:
    """The pilot's rows (alignment positions): a random ``PILOT_FRACTION`` of the rows, at least one
    and leaving at least one. Data-independent (chosen by the active party from ``seed``).

    ``own_rows``: the active party's own row of every aligned position. The draw is then made in
    the active party's own row order and the pilot returned in that order, so the same seed picks
    (and groups) the same rows whatever the alignment's salted order (reproducible simulations);
    without it, in alignment order, sorted."""
    rng = np.random.default_rng([int(seed), 0x5E1EC7])
    if own_rows is None:
        return np.sort(rng.choice(n_samples, size=pilot_size(n_samples), replace=False))
    order = np.argsort(np.asarray(own_rows), kind="stable")
    if order.size != n_samples:
        raise InputError(f"pilot: {order.size} own rows for {n_samples} aligned rows")
    return order[np.sort(rng.choice(n_samples, size=pilot_size(n_samples), replace=False))]


def _check_release(p: str, r, n_rows: int, n_feat: int, slots: np.ndarray, wanted, eps: float) -> None:
    limit = slots if wanted is None else np.minimum(slots, np.asarray(wanted) + 1)
    if r.buckets.shape != (n_rows, n_feat) or r.n_bins.shape != (n_feat,) \
            or np.any(r.n_bins > limit) or np.any(r.n_bins < 2) \
            or (wanted is None and not np.array_equal(r.n_bins, slots)) \
            or r.rr_domain.shape != (n_feat,) or r.epsilon_per_feature != eps:
        raise PeerError(f"party {p!r} sent a release that does not match the request "
                        f"({r.buckets.shape} buckets for {n_rows} samples x {n_feat} features)")


def dp_sources(transport, passives: list[str], infos: dict, params, model_id: str, n_samples: int,
               root_gradients=None, own_rows=None):
    """Ask every passive party for its release; return ``(sources, report)``.

    ``report`` holds the accounting shown to the user: ``epsilon_per_feature``
    and ``epsilon_per_party`` (dicts by passive party; ``"inf"`` for no noise),
    each feature's released bucket count and randomized-response stay probability,
    and with ``--dp-select`` the pilot's accounting (``dp_select``).
    With ``params.dp_debias`` (the default) and a finite epsilon the sources are
    :class:`vfl.core.dp_debias.DebiasedBucketSource` (train them with
    :class:`vfl.core.dp_debias.DPBooster`); otherwise plain :class:`vfl.core.dp.BucketSource`.
    ``root_gradients``: ``(g, h)`` of the first round (``--dp-select`` scores its pilot with them);
    ``own_rows``: the active party's own row of every aligned position (the pilot is drawn in
    that order: :func:`pilot_rows`).
    """
    n_features = {p: int(len(infos[p].n_bins)) for p in passives}
    total = epsilon_budget(n_features, params.epsilon, params.epsilon_per_feature)
    # what each party's bucket edges spent (a DP histogram per feature without public bins, charged
    # at setup; public bins: nothing): the release gets the rest of the party's per-row budget
    edge = {p: edge_spent(p, infos[p].dp_binning, dp_only_binning(params), n_features[p]) for p in passives}
    rest = {p: (total["epsilon_per_party"][p] - edge[p]) for p in passives}
    if any(not r > 0 for r in rest.values()):
        raise InputError(f"mode dp: the bucket edges leave no budget for the release ({rest})")
    budget = {"epsilon_per_party": rest, "epsilon_per_feature": {p: rest[p] / n_features[p] for p in passives}}
    # epsilon_per_feature: every feature costs exactly that per row (its edges and its release), so
    # no selection (which would give each released feature d x epsilon / K; an integer K is refused)
    k = params.dp_select if params.epsilon_per_feature is None else None
    if k is not None and k != "auto":
        small = {p: d for p, d in n_features.items() if d < k}
        if small:
            raise InputError(f"dp_select={k} releases {k} features per passive party, but "
                             + ", ".join(f"party {p!r} has {d}" for p, d in small.items()))
    ks = {p: selected_count(k, n_features[p], budget["epsilon_per_party"][p], n_samples) for p in passives}
    select = {p: ks[p] == AUTO or (ks[p] is not None and ks[p] < n_features[p]) for p in passives}
    if any(select.values()) and root_gradients is None:
        raise InputError("dp_select needs the first round's gradients to score its pilot")
    pilot = pilot_rows(n_samples, params.seed, own_rows) if any(select.values()) else None
    chosen = {}
    if pilot is not None:
        chosen = _select_features(transport, [p for p in passives if select[p]], infos, params, model_id,
                                  budget, pilot, root_gradients, ks)
    ks.update({p: chosen[p]["k"] for p in chosen})      # auto: the pilot decided
    eps_f = {p: budget["epsilon_per_party"][p] / ks[p] if select[p] else budget["epsilon_per_feature"][p]
             for p in passives}
    feats = {p: chosen[p]["features"] if select[p] else None for p in passives}
    slots = {p: infos[p].n_bins if feats[p] is None else infos[p].n_bins[feats[p]] for p in passives}
    wanted = {p: release_buckets_wanted(slots[p], eps_f[p], params.dp_buckets) for p in passives}
    main = None
    if pilot is not None:
        main = np.setdiff1d(np.arange(n_samples), pilot)
    requests = {}
    for p in passives:
        if select[p]:
            requests[p] = m.DPReleaseRequest(model_id, eps_f[p], _wanted_array(wanted[p], slots[p]),
                                             main, feats[p].astype(np.int32))
        else:
            requests[p] = m.DPReleaseRequest(model_id, eps_f[p], wanted[p])
    replies = transport.call_many(requests)
    sources, stay, buckets = [], {}, {}
    for p in passives:
        r, eps = replies[p], eps_f[p]
        n_rows = n_samples if not select[p] else main.size
        _check_release(p, r, n_rows, len(slots[p]), slots[p], wanted[p], eps)
        register = _registrar(transport, p, model_id, feats[p])
        released, rows_used = r.buckets, None
        if select[p]:
            # the pilot rows' features are not in the main release: those rows are routed by the
            # prior (vfl.core.dp_debias.DebiasedBucketSource.rows_used), their index here is a placeholder
            released = np.zeros((n_samples, len(feats[p])), dtype=r.buckets.dtype)
            released[main] = r.buckets
            rows_used = np.zeros(n_samples, dtype=bool)
            rows_used[main] = True
        if debiased(params, eps):
            src = DebiasedBucketSource(p, released, r.n_bins, r.rr_domain, eps, register, rows_used)
        else:
            src = BucketSource(p, released, r.n_bins, register)
        if feats[p] is not None:
            src.feature_names = [f"{p}:{int(f)}" for f in feats[p]]
        sources.append(src)
        stay[p] = [1.0 if d < 2 else stay_probability(eps, int(d)) for d in r.rr_domain.tolist()]
        buckets[p] = [int(nb) - 1 for nb in r.n_bins.tolist()]
    report = {"epsilon_per_feature": {p: json_epsilon(eps_f[p]) for p in passives},
              "epsilon_per_party": {p: json_epsilon(total["epsilon_per_party"][p]) for p in passives},
              "edge_epsilon": {p: edge[p] for p in passives},
              "release_epsilon_per_party": {p: json_epsilon(rest[p]) for p in passives},
              "rr_stay_probability": stay, "dp_buckets": buckets, "dp_debias": bool(params.dp_debias)}
    if chosen:
        report["dp_select"] = {p: {key: ([int(f) for f in v] if key == "features" else v)
                                   for key, v in c.items()} for p, c in chosen.items()}
    return sources, report


def dp_only_binning(params) -> dict | None:
    """``TrainSetup.dp_binning`` of mode dp: each passive party's budget for the DP histograms of its
    bucket edges, ``dp_edge_share`` of its per-row total (None at epsilon inf: no noise, no claim)."""
    share = float(params.dp_edge_share)
    if params.epsilon is not None:
        return None if params.epsilon == float("inf") else {"epsilon": share * params.epsilon,
                                                            "training_epsilon": params.epsilon}
    eps_f = params.epsilon_per_feature
    return None if eps_f == float("inf") else {"epsilon_per_feature": share * eps_f,
                                               "training_epsilon_per_feature": eps_f}


def edge_spent(p: str, reported, asked: dict | None, n_features: int) -> float:
    """What party ``p``'s bucket edges spent (its ``BinningInfo.dp_binning``), checked against what it
    was given."""
    if asked is None:
        return 0.0
    limit = asked["epsilon"] if "epsilon" in asked else asked["epsilon_per_feature"] * n_features
    ok = isinstance(reported, dict) and set(reported) == {"epsilon", "dp_features", "public_features"} and all(
        not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
        for v in reported.values()) and reported["epsilon"] <= limit * (1 + 1e-9)
    if not ok:
        raise PeerError(f"party {p!r} reported its DP bucket edges as {reported!r}: expected "
                        f"{{'epsilon': at most {limit}, 'dp_features': n, 'public_features': n}}")
    return float(reported["epsilon"])


def _wanted_array(wanted, slots) -> np.ndarray:
    """Explicit bucket counts (a release of selected features always names them)."""
    return np.asarray(wanted if wanted is not None else np.asarray(slots) - 1, dtype=np.int32)


def _select_features(transport, passives, infos, params, model_id, budget, pilot, root_gradients, ks) -> dict:
    """``--dp-select``: the pilot rows are split at random into one group per feature of a
    selecting party; each group releases its one feature at the party's whole per-row budget
    ``eps_row`` (buckets chosen for that epsilon). The active party keeps the ``k`` features of
    largest debiased root gain per pilot row (``k = "auto"``: :func:`vfl.core.dp_debias.auto_select`
    picks ``k`` from those gains and the channel each feature would get). Every pilot row is
    released once (one feature at ``eps_row``), every other row once in the main release (``k``
    features at ``eps_row / k``): parallel composition, ``eps_row`` per row."""
    g, h = (np.asarray(a, dtype=np.float64) for a in root_gradients)
    g, h = (a.reshape(len(a), -1) for a in (g, h))
    rng = np.random.default_rng([int(params.seed), 0x91107])
    out = {}
    for p in passives:
        eps_row, k = budget["epsilon_per_party"][p], ks[p]
        d = len(infos[p].n_bins)
        groups = np.array_split(rng.permutation(pilot), d)
        gains = np.zeros(d)
        for j, rows in enumerate(groups):
            if rows.size == 0:
                continue
            slots = infos[p].n_bins[[j]]
            wanted = release_buckets_wanted(slots, eps_row, params.dp_buckets)
            r = transport.call(p, m.DPReleaseRequest(model_id, eps_row, wanted, rows.astype(np.int64),
                                                     np.array([j], dtype=np.int32)))
            _check_release(p, r, rows.size, 1, slots, wanted, eps_row)
            gains[j] = root_gains(r.buckets, r.n_bins, r.rr_domain, eps_row, g[rows], h[rows], params)[0] / rows.size
        rule = None
        if k == AUTO:
            k, signal = auto_select(gains, lambda e: buckets_at(infos[p].n_bins, e, params.dp_buckets), eps_row)
            rule = {"k_rule": AUTO, "k_score": [float(x) for x in signal]}
        features = np.sort(np.argsort(-gains, kind="stable")[:k])
        out[p] = {"k": int(k), **(rule or {}), "features": features, "pilot_rows": int(pilot.size),
                  "pilot_epsilon_per_feature": json_epsilon(eps_row),
                  "pilot_epsilon_per_row": json_epsilon(eps_row),
                  "release_epsilon_per_feature": json_epsilon(eps_row / k),
                  "release_epsilon_per_row": json_epsilon(eps_row / k * k),
                  "pilot_root_gain_per_row": [float(x) for x in gains]}
    return out


def debiased(params, epsilon_per_feature: float) -> bool:
    """Whether the active party debiases a release (``dp_debias`` and some noise)."""
    return bool(params.dp_debias) and epsilon_per_feature != float("inf")


def booster_class(sources):
    """:class:`vfl.core.dp_debias.DPBooster` when any source is debiased, else the plain Booster."""
    return DPBooster if any(isinstance(s, DebiasedBucketSource) for s in sources) else Booster


__all__ = ["booster_class", "dp_sources", "release_buckets_wanted", "selected_count", "DP_REFUSED", "check_epsilon",
           "guard", "release", "register_splits", "release_info"]
