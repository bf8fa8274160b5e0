"""The passive party's split candidates (issue 31): what it answers in a training without a DP
released model, instead of per-bin sums.

Per node of a ``HistogramRequest`` the party sends the *left child's sums* of every candidate split of
its own -- every feature, every threshold bin, and for a feature with missing values both sides for
them -- in a fresh random order (:class:`numpy.random.Generator` seeded from ``os.urandom`` for each
request): a :class:`protocols.messages.CandidateResponse`. The active party computes each candidate's
gain from those sums and the node's totals (which it knows), and names the winner by its opaque
position (:class:`protocols.messages.CandidatePick`); this party alone maps the position back to
(feature, bin, missing side) and records the split in its lookup table as before. So the active party
no longer sees per-bin sums of this party's features, nor which feature a candidate belongs to, and a
split request can no longer target a feature or a bin of its choosing (the position of a threshold is
fresh in every node).

Equal gains: the active party names *every* position with the best gain, and this party takes the
canonical one among them (lowest feature, then bin, missing-right first: the order
:func:`vfl.core.split.find_best_split` breaks ties in), so neither the shuffle nor the encryption changes
the model: ``he`` grows the trees of ``plain``, and the trees of the per-bin exchange.

Siblings: the party keeps the per-bin sums (ciphertexts in mode ``he``) of the last request's nodes, and
of each pair of children it sums the smaller and derives the other as the parent's minus it
(homomorphically: a product with the inverse modulo the ciphertext modulus), before the cumulative sums.

Rows: a candidate with a child of fewer than ``min_node_rows`` rows (this party counts them on its own
bins) is not sent; every split this party answers leaves both children at that floor (refused
otherwise, rule ``min_node_rows``), and the partitions of the active party's own splits are held to
it too (:mod:`parties.passive_checks`).

Categorical features: their optimal partition needs per-category sums, so by default they are sent as
they were (per-category sums of each categorical feature, named by its position); a party that sets
``categorical_ordered`` (``PassiveParty(categorical_ordered=True)``, ``vfl party passive
--categorical-ordered``, its federation entry's ``categorical_ordered = true``) has them treated as
ordered bins, shuffled cumulative candidates like any other feature.
"""
from __future__ import annotations

import os
import time

import gmpy2
import numpy as np

from crypto.compress import compress, stride_for
from datasets.errors import ProtocolError
from parties import reveal_budget
from parties.passive_state import PassiveState
from protocols import messages as m
from protocols.serialization import BigInts
from protocols.transport import check_deadline
from vfl.core.binning import Binner
from vfl.core.params import Mode
from vfl.core.sampling import leaf_positions
from vfl.core.split import goes_left

#: the rule a pick outside the last answer's candidates breaks
PICK_RULE = "shuffled candidates"
#: nodes without rows one request may name (a DP released model's full levels; see _rows_by_node)
MAX_EMPTY_NODES = 256


def _group(assignment_row: np.ndarray, node_ids) -> list[np.ndarray]:
    """Rows (increasing) whose entry equals each node id (one sort, not one scan per node)."""
    order = np.argsort(assignment_row, kind="stable")
    keys = assignment_row[order]
    nids = np.asarray(node_ids, dtype=np.int64)
    lo = np.searchsorted(keys, nids, side="left").tolist()
    hi = np.searchsorted(keys, nids, side="right").tolist()
    return [order[a:b] for a, b in zip(lo, hi)]


def _rows_by_node(assignment_row: np.ndarray, node_ids, what: str, tree: int) -> list[np.ndarray]:
    """Rows of each node of one tree, sampled and riding. A node may hold no row (a DP released
    model grows every node to full depth, whatever the data), but at most
    :data:`MAX_EMPTY_NODES` per request: the work and memory of a request stay bounded by the
    rows plus that constant."""
    groups = _group(leaf_positions(assignment_row), node_ids)
    empty = [nid for nid, rows in zip(np.asarray(node_ids).tolist(), groups) if not len(rows)]
    if len(empty) > MAX_EMPTY_NODES:
        raise ProtocolError(f"{what}.node_ids: {len(empty)} nodes of tree {tree} hold no row of the round "
                            f"(at most {MAX_EMPTY_NODES} may)")
    return groups


