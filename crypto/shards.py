"""Row shards that stay put on an executor's workers (issue 11).

After alignment a party's rows are cut into contiguous **shards** (a few per
worker, :func:`plan_shards`); shard ``k`` lives on worker ``k % n_workers`` for
the whole training, in named slots of that worker (:mod:`crypto.worker`):

* passive party: ``bins:k`` (the shard's binned features) and ``grad:k`` (the
  round's gradient values of the shard's rows, filled piece by piece from the
  gradient stream: :class:`ShardedGradients`);
* active party: ``ct:j:k`` (target group ``j``'s packed and, in mode ``he``,
  encrypted gradients of shard ``k``): :class:`ShardedEncryption`.

Per tree level only the node of every row goes to the workers, bit-packed
(:func:`pack_codes`, a few bits per row); each shard answers with its partial
histogram of the nodes being built, one task per worker and level over all its
shards (``shards_hist``: the worker sums its shards' partials), and the workers'
partials are summed homomorphically by :meth:`crypto.executor.Executor.reduce_on`
(in slices on the workers, issue 24). Neither the driver of the passive party nor
that of the active party ever holds a round's whole gradient vector: the active
driver holds the stream's window of shards (:class:`EncryptionStream`), the
passive driver forwards each message's bytes to the workers holding those rows
and keeps none beyond its intake's budget.

Everything here is plain data over an :class:`crypto.executor.Executor`; the
kernels themselves are :func:`crypto.histogram.block_sums` and
:func:`crypto.compress.direct_block`.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from crypto.compress import stride_for
from crypto.intcodec import bytes_to_ints, int_width
from datasets.errors import ProtocolError

#: shards per worker (a few: a slow or busy worker holds back less of a level)
SHARDS_PER_WORKER = 2
#: rows below which a shard is not cut further
MIN_SHARD_ROWS = 256
#: with overlap a round's rows are cut into at least this many shards (of at least MIN_SHARD_ROWS
#: rows): the active party encrypts shard k + 1 while shard k is on the wire and the passive party
#: sums the root level of the shards already in (issue 12)
STREAM_SHARDS = 8
#: a streamed gradient shard message carries at least this many bytes (unless the frame cap is
#: lower): every message costs a round trip, which on a slow link must stay small next to its bytes
MIN_STREAM_SHARD_BYTES = 1 << 20
#: ... and at most this many (issue 11): the drivers hold a bounded number of messages (the active
#: party's stream its window, the passive party's intake its budget; issue 24), so capping a
#: message keeps both drivers' memory flat in the number of rows; more rows, more messages
MAX_STREAM_SHARD_BYTES = 16 << 20


def stream_rows(n_rows: int, n_workers: int = 1, bytes_per_row: int = 0) -> int:
    """The most rows of one shard when the round overlaps: at least :data:`STREAM_SHARDS` pieces,
    and four per worker (a wave of shards, one per worker, is then a quarter of the round), but
    with ``bytes_per_row`` (gradient messages) no message under :data:`MIN_STREAM_SHARD_BYTES`
    nor over :data:`MAX_STREAM_SHARD_BYTES` (a large round is cut into more messages)."""
    rows = max(MIN_SHARD_ROWS, -(-int(n_rows) // max(STREAM_SHARDS, 4 * max(1, int(n_workers)))))
    if bytes_per_row > 0:
        rows = max(rows, -(-MIN_STREAM_SHARD_BYTES // int(bytes_per_row)))
        rows = min(rows, max(1, MAX_STREAM_SHARD_BYTES // int(bytes_per_row)))
    return rows


def plan_shards(n_rows: int, n_workers: int, max_rows: int | None = None) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` row ranges: ``SHARDS_PER_WORKER`` per worker (fewer for few
    rows), never more than ``max_rows`` rows each."""
    n_rows, n_workers = int(n_rows), max(1, int(n_workers))
    k = max(1, min(SHARDS_PER_WORKER * n_workers, -(-n_rows // MIN_SHARD_ROWS)))
    if max_rows is not None and max_rows >= 1:
        k = max(k, -(-n_rows // int(max_rows)))
    k = max(1, min(k, n_rows)) if n_rows else 1
    bounds = np.linspace(0, n_rows, k + 1).round().astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def plain_width(value_bits: int, per: int) -> int:
    """Bytes of one signed plaintext value or sum in mode ``plain`` (packed values, their
    pre-shifted copies, bin sums and compressed sums all fit ``value_bits * per`` bits)."""
    return (int(value_bits) * max(1, int(per)) + 16) // 8 + 1


def value_width(modulus, value_bits: int, per: int) -> tuple[int, bool]:
    """``(bytes, signed)`` of the values of a round: ciphertexts mod ``modulus`` or plaintexts."""
    if modulus is not None:
        return int_width(modulus), False
    return plain_width(value_bits, per), True


# --- the node assignment, bit-packed -------------------------------------------
def pack_codes(codes: np.ndarray, n_codes: int) -> tuple[int, bytes]:
    """Small non-negative integers ``codes < n_codes`` as ``(bits, bytes)``: ``bits`` bit
    planes of ``np.packbits`` each (so 3 nodes of a level cost 2 bits per row)."""
    codes = np.asarray(codes, dtype=np.int64)
    bits = max(1, int(n_codes - 1).bit_length())
    planes = [np.packbits(((codes >> b) & 1).astype(np.uint8)) for b in range(bits)]
    return bits, b"".join(p.tobytes() for p in planes)


def unpack_codes(data: bytes, bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_codes` for ``n`` codes."""
    plane = (n + 7) // 8
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size != bits * plane:
        raise ValueError(f"{raw.size} bytes do not hold {bits} bit planes of {n} codes")
    codes = np.zeros(n, dtype=np.int64)
    for b in range(bits):
        codes |= np.unpackbits(raw[b * plane:(b + 1) * plane])[:n].astype(np.int64) << b
    return codes


def level_codes(assignment: np.ndarray, tree_idx: Sequence[int], node_ids: Sequence[int]):
    """Per tree of a request: which node being built (1-based position among that tree's
    nodes, 0: none) each row is at; returns ``(trees, codes (len(trees), n), nodes)`` with
    ``nodes[i] = (tree position, code)`` of request node ``i``."""
    trees = sorted({int(t) for t in tree_idx})
    pos = {t: p for p, t in enumerate(trees)}
    n = assignment.shape[1]
    codes = np.zeros((len(trees), n), dtype=np.int64)
    counts = [0] * len(trees)
    nodes = []
    for t, nid in zip(tree_idx, node_ids):
        p = pos[int(t)]
        counts[p] += 1
        codes[p][assignment[int(t)] == int(nid)] = counts[p]
        nodes.append((p, counts[p]))
    return trees, codes, nodes, counts


# --- the passive party's side ----------------------------------------------------
@dataclass(eq=False)
class ShardedGradients:
    """A round's gradients as received: only metadata and which rows arrived; the values
    themselves are in the workers' ``grad:k`` slots."""
    round_idx: int
    encrypted: bool
    layout: object                 # crypto.packing.PackingLayout
    per: int                       # values per output ciphertext
    shifts: int                    # 1, or ``per`` pre-shifted copies per row
    groups: int                    # target groups (one block of values each)
    width: int                     # bytes per value
    signed: bool
    received: np.ndarray = field(default=None)    # bool per row

    def complete(self) -> bool:
        return bool(self.received.all())


class ShardSet:
    """A party's row shards on an executor: where each lives, and the requests over them."""

    def __init__(self, executor, n_rows: int, max_rows: int | None = None, prefix: str = "",
                 bounds: Sequence[tuple[int, int]] | None = None):
        self.executor = executor
        self.n_rows = int(n_rows)
        self.bounds = plan_shards(n_rows, executor.n_workers, max_rows) if bounds is None else \
            [(int(a), int(b)) for a, b in bounds]
        self.workers = [k % executor.n_workers for k in range(len(self.bounds))]
        self.prefix = prefix
        self.starts = np.array([a for a, _ in self.bounds] + [self.n_rows], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.bounds)

    def slot(self, name: str, k: int) -> str:
        return f"{self.prefix}{name}:{k}"

    def place_array(self, name: str, arr: np.ndarray) -> None:
        """Cut ``arr`` (one row per row of the party) by shard into slot ``name:k`` of each shard's
        worker (e.g. the passive party's bins)."""
        arr = np.ascontiguousarray(arr)
        reqs = []
        for k, (a, b) in enumerate(self.bounds):
            part = np.ascontiguousarray(arr[a:b])
            reqs.append((self.workers[k], ({"op": "put", "kind": "array", "slot": self.slot(name, k),
                                            "dtype": part.dtype.str, "shape": list(part.shape)},
                                           [part.tobytes()])))
        self.executor.run_on(reqs)

    def pieces(self, start: int, stop: int):
        """The shards a row range ``[start, stop)`` touches: ``(k, a, b)`` with ``[a, b)`` the
        rows of shard ``k`` in it."""
        k0 = int(np.searchsorted(self.starts, start, side="right")) - 1
        out = []
        for k in range(max(k0, 0), len(self.bounds)):
            a, b = self.bounds[k]
            if a >= stop:
                break
            lo, hi = max(a, start), min(b, stop)
            if lo < hi:
                out.append((k, lo, hi))
        return out

    def forward(self, g: ShardedGradients, start: int, stop: int, data: bytes, modulus_hex: str | None) -> None:
        """One gradient shard message (rows ``[start, stop)``, values ordered (group, shift, row))
        into the ``grad:k`` slots of the workers holding those rows; the driver keeps none."""
        self.accept(g, start, stop, data)
        self.fill(g, start, stop, data, modulus_hex)

    def accept(self, g: ShardedGradients, start: int, stop: int, data: bytes) -> None:
        """Check a gradient shard message's size and rows (not yet received this round) and mark
        its rows received (:meth:`fill` then writes its values to the workers)."""
        blocks = g.groups * g.shifts
        m = stop - start
        w = g.width
        if len(data) != blocks * m * w:
            raise ProtocolError(f"gradient shard of rows {start}:{stop} has {len(data)} bytes, expected "
                                f"{blocks * m * w} ({blocks} block(s) of {m} values of {w} bytes)")
        if not 0 <= start < stop <= self.n_rows:
            raise ProtocolError(f"gradient shard rows {start}:{stop} are outside the {self.n_rows} samples")
        if g.received[start:stop].any():
            raise ProtocolError(f"gradient shard rows {start}:{stop} were already received this round")
        g.received[start:stop] = True

    def fill(self, g: ShardedGradients, start: int, stop: int, data: bytes, modulus_hex: str | None) -> list[int]:
        """Write an accepted gradient shard message's values into the ``grad:k`` slots of the
        workers holding those rows; returns the shards it touched."""
        self.submit_fill(g, start, stop, data, modulus_hex).result()
        return [k for k, _, _ in self.pieces(start, stop)]

    def submit_fill(self, g: ShardedGradients, start: int, stop: int, data: bytes, modulus_hex: str | None):
        """:meth:`fill` started on the workers (:meth:`crypto.executor.Executor.submit_on`): a
        worker writes the values before it runs any request sent to it later (e.g. the shard's root
        partial)."""
        blocks = g.groups * g.shifts
        m = stop - start
        w = g.width
        view = memoryview(data)
        reqs = []
        for k, lo, hi in self.pieces(start, stop):
            a, b = self.bounds[k]
            nk = b - a
            segs, parts = [], []
            for blk in range(blocks):
                src = (blk * m + (lo - start)) * w
                parts.append(view[src:src + (hi - lo) * w])
                segs.append([blk * nk + (lo - a), hi - lo])
            reqs.append((self.workers[k], ({"op": "fill", "slot": self.slot("grad", k), "size": blocks * nk,
                                            "width": w, "signed": g.signed, "segments": segs,
                                            "modulus": modulus_hex, "round": g.round_idx},
                                           [b"".join(parts)])))
        return self.executor.submit_on(reqs)

    def histograms(self, g: ShardedGradients, assignment: np.ndarray, tree_idx, node_ids, n_bins: Sequence[int],
                   modulus, joint="auto") -> tuple[list, dict]:
        """The request's histograms summed over every shard (one task per shard, partials summed in
        a tree reduction): for ``shifts == 1`` the flat bin sums of each node (node-major), else the
        compressed output (``per`` bin sums per value, node ``i`` at slot ``i * total``)."""
        trees, codes, nodes, counts = level_codes(assignment, tree_idx, node_ids)
        tree_idx = np.asarray(tree_idx, dtype=np.int64)
        group = (tree_idx // g.layout.n_targets).tolist() if g.groups > 1 else [0] * len(nodes)
        mhex = format(int(modulus), "x") if modulus is not None else None
        total = int(sum(n_bins))
        # shifts == 1: flat bin sums; else ``stride`` accumulators per output ciphertext (1: the outputs)
        n_out = len(nodes) * total if g.shifts == 1 else -(-total * len(nodes) // g.per) * stride_for(g.per, g.shifts)
        width, signed = (g.width, g.signed)
        bits = [max(1, int(counts[p]).bit_length()) for p in range(len(trees))]
        parts: dict[int, tuple[list, list]] = {}       # worker -> (its shards, their code blobs)
        for k, (a, b) in enumerate(self.bounds):
            shards, blobs = parts.setdefault(self.workers[k], ([], []))
            shards.append({"bins": self.slot("bins", k), "values": self.slot("grad", k), "n_rows": b - a})
            for p in range(len(trees)):
                blobs.append(pack_codes(codes[p, a:b], counts[p] + 1)[1])
        # one task per worker over all its shards (summed there): the reduction sums one partial
        # per worker, not one per shard
        reqs = [(wi, ({"op": "shards_hist", "parts": shards, "bits": bits,
                       "nodes": [[p, c, j] for (p, c), j in zip(nodes, group)],
                       "groups": g.groups, "shifts": g.shifts, "per": g.per,
                       "n_bins": [int(x) for x in n_bins], "modulus": mhex,
                       "width": width, "signed": signed, "joint": joint, "n_out": n_out}, blobs))
                for wi, (shards, blobs) in sorted(parts.items())]
        header, blobs = self.executor.reduce_on(reqs, {"op": "combine", "modulus": mhex, "width": width,
                                                       "signed": signed})
        return bytes_to_ints(blobs[0], width, signed), header

    # -- the root level while the gradients arrive (overlap, issue 12) ---------------------
    def root_partial(self, g: ShardedGradients, k: int, n_bins: Sequence[int], modulus, joint="auto",
                     n_nodes: int | None = None) -> np.ndarray:
        """Shard ``k``'s partial root histogram over *all* its rows, kept in slot ``root:k`` of its
        worker (:meth:`root_histograms` sums them), computed as soon as the shard's gradient values
        are in. Rows no tree of the round samples carry placeholders that add nothing (``1`` for
        ciphertexts, ``0`` in mode ``plain``), so over all rows is over the sampled ones; the reply
        says which rows hold such an identity value (``(groups, rows of k)`` bools), so the caller
        can check that a request's root really is "every row that carries a value".

        One partial per target group (``shifts == 1``: node ``j`` of the output is group ``j``'s
        sums, whichever trees ask for it); with pre-shifted copies the compressed output slots
        depend on each node's position in the request, so the partial is for the ``n_nodes`` root
        nodes ``(tree t, node 0)``, ``t = 0 .. n_nodes - 1`` in that order."""
        return self.root_ident(g, k, self.submit_root_partial(g, k, n_bins, modulus, joint, n_nodes).result())

    def submit_root_partial(self, g: ShardedGradients, k: int, n_bins: Sequence[int], modulus, joint="auto",
                            n_nodes: int | None = None):
        """:meth:`root_partial` started on shard ``k``'s worker (after any fill sent to it before);
        :meth:`root_ident` reads the reply."""
        a, b = self.bounds[k]
        n = b - a
        total = int(sum(n_bins))
        if g.shifts == 1:
            nodes = [[0, 1, j] for j in range(g.groups)]
            n_out = g.groups * total
        else:
            nodes = [[0, 1, (t // g.layout.n_targets) if g.groups > 1 else 0] for t in range(int(n_nodes))]
            n_out = -(-total * len(nodes) // g.per) * stride_for(g.per, g.shifts)
        bits, codes = pack_codes(np.ones(n, dtype=np.int64), 2)
        mhex = format(int(modulus), "x") if modulus is not None else None
        return self.executor.submit_on([(self.workers[k], (
            {"op": "root_partial", "bins": self.slot("bins", k), "values": self.slot("grad", k),
             "out": self.slot("root", k), "n_rows": n, "bits": [bits], "nodes": nodes, "groups": g.groups,
             "shifts": g.shifts, "per": g.per, "n_bins": [int(x) for x in n_bins], "modulus": mhex,
             "width": g.width, "signed": g.signed, "joint": joint, "n_out": n_out}, [codes]))])

    def root_ident(self, g: ShardedGradients, k: int, replies) -> np.ndarray:
        """Which rows of shard ``k`` hold an identity value, from a root partial's reply."""
        a, b = self.bounds[k]
        ((_, blobs),) = replies
        bits_ = np.unpackbits(np.frombuffer(blobs[0], dtype=np.uint8))[:g.groups * (b - a)]
        return bits_.reshape(g.groups, b - a).astype(bool)

    def root_histograms(self, g: ShardedGradients, node_groups: Sequence[int], n_bins: Sequence[int],
                        modulus) -> tuple[list, dict]:
        """The root request's histograms from the partials of :meth:`root_partial` (every shard's,
        summed in a tree reduction), in the layout :meth:`histograms` returns: ``node_groups[i]``
        is the target group of request node ``i`` (``shifts == 1``), or with pre-shifted copies
        the request is the ``n_nodes`` root nodes the partials were computed for."""
        mhex = format(int(modulus), "x") if modulus is not None else None
        slots: dict[int, list[str]] = {}
        for k in range(len(self.bounds)):
            slots.setdefault(self.workers[k], []).append(self.slot("root", k))
        reqs = [(wi, ({"op": "take", "slots": ss, "modulus": mhex, "width": g.width, "signed": g.signed}, ()))
                for wi, ss in sorted(slots.items())]       # one partial per worker (summed there)
        header, blobs = self.executor.reduce_on(reqs, {"op": "combine", "modulus": mhex, "width": g.width,
                                                       "signed": g.signed})
        sums = bytes_to_ints(blobs[0], g.width, g.signed)
        if g.shifts == 1:
            total = int(sum(n_bins))
            sums = [v for j in node_groups for v in sums[int(j) * total:(int(j) + 1) * total]]
        return sums, header

    def drop(self) -> None:
        """Forget every slot of these shards on every worker."""
        self.executor.drop(self.prefix)


# --- the active party's side -------------------------------------------------------
class ShardedEncryption:
    """One round's packed (and in mode ``he`` encrypted) gradients, in slots ``ct:j:k`` of the
    workers holding shard ``k``; streamed out shard by shard (:meth:`stream`)."""

    def __init__(self, shards: ShardSet, groups: int, shifts: int, width: int, signed: bool):
        self.shards, self.groups, self.shifts = shards, int(groups), int(shifts)
        self.width, self.signed = int(width), bool(signed)

    def fill(self, g_int: np.ndarray, h_int: np.ndarray, used: np.ndarray | None, layout: dict, group_size: int,
             encrypt: bool, value_bits: int, per: int | None = None) -> dict:
        """Pack (and encrypt) every shard on its worker: one task per shard and target group.
        Returns how many obfuscators came from the workers' stocks and how many were made on
        the spot (``{"from_stock", "on_spot"}``)."""
        reqs = []
        for k in range(len(self.shards)):
            reqs.extend(self.requests(k, g_int, h_int, used, layout, group_size, encrypt, value_bits, per))
        return stock_counts(self.shards.executor.run_on(reqs))

    def requests(self, k: int, g_int: np.ndarray, h_int: np.ndarray, used: np.ndarray | None, layout: dict,
                 group_size: int, encrypt: bool, value_bits: int, per: int | None = None) -> list:
        """The pinned ``pack_encrypt`` requests of shard ``k`` (one per target group)."""
        K = g_int.shape[1]
        G = int(group_size)
        a, b = self.shards.bounds[k]
        mask = None if used is None else np.ascontiguousarray(used[a:b], dtype=np.uint8)
        reqs = []
        for j, start in enumerate(range(0, K, G)):
            stop = min(K, start + G)
            gj = np.zeros((b - a, G), dtype=np.int64)
            hj = np.zeros((b - a, G), dtype=np.int64)
            gj[:, :stop - start], hj[:, :stop - start] = g_int[a:b, start:stop], h_int[a:b, start:stop]
            blobs = [gj.tobytes(), hj.tobytes()] + ([mask.tobytes()] if mask is not None else [])
            reqs.append((self.shards.workers[k], ({"op": "pack_encrypt", "slot": self.shards.slot(f"ct:{j}", k),
                                                   "n_rows": b - a, "group_size": G, "layout": layout,
                                                   "shifts": self.shifts, "value_bits": int(value_bits),
                                                   "stride": stride_for(per or self.shifts, self.shifts),
                                                   "encrypt": bool(encrypt), "encryptor": "encryptor",
                                                   "masked": mask is not None}, blobs)))
        return reqs

    def get_request(self, k: int):
        """The pinned request whose reply is shard ``k``'s values in message order."""
        slots = [self.shards.slot(f"ct:{j}", k) for j in range(self.groups)]
        return (self.shards.workers[k], ({"op": "get", "slots": slots, "width": self.width, "signed": self.signed},
                                         ()))

    def shard_bytes(self, k: int) -> bytes:
        """The values of shard ``k`` in message order (group, shift, row), fetched from its worker."""
        ((_, blobs),) = self.shards.executor.run_on([self.get_request(k)])
        return blobs[0]

    def stream(self):
        """``(start, stop, bytes)`` per shard, one at a time (the caller sends and drops each)."""
        for k, (a, b) in enumerate(self.shards.bounds):
            yield a, b, self.shard_bytes(k)


def stock_counts(replies) -> dict:
    """Obfuscators the ``pack_encrypt`` replies took from their workers' stocks and made on the spot."""
    return {k: sum(int(h.get(k, 0)) for h, _ in replies) for k in ("from_stock", "on_spot")}


#: bytes of encrypted shards the gradient stream may hold (in flight on the workers, or waiting for
#: their senders) beyond one per worker: the window is at least the number of workers, two per
#: worker when they fit (a worker then has its next shard queued while it encrypts one)
STREAM_WINDOW_BYTES = 256 << 20
#: encryption units per worker in a streamed round (a message groups consecutive units)
UNITS_PER_WORKER = 4


def stream_window(n_workers: int, shard_bytes: int) -> int:
    """Shards of a gradient stream in flight at once: ``2 * n_workers`` when they fit
    :data:`STREAM_WINDOW_BYTES`, never fewer than ``n_workers`` (each shard is at most one message,
    itself under the frame cap)."""
    w = max(1, int(n_workers))
    fit = STREAM_WINDOW_BYTES // max(1, int(shard_bytes))
    return max(w, min(2 * w, fit))


def stream_plan(n_rows: int, n_workers: int, message_rows: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """A streamed round's encryption units and messages: ``(unit bounds, messages)``, each message
    ``[k0, k1)`` a run of consecutive units. The messages are the shards of :func:`plan_shards`
    under ``message_rows`` (:func:`stream_rows`, the frame cap); each is cut into units of
    :data:`UNITS_PER_WORKER` per worker over the round (at least :data:`MIN_SHARD_ROWS` rows), so
    a message's byte floor (:data:`MIN_STREAM_SHARD_BYTES`) never leaves workers without work; the
    first message into one unit per worker (what the senders wait for before the stream flows)."""
    n_rows, w = int(n_rows), max(1, int(n_workers))
    per = max(MIN_SHARD_ROWS, -(-n_rows // (UNITS_PER_WORKER * w)))
    units, messages = [], []
    for i, (a, b) in enumerate(plan_shards(n_rows, n_workers, message_rows)):
        # the first message is spread over every worker: the senders wait for it alone
        rows = per if i else min(per, max(MIN_SHARD_ROWS, -(-(b - a) // w)))
        k = max(1, -(-(b - a) // rows))
        cuts = np.linspace(a, b, k + 1).round().astype(np.int64).tolist()
        k0 = len(units)
        units.extend((int(x), int(y)) for x, y in zip(cuts[:-1], cuts[1:]) if y > x)
        messages.append((k0, len(units)))
    return units, messages


class EncryptionStream:
    """One round's gradients encrypted shard by shard *while* they are sent (issues 12 and 24).

    A producer thread keeps a **window** of shards in flight on the workers (:func:`stream_window`:
    at least one per worker; each shard's ``pack_encrypt`` requests and the ``get`` of its bytes go
    to its worker in one :meth:`crypto.executor.Executor.submit_on`, and the worker runs them in
    order), collects them in row order as they finish, and the senders (one per passive party,
    :meth:`take`) put message ``m`` (the consecutive shards ``messages[m]``, default one shard per
    message) on the wire as soon as its shards are in. The producer runs at most ``window``
    shards ahead of the first shard of the leading sender's message, and keeps a shard's bytes
    only until every sender took it, and never more than ``window`` shards (a sender far behind,
    e.g. the second passive party of a sequential transport, fetches an evicted shard again from
    its worker's slot): the driver holds at most ``window`` shards, each under the frame cap.
    Every shard is encrypted once, whatever the number of senders.

    ``on_wait(seconds)`` hears the wall time during which at least one sender waited for an
    encryption: the encryption on the critical path (what neither the wire nor the passive
    parties hid). ``on_done(counts)`` is called (in the producer thread) once every shard is
    encrypted, with the integer fields of the ``pack_encrypt`` replies summed (e.g. where the
    obfuscators came from)."""

    def __init__(self, values: ShardedEncryption, job: tuple, consumers: int = 1, window: int | None = None,
                 on_wait=None, on_done=None, messages: Sequence[tuple[int, int]] | None = None):
        self.values = values
        self.job = job              # (g_int, h_int, used, layout, group_size, encrypt, value_bits, per)
        self.n = len(values.shards)
        self.messages = [(int(a), int(b)) for a, b in messages] if messages is not None else \
            [(k, k + 1) for k in range(self.n)]
        if [k for a, b in self.messages for k in range(a, b)] != list(range(self.n)):
            raise ValueError("the messages must cover the shards in order")
        self.n_workers = max(1, int(values.shards.executor.n_workers))
        if window is None:
            rows = max((b - a for a, b in values.shards.bounds), default=0)
            window = stream_window(self.n_workers, rows * values.groups * values.shifts * values.width)
        self.window = max(1, int(window))
        self.consumers = max(1, int(consumers))
        self.on_wait = on_wait
        self.on_done = on_done      # on_done(counts): every shard is encrypted (producer thread)
        self.counts: dict[str, int] = {}    # numeric fields of the pack_encrypt replies, summed
        self.cond = threading.Condition()
        self.done = 0               # shards 0 .. done - 1 are encrypted (collected in order)
        self.lead = 0               # the first shard of the furthest message a sender asked for
        self.buf: dict[int, bytes] = {}   # shard -> its bytes (until every sender took its message)
        self.left = [self.consumers] * len(self.messages)    # senders still to take each message
        self.error: BaseException | None = None
        self.cancelled = False
        self.waiting = 0
        self._wait_t0 = 0.0
        self.thread = threading.Thread(target=self._produce, name="vfl-encrypt-stream", daemon=True)
        self.thread.start()

    def _submit(self, k: int):
        reqs = self.values.requests(k, *self.job) + [self.values.get_request(k)]
        pending = self.values.shards.executor.submit_on(reqs)
        for fut in pending.futures:          # a finished shard wakes the producer
            fut.add_done_callback(self._wake)
        return pending

    def _wake(self, _fut=None) -> None:
        with self.cond:
            self.cond.notify_all()

    def _produce(self) -> None:
        inflight: deque = deque()       # (shard, Pending), in row order
        k = 0
        try:
            while k < self.n or inflight:
                with self.cond:
                    while True:
                        if self.cancelled:
                            return
                        room = k < self.n and k < self.lead + self.window
                        # with no room the head shard is all there is to wait for: wait in its result(),
                        # which notices a lost worker (its pinned tasks are never done: issue 36, item 3)
                        ready = bool(inflight) and (inflight[0][1].done() or not room)
                        if ready or room:
                            break
                        self.cond.wait()
                if ready:
                    kk, pending = inflight.popleft()
                    replies = pending.result()
                    for header, _ in replies[:-1]:
                        for key, v in header.items():
                            if key != "cpu" and isinstance(v, int) and not isinstance(v, bool):
                                self.counts[key] = self.counts.get(key, 0) + v
                    with self.cond:
                        self.buf[kk] = replies[-1][1][0]
                        replies = pending = None
                        self.done = kk + 1
                        held = sorted(self.buf)
                        for old in held[:max(0, len(held) - self.window)]:
                            del self.buf[old]          # a sender far behind fetches it again
                        self.cond.notify_all()
                else:
                    inflight.append((k, self._submit(k)))
                    k += 1
            if self.on_done is not None:
                self.on_done(dict(self.counts))
        except BaseException as exc:       # handed to the senders
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def _message_bytes(self, parts: list[bytes], shards: Sequence[int]) -> bytes:
        """The message of consecutive shards: their values ordered (group, shift, row)."""
        if len(parts) == 1:
            return parts[0]
        blocks = self.values.groups * self.values.shifts
        if blocks == 1:
            return b"".join(parts)
        w = self.values.width
        sizes = [(b - a) * w for a, b in (self.values.shards.bounds[k] for k in shards)]
        return b"".join(bytes(memoryview(p)[blk * size:(blk + 1) * size])
                        for blk in range(blocks) for p, size in zip(parts, sizes))

    def take(self, m: int) -> bytes:
        """Message ``m``'s values in message order (waits for its shards' encryption)."""
        k0, k1 = self.messages[m]
        with self.cond:
            if k0 > self.lead:
                self.lead = k0
                self.cond.notify_all()
            if self.done < k1 and self.error is None and not self.cancelled:
                if self.waiting == 0:
                    self._wait_t0 = time.perf_counter()
                self.waiting += 1
                try:
                    while self.done < k1 and self.error is None and not self.cancelled:
                        self.cond.wait()
                finally:
                    self.waiting -= 1
                    if self.waiting == 0 and self.on_wait is not None:
                        self.on_wait(time.perf_counter() - self._wait_t0)
            if self.error is not None:
                raise self.error
            if self.cancelled:
                raise RuntimeError("the round's gradient stream was cancelled")
            parts = [self.buf.get(k) for k in range(k0, k1)]
            self.left[m] -= 1
            if self.left[m] <= 0:
                for k in range(k0, k1):
                    self.buf.pop(k, None)
                self.cond.notify_all()
        parts = [p if p is not None else self.values.shard_bytes(k) for k, p in zip(range(k0, k1), parts)]
        return self._message_bytes(parts, range(k0, k1))

    def close(self) -> None:
        """Stop producing (the round is over or abandoned) and wait for the producer."""
        with self.cond:
            self.cancelled = True
            self.buf.clear()
            self.cond.notify_all()
        if self.thread is not threading.current_thread():
            self.thread.join()
