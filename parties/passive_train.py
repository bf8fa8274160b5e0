"""The passive party's training handlers: one training session, round by round.

``TrainSetup`` -> ``BinningInfo`` (bins of the aligned rows), ``PublicKey`` -> ``Ack``, then per
round ``Gradients`` -> ``Ack``, ``HistogramRequest`` -> ``HistogramResponse`` (the ciphertext
kernels of :mod:`crypto`), ``SplitRequest`` -> ``SplitResponse`` (records added to the lookup
table, rows sent left), and at the end ``TrainEnd`` -> ``Ack``. A resumed training
(``TrainResume``, answered by :mod:`parties.server`) keeps the records of the finished rounds.
"""
from __future__ import annotations

import time

import gmpy2
import numpy as np

from crypto.compress import compress, compressed_histogram
from crypto.histogram import histogram
from crypto.keys import public_key_from_n
from crypto.packing import PackingLayout
from datasets.errors import ProtocolError
from parties.passive_state import PassiveState, ReceivedGradients
from protocols import messages as m
from protocols.serialization import BigInts
from protocols.transport import check_deadline
from vfl.binning import Binner
from vfl.params import Mode
from vfl.sampling import leaf_positions
from vfl.split import goes_left

#: in mode plain there is no key: the largest plaintext a layout may fill, in bits
MAX_PLAIN_BITS = 16384
#: target groups (blocks of gradient values) one Gradients message may carry
MAX_GROUPS = 1024
#: nodes per chunk of histogram work (the caller's deadline is checked between chunks)
NODES_PER_CHUNK = 8


def _group(assignment_row: np.ndarray, node_ids) -> list[np.ndarray]:
    """Rows (increasing) whose entry equals each node id (one sort, not one scan per node)."""
    order = np.argsort(assignment_row, kind="stable")
    keys = assignment_row[order]
    nids = np.asarray(node_ids, dtype=np.int64)
    lo = np.searchsorted(keys, nids, side="left").tolist()
    hi = np.searchsorted(keys, nids, side="right").tolist()
    return [order[a:b] for a, b in zip(lo, hi)]


def _rows_by_node(assignment_row: np.ndarray, node_ids, what: str, tree: int) -> list[np.ndarray]:
    """Rows of each node of one tree, sampled and riding; every node must hold a row (a node
    without rows has nothing to build or split: asking for it is refused, which also bounds the
    work and memory of a request by the number of rows)."""
    groups = _group(leaf_positions(assignment_row), node_ids)
    for nid, rows in zip(np.asarray(node_ids).tolist(), groups):
        if not len(rows):
            raise ProtocolError(f"{what}.node_ids: node {nid} of tree {tree} holds no row of the round")
    return groups


def _check_nodes(tree_idx: np.ndarray, node_ids: np.ndarray, n_trees: int, what: str) -> None:
    if tree_idx.size and int(tree_idx.max()) >= n_trees:
        raise ProtocolError(f"{what}.tree_idx: tree {int(tree_idx.max())} is out of range (the round has "
                            f"{n_trees} tree(s))")
    pairs = np.stack([tree_idx.astype(np.int64), node_ids.astype(np.int64)], axis=1)
    if len(np.unique(pairs, axis=0)) != len(pairs):
        raise ProtocolError(f"{what}.node_ids: a node is named twice")


def setup(s: PassiveState, req: m.TrainSetup) -> m.BinningInfo:
    rows = s.aligned_rows()
    if req.mode not in Mode.values():
        raise ProtocolError(f"unknown mode {req.mode!r}")
    t = s.train
    t.mode = req.mode
    s.model_id = req.model_id
    s.table.records = []
    X = s.X[rows]
    t.binner = Binner(req.max_bin).fit(X)
    t.bin_idx = t.binner.transform(X)
    return m.BinningInfo(t.binner.n_bins)


def public_key(s: PassiveState, req: m.PublicKey) -> m.Ack:
    pk = public_key_from_n(int(req.n, 16))
    s.train.nsquare = gmpy2.mpz(pk.nsquare)
    return m.Ack()