def _check_nodes(tree_idx: np.ndarray, node_ids: np.ndarray, trees_in_round: int, what: str) -> None:
    if tree_idx.size and int(tree_idx.max()) >= trees_in_round:
        raise ProtocolError(f"{what}.tree_idx: tree {int(tree_idx.max())} is out of range (the round has "
                            f"{trees_in_round} tree(s))")
    pairs = np.stack([tree_idx.astype(np.int64), node_ids.astype(np.int64)], axis=1)
    if len(np.unique(pairs, axis=0)) != len(pairs):
        raise ProtocolError(f"{what}.node_ids: a node is named twice")




class CandidateExchange:
    """One training's candidates: what each feature offers, the last level's per-bin sums (for the
    siblings) and, per node of the last answer, which candidate each position is."""

    def __init__(self, binner: Binner, has_missing: np.ndarray, min_rows: int, monotone: np.ndarray | None,
                 categorical_ordered: bool):
        n_bins = np.asarray(binner.n_bins, dtype=np.int64)
        self.n_bins = n_bins
        self.offsets = np.concatenate([[0], np.cumsum(n_bins)]).astype(np.int64)
        nf = len(n_bins)
        cat = np.array([binner.is_categorical(f) for f in range(nf)], dtype=bool)
        self.ordered = cat & bool(categorical_ordered)          # categorical, as ordered bins
        self.cat_sent = np.flatnonzero(cat & ~self.ordered).astype(np.int32)
        self.min_rows = max(1, int(min_rows))
        self.monotone = None if monotone is None or not np.any(monotone) else np.asarray(monotone, dtype=np.int8)
        width = int(n_bins.max()) if nf else 1
        f_, b_, d_ = [], [], []
        for f in range(nf):
            if f in set(self.cat_sent.tolist()):
                continue
            nb = int(n_bins[f])
            for d, last in ((0, nb - 1), (1, nb - 2 if has_missing[f] else 0)):
                bs = np.arange(max(last, 0))
                f_.append(np.full(len(bs), f))
                b_.append(bs)
                d_.append(np.full(len(bs), d))
        cf = np.concatenate(f_).astype(np.int64) if f_ else np.zeros(0, dtype=np.int64)
        cb = np.concatenate(b_).astype(np.int64) if b_ else np.zeros(0, dtype=np.int64)
        cd = np.concatenate(d_).astype(np.int64) if d_ else np.zeros(0, dtype=np.int64)
        order = np.argsort((cf * width + cb) * 2 + cd, kind="stable")    # canonical: feature, bin, missing-right first
        self.cf, self.cb, self.cd = cf[order], cb[order], cd[order]
        self.level: dict = {}           # (tree, node) -> per-bin sums of the node (the last request's nodes)
        self.picks: dict = {}           # (tree, node) -> candidate index (canonical order) at each position
        self.prev: np.ndarray | None = None     # every row's node per tree at the last request
        self.round: int | None = None

    # -- one request ----------------------------------------------------------------------
    def plan(self, round_idx: int, a: np.ndarray, tree_idx: np.ndarray, node_ids: np.ndarray, sizes):
        """Which nodes to sum and which to derive: ``(build, derive)``, ``build`` a list of (tree, node)
        and ``derive`` of (tree, node, parent, built sibling). ``sizes[t]``: sampled rows per node."""
        if self.round != round_idx:
            self.level, self.prev, self.round, self.picks = {}, None, round_idx, {}
        pos = leaf_positions(a)
        build, derive, done = [], [], set()
        for t, nid in zip(tree_idx.tolist(), node_ids.tolist()):
            if (t, nid) in done:
                continue
            parent = sibling = None
            if self.prev is not None:
                rows = np.flatnonzero(pos[t] == nid)
                if len(rows):
                    p = int(self.prev[t][rows[0]])
                    kids = np.unique(pos[t][self.prev[t] == p]).tolist()
                    if (t, p) in self.level and p != nid and len(kids) == 2:
                        parent, sibling = p, kids[0] if kids[1] == nid else kids[1]
            if parent is None:
                build.append((t, nid))
                done.add((t, nid))
                continue
            small, large = sorted((nid, sibling), key=lambda c: (sizes[t].get(c, 0), c))
            asked = set(zip(tree_idx.tolist(), node_ids.tolist()))
            build.append((t, small))
            done.update({(t, small), (t, large)})
            if (t, large) in asked:
                derive.append((t, large, parent, small))
        return build, derive

    def answer(self, keys: list, sums: dict, counts: dict, modulus, rng: np.random.Generator):
        """Per node ``keys[i]``: its shuffled candidates (left sums) and the per-category sums of the
        categorical features sent; returns ``(values, n_candidates, monotone, picks)``, ``picks[key]``
        the candidate at each position (:meth:`commit` keeps them once the answer is sent)."""
        values, n_cand, mono = [], [], []
        picks = {}
        for key in keys:
            v = sums[key]
            cnt = counts[key]
            n_node = int(cnt[self.offsets[0]:self.offsets[1]].sum()) if len(self.n_bins) else 0
            start = self.offsets[self.cf]
            cl = np.cumsum(cnt)         # flat running counts; a feature's own: minus the count before it
            before = np.where(start > 0, cl[np.maximum(start - 1, 0)], 0)
            left_rows = cl[start + self.cb] - before + np.where(self.cd == 1, cnt[start + self.n_bins[self.cf] - 1], 0)
            ok = np.flatnonzero((left_rows >= self.min_rows) & (n_node - left_rows >= self.min_rows))
            perm = ok[rng.permutation(len(ok))]
            run = _running_sums(v, self.offsets, modulus)
            for c in perm.tolist():
                f, b = int(self.cf[c]), int(self.cb[c])
                s = run[int(self.offsets[f]) + b]
                if self.cd[c]:
                    s = _add(s, v[int(self.offsets[f + 1]) - 1], modulus)
                values.append(s)
            for f in self.cat_sent.tolist():
                values.extend(v[int(self.offsets[f]):int(self.offsets[f + 1])])
            if self.monotone is not None:
                mono.append(self.monotone[self.cf[perm]])
            picks[key] = perm
            n_cand.append(len(perm))
        return values, np.array(n_cand, dtype=np.int64), \
            (np.concatenate(mono).astype(np.int8) if mono else np.zeros(0, dtype=np.int8)), picks

    def commit(self, picks: dict, sums: dict, keys: list, a: np.ndarray) -> None:
        """The answer is made: its positions, its nodes' per-bin sums (the next level's parents) and
        the rows' nodes are this party's state from now on."""
        self.picks = picks
        self.level = {key: sums[key] for key in keys}
        self.prev = leaf_positions(a)

    def resolve(self, key, positions: np.ndarray, cat_feature: int) -> tuple[int, int, int] | None:
        """The canonical candidate ``(feature, bin, missing_left)`` among ``positions`` of node ``key``
        (None: the categorical split ``cat_feature`` wins the tie, by feature order)."""
        perm = self.picks.get(key)
        if perm is None:
            raise _BadPick(f"node {key[1]} of tree {key[0]} has no candidates of the last answer")
        if positions.size and (positions.max() >= len(perm) or len(np.unique(positions)) != positions.size):
            raise _BadPick(f"positions {positions.tolist()[:8]} are not distinct candidates of node {key[1]} of "
                           f"tree {key[0]} ({len(perm)} sent)")
        c = int(perm[positions].min())      # canonical order: the lowest index
        f = int(self.cf[c])
        if cat_feature >= 0 and cat_feature < f:
            return None
        return f, int(self.cb[c]), int(self.cd[c])


