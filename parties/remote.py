"""The active party's side of talking to passive parties during training and prediction.

:class:`RemoteSource` is a passive party's features as a histogram source of
the boosting loop (:mod:`vfl.core.sources`): it streams the round's gradient
shards (encrypted once by :class:`parties.channel.GradientChannel`), asks
for histograms and splits, and decodes the bin sums. The transport underneath
(in memory or gRPC) is invisible here.

Several passive parties at once: every level the boosting loop asks *all*
sources the same thing (``start_round``, then ``build``) through a ``map``
step; when the transport can run calls concurrently (``transport.concurrent``,
e.g. gRPC) and there are two or more passive parties, :func:`source_map` runs
that step in threads, so no party waits for the previous one's ciphertext
work. Splits stay sequential (they go to one owner each and are cheap).
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from datasets.errors import PeerError, VFLError
from parties.channel import GradientChannel
from protocols import messages as m
from protocols.transport import Transport
from vfl.core.fixedpoint import decode_fixed
from vfl.core.rounds import RoundGradients
from vfl.core.sources import HistogramSource, NodeCandidates, SplitRef

log = logging.getLogger("vfl.active")


class RemoteSource(HistogramSource):
    """A passive party's features behind a transport."""

    def __init__(self, transport: Transport, party: str, bin_offsets: np.ndarray, channel: GradientChannel,
                 categorical: np.ndarray | None = None, monotone: np.ndarray | None = None, shuffled: bool = False):
        """``categorical``/``monotone``: what the passive party declared per feature at setup (the feature's
        position only: the active party never learns a name or a category); ``shuffled``: the party
        answers shuffled split candidates (:mod:`parties.passive_splits`), not per-bin sums."""
        self.shuffled = bool(shuffled)
        self.transport = transport
        self.party = party
        self.bin_offsets = np.asarray(bin_offsets, dtype=np.int64)
        self.channel = channel
        n_features = len(self.bin_offsets) - 1
        for name, arr in (("categorical", categorical), ("monotone", monotone)):
            if arr is not None and len(arr) and len(arr) != n_features:
                raise PeerError(f"party {party!r} declared {name} for {len(arr)} of its {n_features} features")
        self.categorical = np.asarray(categorical, dtype=bool) \
            if categorical is not None and np.any(categorical) else None
        self.monotone = np.asarray(monotone, dtype=np.int8) if monotone is not None and np.any(monotone) else None
        if self.monotone is not None and (np.any(np.abs(self.monotone) > 1) or
                                          (self.categorical is not None and
                                           np.any(self.categorical & (self.monotone != 0)))):
            raise PeerError(f"party {party!r} declared invalid monotone constraints")

    def start_round(self, gradients: RoundGradients) -> None:
        """Stream the round's gradients: a header, then one shard message at a time (each encrypted,
        or fetched from the active party's worker holding it, when asked for, sent, and dropped;
        with overlap the next shard is being encrypted meanwhile). The bytes and the seconds spent
        in the calls (not waiting for an encryption) are the link's measured throughput
        (:meth:`GradientChannel.observe_send`)."""
        key = (self.transport.local_name, self.party)
        sent0, wire = self.transport.bytes_sent[key], 0.0
        for message in self.channel.messages(gradients.round_idx):    # may wait for the shard's encryption
            t0 = time.perf_counter()
            self.transport.call(self.party, message)
            wire += time.perf_counter() - t0
        self.channel.observe_send(self.party, self.transport.bytes_sent[key] - sent0, wire)

    def build(self, round_idx, tree_idx, node_ids, assignment):
        with self.channel.waiting():      # the workers make obfuscators while the passive party builds
            reply = self.transport.call(self.party, m.HistogramRequest(
                round_idx=round_idx, tree_idx=np.asarray(tree_idx, np.int32),
                node_ids=np.asarray(node_ids, np.int32), assignment=np.asarray(assignment, np.int32)))
        if self.shuffled:
            return self._candidates(reply, tree_idx, node_ids)
        n_flat = int(self.bin_offsets[-1])
        total = len(node_ids) * n_flat
        if reply.n_values != total:
            raise PeerError(f"party {self.party!r} returned {reply.n_values} bin sums, expected {total}")
        # the passive party's own compute time (rerandomize_bg: its reply obfuscators, made while it waited)
        for stage in ("histogram", "compress", "rerandomize", "rerandomize_bg"):
            v = reply.compute_us.get(stage, 0)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                self.channel.current.timing.add(stage, v / 1e6)
        g, h = self.channel.decode(reply.values.values, total)
        precision = self.channel.current.layout.precision_bits
        tgt = np.repeat(np.asarray(tree_idx, dtype=np.int64) % self.channel.current.group_size, n_flat)
        sel = np.arange(total)
        sg = decode_fixed(g[sel, tgt], precision)
        sh = decode_fixed(h[sel, tgt], precision)
        return sg.reshape(len(node_ids), n_flat), sh.reshape(len(node_ids), n_flat)

    def _candidates(self, reply, tree_idx, node_ids) -> list[NodeCandidates]:
        """Decode a :class:`protocols.messages.CandidateResponse`: per node its shuffled candidates' left sums
        and the per-category sums of the categorical features the party sent."""
        if not isinstance(reply, m.CandidateResponse):
            raise PeerError(f"party {self.party!r} answered per-bin sums where shuffled candidates were agreed")
        n_cand = np.asarray(reply.n_candidates, dtype=np.int64)
        cats = [int(f) for f in reply.cat_features]
        declared = set(np.flatnonzero(self.categorical).tolist()) if self.categorical is not None else set()
        if len(n_cand) != len(node_ids) or not set(cats) <= declared or cats != sorted(set(cats)):
            raise PeerError(f"party {self.party!r} sent a malformed candidate response")
        widths = [int(self.bin_offsets[f + 1] - self.bin_offsets[f]) for f in cats]
        per_node_cat = sum(widths)
        total = int(n_cand.sum()) + len(node_ids) * per_node_cat
        mono = np.asarray(reply.monotone, dtype=np.int8)
        if reply.n_values != total or (len(mono) and len(mono) != int(n_cand.sum())):
            raise PeerError(f"party {self.party!r} returned {reply.n_values} candidate sums, expected {total}")
        for stage in ("histogram", "candidates", "compress", "rerandomize", "rerandomize_bg"):
            v = reply.compute_us.get(stage, 0)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                self.channel.current.timing.add(stage, v / 1e6)
        g, h = self.channel.decode(reply.values.values, total) if total else (np.zeros((0, 1)), np.zeros((0, 1)))
        precision = self.channel.current.layout.precision_bits
        group = self.channel.current.group_size
        cat_offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
        out, pos, mpos = [], 0, 0
        for i, t in enumerate(np.asarray(tree_idx, dtype=np.int64).tolist()):
            k, tgt = int(n_cand[i]), t % group
            gl = decode_fixed(g[pos:pos + k, tgt], precision)
            hl = decode_fixed(h[pos:pos + k, tgt], precision)
            cg = decode_fixed(g[pos + k:pos + k + per_node_cat, tgt], precision)
            ch = decode_fixed(h[pos + k:pos + k + per_node_cat, tgt], precision)
            out.append(NodeCandidates(np.asarray(gl, dtype=np.float64), np.asarray(hl, dtype=np.float64),
                                      mono[mpos:mpos + k] if len(mono) else None, tuple(cats), cat_offsets,
                                      np.asarray(cg, dtype=np.float64), np.asarray(ch, dtype=np.float64)))
            pos += k + per_node_cat
            mpos += k
        return out

    def split(self, round_idx, tree_idx, node_ids, feature_idx, bin_idx, default_left, assignment,
              categories=None, picks=None):
        if picks is not None:
            return self._pick(round_idx, tree_idx, node_ids, picks)
        categories = [None] * len(node_ids) if categories is None else list(categories)
        n_left = np.array([-1 if c is None else len(c) for c in categories], dtype=np.int32)
        left_bins = np.array([b for c in categories if c is not None for b in c], dtype=np.int32)
        with self.channel.waiting():
            reply = self.transport.call(self.party, m.SplitRequest(
                round_idx, node_ids, tree_idx, feature_idx, bin_idx, default_left, n_left, left_bins))
        return self._refs(reply, node_ids)

    def _pick(self, round_idx, tree_idx, node_ids, picks) -> list:
        """Name each chosen split by the positions of its best candidates (or a categorical split)."""
        positions = [b.positions if b.positions is not None and (b.categories is None or b.tie_with_categorical)
                     else () for b in picks]
        cat = [b.categories is not None for b in picks]
        with self.channel.waiting():
            reply = self.transport.call(self.party, m.CandidatePick(
                round_idx, np.asarray(node_ids, np.int32), np.asarray(tree_idx, np.int32),
                np.array([len(p) for p in positions], dtype=np.int32),
                np.array([x for p in positions for x in p], dtype=np.int32),
                np.array([b.feature_idx if c else -1 for b, c in zip(picks, cat)], dtype=np.int32),
                np.array([bool(b.default_left) for b in picks], dtype=bool),
                np.array([len(b.categories) if c else -1 for b, c in zip(picks, cat)], dtype=np.int32),
                np.array([x for b, c in zip(picks, cat) if c for x in b.categories], dtype=np.int32)))
        return self._refs(reply, node_ids)

    def _refs(self, reply, node_ids) -> list:
        if len(reply.record_ids) != len(node_ids) or len(reply.n_rows) != len(node_ids) \
                or int(reply.n_rows.sum()) != len(reply.go_left):
            raise PeerError(f"party {self.party!r} sent a malformed split response")
        out, start = [], 0
        for rid, cnt in zip(reply.record_ids.tolist(), reply.n_rows.tolist()):
            out.append((SplitRef(self.party, record_id=int(rid)), reply.go_left[start:start + cnt]))
            start += cnt
        return out


