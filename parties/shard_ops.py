"""Worker operations over a passive party's own data, run where its row shards live (issue 11).

The ``ext`` operation of :mod:`crypto.worker` runs these (``module="parties.shard_ops"``, ``fn``
one of :data:`WORKER_OPS`), in a :class:`~crypto.executor.LocalExecutor` worker process, on a Dask
worker, or in the driver for an :class:`~crypto.executor.InlineExecutor`; the driver side is
:class:`ShardReader`. Every request is the party's own (its cluster is private to it). What a
shard's worker holds, in slots named by the shard:

* ``x:k``: the raw features of shard ``k``'s aligned rows, read from the Parquet pieces holding
  them (``read``), kept only until binned;
* ``bins:k``: their bins (``bin``), used by the histograms (:mod:`crypto.shards`) and the split
  rule (``go_left``).

``summarize`` and ``edge_query`` are the shard side of :func:`vfl.core.sharded_binning.fit_sharded_binner`
(the driver merges the per-shard :class:`~vfl.core.bin_summaries.ColumnSummary`s; no column is gathered).
A bad value in a piece is answered as ``{"input_error": message}`` (the file and column named),
which the driver raises as an :class:`~datasets.errors.InputError`.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from datasets.errors import InputError
from datasets.pieces import read_rows
from vfl.core.bin_summaries import DEFAULT_SUMMARY_POINTS, ColumnSummary, summarize_shard
from vfl.core.binning import Binner
from vfl.core.sharded_binning import DEFAULT_BRACKET_POINTS, answer_edge_query, fit_sharded_binner
from vfl.core.split import goes_left

MODULE = "parties.shard_ops"


# --- worker side ------------------------------------------------------------------
def _input_errors(fn):
    def wrapped(req, blobs, st):
        try:
            return fn(req, blobs, st)
        except InputError as exc:
            return {"input_error": str(exc)}, []
    wrapped.__name__ = fn.__name__
    return wrapped


@_input_errors
def _read(req, blobs, st):
    rows = np.frombuffer(blobs[0], dtype=np.int64)
    st[req["slot"]] = read_rows(req["source"], rows)
    return {"rows": int(len(rows))}, []


def _summaries_to_frame(summaries: list[ColumnSummary]) -> tuple[dict, list[bytes]]:
    header = {"exact": [s.exact for s in summaries], "n_missing": [s.n_missing for s in summaries],
              "sizes": [len(s.values) for s in summaries]}
    values = np.concatenate([s.values for s in summaries]) if summaries else np.zeros(0)
    counts = np.concatenate([s.counts for s in summaries]) if summaries else np.zeros(0, dtype=np.int64)
    return header, [values.astype(np.float64).tobytes(), counts.astype(np.int64).tobytes()]


def _summaries_from_frame(header: dict, blobs) -> list[ColumnSummary]:
    values = np.frombuffer(blobs[0], dtype=np.float64)
    counts = np.frombuffer(blobs[1], dtype=np.int64)
    ends = np.cumsum(header["sizes"], dtype=np.int64)
    out, a = [], 0
    for e, exact, miss in zip(ends.tolist(), header["exact"], header["n_missing"]):
        out.append(ColumnSummary(values[a:e].copy(), counts[a:e].copy(), exact, miss))
        a = e
    return out


def _summarize(req, blobs, st):
    return _summaries_to_frame(summarize_shard(st[req["slot"]], int(req["max_points"])))


def _edge_query(req, blobs, st):
    query = {int(j): np.asarray(b, dtype=np.float64).reshape(-1, 2) for j, b in req["query"].items()}
    answers = answer_edge_query(st[req["slot"]], query, int(req["bracket_points"]))
    out = {str(j): [[below, s.values.tolist(), s.counts.tolist(), s.exact] for below, s in got]
           for j, got in answers.items()}
    return {}, [json.dumps(out).encode()]


def _bin(req, blobs, st):
    binner = Binner(int(req["max_bin"]))
    binner.thresholds_ = [np.asarray(t, dtype=np.float64) for t in req["thresholds"]]
    X = st.pop(req["x"])
    st[req["slot"]] = binner.transform(X)
    return {}, []


def _go_left(req, blobs, st):
    """The split rule (:func:`vfl.core.split.goes_left`) on the shard's bins for each node's rows."""
    bins = st[req["slot"]]
    out = []
    for (f, b, dl, missing, cats), blob in zip(req["nodes"], blobs):
        rows = np.frombuffer(blob, dtype=np.int64)
        col = bins[rows, int(f)].astype(np.int64)
        out.append(goes_left(col, int(b), bool(dl), missing=col == int(missing), categories=cats))
    flat = np.concatenate(out) if out else np.zeros(0, dtype=bool)
    return {"n": int(len(flat))}, [np.packbits(flat.astype(np.uint8)).tobytes()]


def _bin_counts(req, blobs, st):
    """Rows per (feature, bin) slot of each node's rows on this shard (flat, ``n_bins`` per feature)."""
    bins = st[req["slot"]]
    n_bins = [int(x) for x in req["n_bins"]]
    out = []
    for blob in blobs:
        rows = np.frombuffer(blob, dtype=np.int64)
        out.append(np.concatenate([np.bincount(bins[rows, f].astype(np.intp), minlength=nb)[:nb]
                                   for f, nb in enumerate(n_bins)]).astype(np.int64))
    return {}, [np.concatenate(out).tobytes() if out else b""]