class _BadPick(ProtocolError):
    """A pick that names no candidate of the last answer (refused under :data:`PICK_RULE`)."""


def shuffle_rng() -> np.random.Generator:
    """A fresh generator for one request's orders, seeded from the operating system's CSPRNG (256 bits)."""
    return np.random.default_rng(int.from_bytes(os.urandom(32), "little"))


def _add(a, b, modulus):
    return a + b if modulus is None else a * b % modulus


def _running_sums(v: list, offsets: np.ndarray, modulus) -> list:
    """Per feature, the running sums of its bins (homomorphic: running products modulo the
    ciphertext modulus)."""
    out = list(v)
    for f in range(len(offsets) - 1):
        a, b = int(offsets[f]), int(offsets[f + 1])
        for j in range(a + 1, b):
            out[j] = _add(out[j - 1], v[j], modulus)
    return out


def _minus(p, c, modulus):
    return p - c if modulus is None else p * gmpy2.invert(c, modulus) % modulus


def new_exchange(s: PassiveState, req: m.TrainSetup, monotone: np.ndarray) -> CandidateExchange | None:
    """The training's candidate exchange (None: a DP released model or mode dp keep per-bin sums)."""
    t = s.train
    if req.mode == Mode.DP or req.dp_binning is not None:
        return None
    binner = t.binner
    if t.bin_idx is not None:
        missing = np.array([bool(np.any(t.bin_idx[:, f] == binner.missing_bin(f)))
                            for f in range(t.bin_idx.shape[1])], dtype=bool)
    else:       # the bins are on the workers
        counts = t.reader.bin_counts([np.arange(len(t.rows), dtype=np.int64)], binner.n_bins)[0]
        offsets = np.concatenate([[0], np.cumsum(binner.n_bins)]).astype(np.int64)
        missing = counts[offsets[1:] - 1] > 0
    return CandidateExchange(binner, missing, req.min_node_rows, monotone, s.categorical_ordered)