def source_map(transport, sources: list):
    """A threaded ``map(fn, sources)`` for the booster, or None (sequential)."""
    remote = [s for s in sources if isinstance(s, RemoteSource)]
    if not getattr(transport, "concurrent", False) or len(remote) < 2:
        return None

    def thread_map(fn, items):
        with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="vfl-fanout") as pool:
            return list(pool.map(fn, items))

    return thread_map


def leaf_mask_fetcher(transport: Transport, session_id: str):
    """``fetch_masks(owner, skeleton)`` for :meth:`vfl.core.model.BoostedModel.predict_raw_one_round`:
    one ``LeafMaskRequest`` of a prediction (or validation) session to the owner (the transport
    checks that the reply is a ``LeafMaskResponse``)."""
    def fetch_masks(owner, skeleton):
        return transport.call(owner, m.LeafMaskRequest(session_id, **skeleton.to_fields())).masks
    return fetch_masks


def end_prediction(transport: Transport, passives: list[str], session_id: str) -> None:
    """Tell every passive party that prediction session ``session_id`` is over (best effort: a
    party that cannot be told forgets the session when it is evicted as idle)."""
    for p in passives:
        try:
            transport.call(p, m.PredictEnd(session_id))
        except VFLError as exc:
            log.info("could not end prediction session %s at party %r: %s", session_id, p, exc)