_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def row_fingerprint(X: np.ndarray, first: int) -> list[int]:
    """Two 64-bit sums over the rows of ``X`` (aligned rows ``first, first + 1, ...``) of a mix of
    each row's float64 bits and its aligned position: order-sensitive, and the sums of the shards
    add up to the whole table's whatever the shard layout (a fingerprint, not a cryptographic
    hash: it detects changed data on resume)."""
    bits = np.ascontiguousarray(X, dtype=np.float64).view(np.uint64)
    out = []
    for seed in (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03)):
        with np.errstate(over="ignore"):
            h = _mix(np.arange(first, first + len(bits), dtype=np.uint64) + seed)
            for j in range(bits.shape[1]):
                h = _mix(h ^ (bits[:, j] + np.uint64(j) * seed))
        out.append(int(h.sum(dtype=np.uint64)))
    return out


def _fingerprint(req, blobs, st):
    return {"sums": row_fingerprint(st[req["slot"]], int(req["first"]))}, []


#: the operations ``crypto.worker``'s ``ext`` runs for this module
WORKER_OPS = {"read": _read, "summarize": _summarize, "edge_query": _edge_query, "bin": _bin, "go_left": _go_left,
              "bin_counts": _bin_counts,
              "fingerprint": _fingerprint}


# --- driver side -------------------------------------------------------------------
def _request(fn: str, header: dict, blobs=()) -> tuple[dict, list[bytes]]:
    return dict(header, op="ext", module=MODULE, fn=fn), list(blobs)