def _counts(s: PassiveState, members: list[np.ndarray]) -> np.ndarray:
    t = s.train
    n_bins = np.asarray(t.binner.n_bins, dtype=np.int64)
    if t.bin_idx is None:
        return t.reader.bin_counts(members, n_bins)
    offsets = np.concatenate([[0], np.cumsum(n_bins)])
    out = np.zeros((len(members), int(offsets[-1])), dtype=np.int64)
    for i, rows in enumerate(members):
        for f, nb in enumerate(n_bins.tolist()):
            out[i, offsets[f]:offsets[f + 1]] = np.bincount(t.bin_idx[rows, f].astype(np.intp), minlength=nb)[:nb]
    return out


def candidates(s: PassiveState, req: m.HistogramRequest, g, a, tree_idx, bin_sums) -> m.CandidateResponse:
    """Answer a checked ``HistogramRequest`` with shuffled candidates (``bin_sums(tree_idx, node_ids)``:
    the flat per-bin sums of those nodes, node-major, and the compute timing)."""
    t = s.train
    ex: CandidateExchange = t.candidates
    modulus = t.nsquare if t.mode == Mode.HE else None
    node_ids = np.asarray(req.node_ids, dtype=np.int64)
    sizes = {}
    for tree in np.unique(tree_idx).tolist():
        row = a[tree]
        ids, cnt = np.unique(row[row >= 0], return_counts=True)
        sizes[tree] = dict(zip(ids.tolist(), cnt.tolist()))
    build, derive = ex.plan(int(req.round_idx), a, tree_idx, node_ids, sizes)
    total = int(ex.offsets[-1])
    flat, timing = bin_sums(np.array([k for k, _ in build], dtype=np.int64),
                            np.array([n for _, n in build], dtype=np.int64))
    t0 = time.perf_counter()
    sums = {key: flat[i * total:(i + 1) * total] for i, key in enumerate(build)}
    for tree, nid, parent, small in derive:          # the parent's sums minus the built sibling's
        sums[(tree, nid)] = [_minus(p, c, modulus) for p, c in zip(ex.level[(tree, parent)], sums[(tree, small)])]
    keys = list(zip(tree_idx.tolist(), node_ids.tolist()))
    members = [np.flatnonzero(a[k] == nid) for k, nid in keys]      # sampled rows
    counts = dict(zip(keys, _counts(s, members)))
    rng = shuffle_rng()
    values, n_cand, mono, picks = ex.answer(keys, sums, counts, modulus, rng)
    t1 = time.perf_counter()
    timing["candidates"] = int((t1 - t0) * 1e6)
    packed = compress(values, g.layout.value_bits, stride_for(g.per, 1), modulus, executor=t.shards.executor) \
        if values else []
    t2 = time.perf_counter()
    timing["compress"] = timing.get("compress", 0) + int((t2 - t1) * 1e6)
    if t.mode == Mode.HE and packed:
        packed = s.need("the public key", t.randomizer).rerandomize(packed)
        timing["rerandomize"] = int((time.perf_counter() - t2) * 1e6)
        timing["rerandomize_bg"] = int(t.randomizer.background_since_last() * 1e6)
    ex.commit(picks, sums, keys, a)
    return m.CandidateResponse(n_cand, len(values), BigInts(packed), mono, ex.cat_sent, timing)