def gradients(s: PassiveState, req: m.Gradients) -> m.Ack:
    t = s.train
    s.need("setup", t.binner)
    n = len(t.rows)
    if req.shifts < 1 or len(req.values) == 0 or len(req.values) % (req.shifts * n):
        raise ProtocolError(f"got {len(req.values)} gradient values for {n} samples (shifts={req.shifts})")
    if req.encrypted != (t.mode == Mode.HE):
        raise ProtocolError(f"mode {t.mode!r} does not match encrypted={req.encrypted}")
    layout: PackingLayout = req.packing_layout()       # well-formed (checked by the decoder)
    per = int(req.values_per_ciphertext)
    # sizes against what this session allows: sums of at most n rows, slots that fit the key
    if req.encrypted:
        n2 = s.need("the public key", t.nsquare)
        key_bits = (int(n2).bit_length() + 1) // 2
    else:
        key_bits = MAX_PLAIN_BITS
    if layout.max_rows > n:
        raise ProtocolError(f"Gradients.layout: max_rows={layout.max_rows} but the training has {n} rows")
    if per * layout.value_bits > key_bits - 2:
        raise ProtocolError(f"Gradients.layout: {per} values of {layout.value_bits} bits per ciphertext do not "
                            f"fit a {key_bits}-bit key")
    if len(req.values) // (req.shifts * n) > MAX_GROUPS:
        raise ProtocolError(f"Gradients.values: more than {MAX_GROUPS} target groups")
    if req.encrypted and any(not (0 < v < n2) for v in req.values):
        raise ProtocolError("a ciphertext is out of range")
    block = int(req.shifts) * n
    values = req.values.values
    t.grads = ReceivedGradients(values,
                             [values[j * block:(j + 1) * block] for j in range(len(values) // block)],
                                int(req.shifts), per, layout)      # one block per target group (see m.Gradients)
    t.round_idx = req.round_idx
    return m.Ack()


def _check_round(s: PassiveState, round_idx: int) -> None:
    if round_idx != s.train.round_idx:
        raise ProtocolError(f"party {s.name!r} holds the gradients of round {s.train.round_idx}, "
                            f"not of round {round_idx}")


def histogram_request(s: PassiveState, req: m.HistogramRequest) -> m.HistogramResponse:
    t = s.train
    g = s.need("gradients", t.grads)
    _check_round(s, req.round_idx)
    a = req.assignment
    if a.ndim != 2 or a.shape[1] != len(t.rows):
        raise ProtocolError(f"assignment of shape {a.shape} does not cover {len(t.rows)} samples")
    if not 1 <= a.shape[0] <= g.groups * g.layout.n_targets:
        raise ProtocolError(f"HistogramRequest.assignment: {a.shape[0]} trees, the round's gradients hold "
                            f"{g.groups * g.layout.n_targets}")
    _check_nodes(req.tree_idx, req.node_ids, a.shape[0], "HistogramRequest")
    node_rows: list = [None] * len(req.node_ids)
    for tree in np.unique(req.tree_idx).tolist():
        at = np.flatnonzero(req.tree_idx == tree)
        _rows_by_node(a[tree], req.node_ids[at], "HistogramRequest", tree)      # every node holds rows
        for i, rows in zip(at.tolist(), _group(a[tree], req.node_ids[at])):     # its sampled rows
            node_rows[i] = rows
    t.assignment = a
    check_deadline("histograms")
    modulus = t.nsquare if t.mode == Mode.HE else None
    offsets = t.binner.bin_offsets
    executor = s.get_executor() if modulus is not None else None
    t0 = time.perf_counter()
    if g.groups == 1:
        groups = {0: np.arange(len(node_rows))}
    else:   # each node sums the block of its tree's target group
        group = np.asarray(req.tree_idx, dtype=np.int64) // g.layout.n_targets
        if group.size and (group.min() < 0 or group.max() >= g.groups):
            raise ProtocolError("tree index out of the range of the gradient groups")
        groups = {j: np.flatnonzero(group == j) for j in np.unique(group).tolist()}
    n_values = len(node_rows) * int(offsets[-1])
    # the work in chunks of nodes, checking between chunks that the caller still waits
    chunks = [(j, idx[k:k + NODES_PER_CHUNK]) for j, idx in groups.items()
              for k in range(0, len(idx), NODES_PER_CHUNK)]
    if g.shifts == 1:
        hists = [None] * len(node_rows)
        for j, idx in chunks:
            check_deadline("histograms")
            part = histogram(g.group_values[j], t.bin_idx, [node_rows[i] for i in idx.tolist()],
                             offsets, modulus, executor=executor, slot=f"values{j}")
            for i, hist in zip(idx.tolist(), part):
                hists[i] = hist
        flat = [v for h in hists for v in h]
        t1 = time.perf_counter()
        check_deadline("histograms")
        packed = compress(flat, g.layout.value_bits, g.per, modulus, executor=executor)
    else:       # the key holder sent pre-shifted copies: rows go straight into their slots
        packed = None
        for j, idx in chunks:
            check_deadline("histograms")
            part = compressed_histogram(g.group_values[j], t.bin_idx,
                                        [node_rows[i] for i in idx.tolist()], offsets, g.layout.value_bits,
                                        g.per, modulus, shifts=g.shifts, executor=executor,
                                        slot=f"values{j}", node_slots=idx.tolist(), n_nodes=len(node_rows))
            if packed is None:
                packed = part
            elif modulus is None:
                packed = [a + b for a, b in zip(packed, part)]
            else:       # nodes of several groups may share an output ciphertext
                packed = [b if a == 1 else a if b == 1 else a * b % modulus for a, b in zip(packed, part)]
        if packed is None:
            packed = []
        t1 = time.perf_counter()
    t2 = time.perf_counter()
    return m.HistogramResponse(n_values, BigInts(packed), {"histogram": int((t1 - t0) * 1e6),
                                                           "compress": int((t2 - t1) * 1e6)})


def split_request(s: PassiveState, req: m.SplitRequest) -> m.SplitResponse:
    t = s.train
    a = s.need("a histogram request", t.assignment)
    _check_round(s, req.round_idx)
    binner = t.binner
    _check_nodes(req.tree_idx, req.node_ids, a.shape[0], "SplitRequest")
    members: list = [None] * len(req.node_ids)
    for tree in np.unique(req.tree_idx).tolist():
        at = np.flatnonzero(req.tree_idx == tree)
        for i, rows in zip(at.tolist(), _rows_by_node(a[tree], req.node_ids[at], "SplitRequest", tree)):
            members[i] = rows                          # sampled and riding rows
    nf = len(s.feature_names)
    bad = [(int(f), int(b)) for f, b in zip(req.feature_idx, req.bin_idx)
           if not (int(f) < nf and int(b) < binner.missing_bin(int(f)))]
    if bad:
        raise ProtocolError(f"no feature {bad[0][0]} / bin {bad[0][1]} at party {s.name!r}")
    record_ids, go_left, n_rows = [], [], []
    for i, (ti, nid, f, b, dl) in enumerate(zip(req.tree_idx, req.node_ids, req.feature_idx, req.bin_idx,
                                                req.default_left)):
        f, b = int(f), int(b)
        rid = s.table.add(s.name, s.feature_names, binner, f, b, dl, int(t.round_idx), int(ti), int(nid))
        rows = members[i]
        bins = t.bin_idx[rows, f].astype(np.int64)
        go_left.append(goes_left(bins, b, dl, missing=bins == binner.missing_bin(f)))
        n_rows.append(len(rows))
        record_ids.append(rid)
    return m.SplitResponse(np.array(record_ids, dtype=np.int64),
                           np.concatenate(go_left) if go_left else np.zeros(0, dtype=bool),
                           np.array(n_rows, dtype=np.int64))


def train_end(s: PassiveState, req: m.TrainEnd) -> m.Ack:
    if req.model_id != s.model_id:
        raise ProtocolError("TrainEnd for an unknown model")
    s.completed = bool(req.completed)
    s.train.grads = None
    s.close_executor()
    if s.eval_session is not None:      # the validation session ends with training
        s.sessions.pop(s.eval_session, None)
        s.eval_session = None
    return m.Ack({"n_records": len(s.table)})
