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
from datasets.errors import InputError, ProtocolError
from parties.passive_state import PassiveState, ReceivedGradients
from protocols import messages as m
from protocols.serialization import BigInts
from vfl.binning import Binner
from vfl.params import Mode
from vfl.sampling import node_members
from vfl.split import goes_left


def setup(s: PassiveState, req: m.TrainSetup) -> m.BinningInfo:
    rows = s.aligned_rows()
    if req.mode not in Mode.values():
        raise ProtocolError(f"unknown mode {req.mode!r}")
    t = s.train
    t.mode = req.mode
    s.model_id = req.model_id
    s.table.records = []
    X = s.X[rows]
    categorical = np.array([f in s.categories for f in s.feature_names], dtype=bool)
    monotone = np.array([s.monotone.get(f, 0) for f in s.feature_names], dtype=np.int8)
    if req.mode == Mode.DP and (categorical.any() or monotone.any()):
        kind = "categorical features" if categorical.any() else "monotone constraints"
        raise InputError(f"party {s.name!r}: {kind} are not supported in mode dp (its noisy release "
                         "buckets every feature as numeric); use mode he or plain")
    t.binner = Binner(req.max_bin, categorical if categorical.any() else None, req.max_cat).fit(X)
    t.bin_idx = t.binner.transform(X)
    return m.BinningInfo(t.binner.n_bins, categorical if categorical.any() else np.zeros(0, dtype=bool),
                         monotone if monotone.any() else np.zeros(0, dtype=np.int8))


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
    if req.encrypted:
        n2 = s.need("the public key", t.nsquare)
        if any(not (0 < v < n2) for v in req.values):
            raise ProtocolError("a ciphertext is out of range")
    layout = PackingLayout.from_dict(req.layout)
    if req.values_per_ciphertext < 1:
        raise ProtocolError("values_per_ciphertext must be positive")
    per = int(req.values_per_ciphertext)
    if req.shifts not in (1, per):
        raise ProtocolError(f"shifts must be 1 or values_per_ciphertext={per}, got {req.shifts}")
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
    t.assignment = a
    node_rows = [np.flatnonzero(a[ti] == nid) for ti, nid in zip(req.tree_idx, req.node_ids)]
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
    if g.shifts == 1:
        hists = [None] * len(node_rows)
        for j, idx in groups.items():
            part = histogram(g.group_values[j], t.bin_idx, [node_rows[i] for i in idx.tolist()],
                             offsets, modulus, executor=executor, slot=f"values{j}")
            for i, hist in zip(idx.tolist(), part):
                hists[i] = hist
        flat = [v for h in hists for v in h]
        t1 = time.perf_counter()
        packed = compress(flat, g.layout.value_bits, g.per, modulus, executor=executor)
    else:       # the key holder sent pre-shifted copies: rows go straight into their slots
        packed = None
        for j, idx in groups.items():
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
    record_ids, go_left, n_rows = [], [], []
    n_left = req.n_left_bins if len(req.n_left_bins) else np.full(len(req.node_ids), -1, dtype=np.int32)
    if len(n_left) != len(req.node_ids) or int(np.sum(n_left[n_left > 0])) != len(req.left_bins):
        raise ProtocolError("SplitRequest: n_left_bins does not match left_bins")
    starts = np.concatenate([[0], np.cumsum(np.maximum(n_left, 0))])
    for i, (ti, nid, f, b, dl) in enumerate(zip(req.tree_idx, req.node_ids, req.feature_idx, req.bin_idx,
                                                req.default_left)):
        f, b = int(f), int(b)
        cats = None
        if n_left[i] >= 0:          # categorical: the bins that go left
            cats = req.left_bins[starts[i]:starts[i + 1]].astype(np.int64)
            n_cat = len(s.categories.get(s.feature_names[f], [])) if 0 <= f < len(s.feature_names) else 0
            rid = s.table.add_categorical(s.name, s.feature_names, binner, f, cats, dl, n_cat, int(t.round_idx),
                                          int(ti), int(nid))
        else:
            rid = s.table.add(s.name, s.feature_names, binner, f, b, dl, int(t.round_idx), int(ti), int(nid))
        rows = node_members(a[int(ti)], int(nid))     # sampled and riding rows
        bins = t.bin_idx[rows, f].astype(np.int64)
        go_left.append(goes_left(bins, b, dl, missing=bins == binner.missing_bin(f),
                                 categories=None if cats is None else cats.tolist()))
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