def resolve_picks(s: PassiveState, req: m.CandidatePick) -> list[tuple[int, int, bool, list | None]]:
    """Per node of a ``CandidatePick``, the split it names: ``(feature, bin, default_left, left bins or
    None)`` -- the canonical candidate among the positions, or the categorical split (an ordered
    categorical feature's threshold becomes the categorical split "bins up to it")."""
    ex: CandidateExchange | None = s.train.candidates
    if ex is None:
        raise ProtocolError(f"party {s.name!r}: CandidatePick in a training that answers per-bin sums")
    n_pos = np.asarray(req.n_positions, dtype=np.int64)
    n_left = req.n_left_bins if len(req.n_left_bins) else np.full(len(req.node_ids), -1, dtype=np.int32)
    if int(n_pos.sum()) != len(req.positions) or len(n_left) != len(req.node_ids) \
            or int(np.sum(n_left[n_left > 0])) != len(req.left_bins):
        raise ProtocolError("CandidatePick: n_positions/n_left_bins do not match positions/left_bins")
    starts = np.concatenate([[0], np.cumsum(n_pos)])
    lstarts = np.concatenate([[0], np.cumsum(np.maximum(n_left, 0))])
    cat_sent = set(ex.cat_sent.tolist())
    out = []
    for i, (t, nid, f) in enumerate(zip(req.tree_idx.tolist(), req.node_ids.tolist(), req.feature_idx.tolist())):
        positions = np.asarray(req.positions[starts[i]:starts[i + 1]], dtype=np.int64)
        if f >= 0 and (f not in cat_sent or n_left[i] < 0):
            raise _BadPick(f"feature {f} is not a categorical feature sent as per-category sums")
        if f < 0 and not positions.size:
            raise _BadPick(f"node {nid} of tree {t}: no candidate named")
        num = ex.resolve((t, nid), positions, f) if positions.size else None
        if num is None:
            out.append((f, -1, bool(req.default_left[i]), req.left_bins[lstarts[i]:lstarts[i + 1]].astype(np.int64)))
            continue
        fn, b, d = num
        out.append((fn, b, bool(d), np.arange(b + 1, dtype=np.int64) if ex.ordered[fn] else None))
    return out