class ShardReader:
    """The driver's requests over the shards of a :class:`crypto.shards.ShardSet` whose workers read
    a :class:`datasets.pieces.PieceTable` themselves: the bins are made where the rows are."""

    def __init__(self, shards, table, party: str):
        self.shards, self.table, self.party = shards, table, party

    def _run(self, reqs):
        self.shards.executor.allow(MODULE)        # this party hands its operations to the executor
        replies = self.shards.executor.run_on(reqs)
        for header, _ in replies:
            if "input_error" in header:
                raise InputError(header["input_error"])
        return replies

    def read(self, rows: np.ndarray) -> None:
        """Every shard's worker reads its aligned rows (``rows[a:b]``: table rows) from the pieces."""
        spec = self.table.spec()
        self._run([(self.shards.workers[k], _request("read", {"slot": self.shards.slot("x", k), "source": spec},
                                                     [np.ascontiguousarray(rows[a:b], dtype=np.int64).tobytes()]))
                   for k, (a, b) in enumerate(self.shards.bounds)])

    def _map(self, fn, *args):
        """``map_shards`` of :func:`vfl.core.sharded_binning.fit_sharded_binner`: the shard side on the workers."""
        k_all = range(len(self.shards))
        if fn is summarize_shard:
            (max_points,) = args
            reqs = [(self.shards.workers[k], _request("summarize", {"slot": self.shards.slot("x", k),
                                                                    "max_points": int(max_points)})) for k in k_all]
            return [_summaries_from_frame(h, b) for h, b in self._run(reqs)]
        if fn is answer_edge_query:
            query, bracket_points = args
            q = {str(j): np.asarray(b, dtype=np.float64).tolist() for j, b in query.items()}
            reqs = [(self.shards.workers[k], _request("edge_query", {"slot": self.shards.slot("x", k), "query": q,
                                                                     "bracket_points": int(bracket_points)}))
                    for k in k_all]
            out = []
            for _, blobs in self._run(reqs):
                raw = json.loads(blobs[0])
                out.append({int(j): [(int(below), ColumnSummary._trusted(np.asarray(v, dtype=np.float64),
                                                                         np.asarray(c, dtype=np.int64), bool(e)))
                                     for below, v, c, e in got] for j, got in raw.items()})
            return out
        raise ValueError(f"no worker operation for {fn!r}")

    def fit_binner(self, max_bin: int) -> Binner:
        """Binner's exact edges from per-shard summaries merged here (never a whole column)."""
        return fit_sharded_binner(range(len(self.shards)), max_bin, map_shards=self._map,
                                  max_points=DEFAULT_SUMMARY_POINTS, bracket_points=DEFAULT_BRACKET_POINTS)

    def fingerprint(self) -> str:
        """The fingerprint of the aligned rows' features (:func:`row_fingerprint`, summed over the
        shards) with the feature names: what a resumed training checks it sees the same data by."""
        replies = self._run([(self.shards.workers[k], _request("fingerprint", {"slot": self.shards.slot("x", k),
                                                                               "first": a}))
                             for k, (a, _) in enumerate(self.shards.bounds)])
        sums = [sum(int(h["sums"][i]) for h, _ in replies) % (1 << 64) for i in range(2)]
        h = hashlib.sha256(json.dumps(list(self.table.feature_names)).encode())
        h.update(f"{self.shards.n_rows}:{sums[0]:016x}{sums[1]:016x}".encode())
        return "rows-" + h.hexdigest()

    def bin(self, binner: Binner) -> None:
        """Every shard's raw rows become its ``bins:k`` (the raw rows are dropped)."""
        th = [np.asarray(t, dtype=np.float64).tolist() for t in binner.thresholds_]
        self._run([(self.shards.workers[k], _request("bin", {"x": self.shards.slot("x", k),
                                                             "slot": self.shards.slot("bins", k),
                                                             "max_bin": binner.max_bin, "thresholds": th}))
                   for k in range(len(self.shards))])

    def go_left(self, nodes: list[tuple], members: list[np.ndarray]) -> list[np.ndarray]:
        """Per node ``(feature, bin, default_left, missing bin, categories or None)`` the split rule on
        its rows ``members[i]`` (increasing aligned rows), from the bins on the shards' workers."""
        bounds = self.shards.bounds
        cuts = [np.searchsorted(rows, [a for a, _ in bounds] + [bounds[-1][1]]) for rows in members]
        reqs, layout = [], []
        for k, (a, b) in enumerate(bounds):
            blobs, hdr, sizes = [], [], []
            for i, rows in enumerate(members):
                part = rows[cuts[i][k]:cuts[i][k + 1]]
                if len(part):
                    hdr.append(list(nodes[i]))
                    blobs.append((np.asarray(part, dtype=np.int64) - a).tobytes())
                    sizes.append((i, len(part)))
            if sizes:
                reqs.append((self.shards.workers[k], _request("go_left", {"slot": self.shards.slot("bins", k),
                                                                          "nodes": hdr}, blobs)))
                layout.append(sizes)
        parts: list[list[np.ndarray]] = [[] for _ in members]
        for sizes, (header, blobs) in zip(layout, self._run(reqs)):
            flat = np.unpackbits(np.frombuffer(blobs[0], dtype=np.uint8))[:int(header["n"])].astype(bool)
            pos = 0
            for i, n in sizes:
                parts[i].append(flat[pos:pos + n])
                pos += n
        return [np.concatenate(p) if p else np.zeros(0, dtype=bool) for p in parts]

    def bin_counts(self, members: list[np.ndarray], n_bins) -> np.ndarray:
        """Rows per flat (feature, bin) slot of each node (its rows ``members[i]``, increasing aligned
        rows), summed over the shards: ``(len(members), sum(n_bins))`` int64."""
        n_bins = [int(x) for x in n_bins]
        total = sum(n_bins)
        out = np.zeros((len(members), total), dtype=np.int64)
        bounds = self.shards.bounds
        cuts = [np.searchsorted(rows, [a for a, _ in bounds] + [bounds[-1][1]]) for rows in members]
        reqs = []
        for k, (a, _) in enumerate(bounds):
            blobs = [(np.asarray(rows[cuts[i][k]:cuts[i][k + 1]], dtype=np.int64) - a).tobytes()
                     for i, rows in enumerate(members)]
            reqs.append((self.shards.workers[k], _request("bin_counts", {"slot": self.shards.slot("bins", k),
                                                                         "n_bins": n_bins}, blobs)))
        for _, blobs in self._run(reqs):
            out += np.frombuffer(blobs[0], dtype=np.int64).reshape(len(members), total)
        return out