def _check_round(s: PassiveState, round_idx: int) -> None:
    if round_idx != s.train.round_idx:
        raise ProtocolError(f"party {s.name!r} holds the gradients of round {s.train.round_idx}, "
                            f"not of round {round_idx}")


def histogram_request(s: PassiveState, req: m.HistogramRequest) -> m.HistogramResponse | m.CandidateResponse:
    """A level's request: per-bin sums (a DP released model), else shuffled candidates."""
    t = s.train
    if t.protocol is not None:
        t.protocol.check_open("HistogramRequest")
    g = s.need("gradients", t.grads)
    _check_round(s, req.round_idx)
    intake = t.intake if t.intake is not None and t.intake.g is g and not t.intake.used else None
    if intake is not None:
        ready = int(intake.partials.sum())        # partials computed before the request arrived
        intake.events.append(("request", ready, time.perf_counter()))
        intake.finish()
    if not g.complete():
        raise ProtocolError(f"party {s.name!r} received the gradients of only {int(g.received.sum())} of "
                            f"{len(g.received)} samples of round {g.round_idx}")
    a = req.assignment
    if a.ndim != 2 or a.shape[1] != len(t.rows):
        raise ProtocolError(f"assignment of shape {a.shape} does not cover {len(t.rows)} samples")
    if not 1 <= a.shape[0] <= g.groups * g.layout.n_targets:
        raise ProtocolError(f"HistogramRequest.assignment: {a.shape[0]} trees, the round's gradients hold "
                            f"{g.groups * g.layout.n_targets}")
    tree_idx = np.asarray(req.tree_idx, dtype=np.int64)      # >= 0 (the decoder checks)
    _check_nodes(tree_idx, np.asarray(req.node_ids), a.shape[0], "HistogramRequest")
    if g.groups > 1 and tree_idx.size and tree_idx.max() // g.layout.n_targets >= g.groups:
        raise ProtocolError("tree index out of the range of the gradient groups")
    for tree in np.unique(tree_idx).tolist():      # few nodes without rows: the work is bounded by the data
        at = np.flatnonzero(tree_idx == tree)
        _rows_by_node(a[tree], np.asarray(req.node_ids)[at], "HistogramRequest", tree)
    snap = t.protocol.snapshot() if t.protocol is not None else None
    if t.protocol is not None:      # the tree this party helps grow: refinement, levels, floor (passive_checks)
        t.protocol.histogram_request(int(req.round_idx), a, tree_idx, np.asarray(req.node_ids))
    try:
        ready = ready if intake is not None else 0
        if t.candidates is not None:        # shuffled candidates (this module's docstring)
            prev = t.assignment
            try:
                return candidates(s, req, g, a, tree_idx,
                                  lambda ti, ni: _bin_sums(s, g, a, ti, ni, intake, ready))
            except BaseException:
                t.assignment = prev
                raise
        return _histograms(s, req, g, a, tree_idx, intake, ready)
    except BaseException:
        if snap is not None:        # not answered: the same request may come again
            t.protocol.restore(snap)
        raise


def _bin_sums(s: PassiveState, g, a, tree_idx, node_ids, intake, ready) -> tuple[list, dict]:
    """The flat per-bin sums of nodes ``node_ids`` (node-major; compressed slots with pre-shifted
    copies), from the round's root partials when they answer the request; and the compute timing."""
    t = s.train
    t.assignment = a
    check_deadline("histograms")
    modulus = t.nsquare if t.mode == Mode.HE else None
    n_bins = np.diff(t.binner.bin_offsets).tolist()
    t0 = time.perf_counter()
    groups = intake.root_groups(np.asarray(tree_idx), np.asarray(node_ids), a) if intake is not None else None
    if groups is not None:         # the root level, summed while the gradients arrived
        sums, _ = t.shards.root_histograms(g, groups, n_bins, modulus)
        t.overlap["eager"] += 1
        t.overlap["partials_before_request"] += ready
        t.overlap["partials"] += len(t.shards)
    else:
        t.overlap["fallback"] += intake is not None
        sums, _ = t.shards.histograms(g, a, np.asarray(tree_idx).tolist(), np.asarray(node_ids).tolist(), n_bins,
                                      modulus)
    check_deadline("histograms")
    return sums, {"histogram": int((time.perf_counter() - t0) * 1e6)}


def _histograms(s: PassiveState, req: m.HistogramRequest, g, a, tree_idx, intake, ready):
    t = s.train
    modulus = t.nsquare if t.mode == Mode.HE else None
    n_values = len(req.node_ids) * int(t.binner.bin_offsets[-1])
    sums, timing = _bin_sums(s, g, a, tree_idx, req.node_ids, intake, ready)
    t1 = time.perf_counter()
    if g.shifts < g.per:    # Horner over the slots no pre-shifted copy reached (all of them when shifts == 1)
        packed = compress(sums, g.layout.value_bits, stride_for(g.per, g.shifts), modulus,
                          executor=t.shards.executor)
    else:       # the key holder sent a copy per slot: the shards summed straight into the output slots
        packed = sums
    t2 = time.perf_counter()
    timing["compress"] = int((t2 - t1) * 1e6)
    if t.mode == Mode.HE:       # not the product of the key holder's own ciphertexts (issue 22)
        packed = s.need("the public key", t.randomizer).rerandomize(packed)
        timing["rerandomize"] = int((time.perf_counter() - t2) * 1e6)
        timing["rerandomize_bg"] = int(t.randomizer.background_since_last() * 1e6)   # its stock, made while waiting
    return m.HistogramResponse(n_values, BigInts(packed), timing)


def split_request(s: PassiveState, req: m.SplitRequest) -> m.SplitResponse:
    """Split nodes on named (feature, bin)s: only in a training of per-bin sums (a DP released model)."""
    t = s.train
    if t.candidates is not None:
        raise ProtocolError(f"party {s.name!r} refuses SplitRequest: rule {PICK_RULE!r}: this training names "
                            "splits by their position among the party's shuffled candidates (CandidatePick)")
    nf = len(s.feature_names)
    binner = s.need("setup", t.binner)
    bad = [(int(f), int(b)) for f, b in zip(req.feature_idx, req.bin_idx)
           if not (int(f) < nf and int(b) < binner.missing_bin(int(f)))]
    if bad:
        raise ProtocolError(f"no feature {bad[0][0]} / bin {bad[0][1]} at party {s.name!r}")
    n_left = req.n_left_bins if len(req.n_left_bins) else np.full(len(req.node_ids), -1, dtype=np.int32)
    if len(n_left) != len(req.node_ids) or int(np.sum(n_left[n_left > 0])) != len(req.left_bins):
        raise ProtocolError("SplitRequest: n_left_bins does not match left_bins")
    starts = np.concatenate([[0], np.cumsum(np.maximum(n_left, 0))])
    specs = []
    for i, (f, b, dl) in enumerate(zip(req.feature_idx.tolist(), req.bin_idx.tolist(), req.default_left.tolist())):
        cats = req.left_bins[starts[i]:starts[i + 1]].astype(np.int64) if n_left[i] >= 0 else None
        if cats is None and b < 0:
            raise ProtocolError(f"SplitRequest.bin_idx: {b} for a numeric split (only a categorical split "
                                "has no bin)")
        specs.append((int(f), int(b), bool(dl), cats))
    return _apply(s, req.round_idx, req.tree_idx, req.node_ids, specs, "SplitRequest")


def candidate_pick(s: PassiveState, req: m.CandidatePick) -> m.SplitResponse:
    """The active party's pick among this party's shuffled candidates (:func:`resolve_picks`)."""
    t = s.train
    s.need("a histogram request", t.assignment)
    _check_round(s, req.round_idx)
    _check_nodes(req.tree_idx, req.node_ids, t.assignment.shape[0], "CandidatePick")
    if t.protocol is not None:
        t.protocol.split_request(int(req.round_idx), req.tree_idx, req.node_ids, "CandidatePick")
    try:
        specs = resolve_picks(s, req)
    except _BadPick as exc:
        if t.protocol is None:
            raise ProtocolError(f"party {s.name!r} refuses CandidatePick: rule {PICK_RULE!r}: {exc}") from None
        t.protocol.refuse(f"CandidatePick of round {req.round_idx}", PICK_RULE, str(exc))
    return _apply(s, req.round_idx, req.tree_idx, req.node_ids, specs, "CandidatePick")


def _apply(s: PassiveState, round_idx, tree_idx, node_ids, specs, what: str) -> m.SplitResponse:
    """Split each node on ``(feature, bin, default_left, left bins or None)``: the rows going left,
    both children held to ``min_node_rows`` (rule 'min_node_rows'), then the records."""
    t = s.train
    a = s.need("a histogram request", t.assignment)
    _check_round(s, round_idx)
    binner = t.binner
    _check_nodes(tree_idx, node_ids, a.shape[0], what)
    if t.protocol is not None and what == "SplitRequest":
        t.protocol.split_request(int(round_idx), tree_idx, node_ids)
    members: list = [None] * len(node_ids)
    for tree in np.unique(tree_idx).tolist():
        at = np.flatnonzero(tree_idx == tree)
        for i, rows in zip(at.tolist(), _rows_by_node(a[tree], node_ids[at], what, tree)):
            members[i] = rows                          # sampled and riding rows
    rules = [(f, b, dl, binner.missing_bin(f), None if cats is None else cats.tolist())
             for f, b, dl, cats in specs]
    if t.bin_idx is None:       # the bins are on the shards' workers: they apply the rule
        go_left = t.reader.go_left(rules, members) if rules else []
    else:
        go_left = [go_left_rows(t.bin_idx[rows, f].astype(np.int64), b, dl, binner.missing_bin(f), cats)
                   for rows, (f, b, dl, cats) in zip(members, specs)]
    if t.protocol is not None:
        for ti, nid, rows, gl in zip(tree_idx.tolist(), node_ids.tolist(), members, go_left):
            sampled = a[ti][rows] >= 0
            t.protocol.check_children(what, ti, nid, int(np.sum(gl & sampled)), int(np.sum(~gl & sampled)),
                                      strict=t.candidates is not None)
    reveal_budget.on_split(s, members)      # the lifetime budget of split answers per row (issue 31), before any record
    record_ids = []
    for (f, b, dl, cats), ti, nid in zip(specs, tree_idx.tolist(), node_ids.tolist()):
        if cats is not None:
            n_cat = len(s.categories.get(s.feature_names[f], [])) if 0 <= f < len(s.feature_names) else 0
            record_ids.append(s.table.add_categorical(s.name, s.feature_names, binner, f, cats, dl, n_cat,
                                                      int(t.round_idx), int(ti), int(nid)))
        else:
            record_ids.append(s.table.add(s.name, s.feature_names, binner, f, b, dl, int(t.round_idx), int(ti),
                                          int(nid)))
    if t.protocol is not None:      # the next level must divide these nodes exactly so
        for ti, nid, gl in zip(tree_idx.tolist(), node_ids.tolist(), go_left):
            t.protocol.record_split(ti, nid, gl)
    return m.SplitResponse(np.array(record_ids, dtype=np.int64),
                           np.concatenate(go_left) if go_left else np.zeros(0, dtype=bool),
                           np.array([len(r) for r in members], dtype=np.int64))


def go_left_rows(bins: np.ndarray, b: int, dl: bool, missing: int, cats) -> np.ndarray:
    """The split rule on one feature's bins (categorical: the bins ``cats`` go left)."""
    return goes_left(bins, b, dl, missing=bins == missing, categories=None if cats is None else cats.tolist())
