"""One-round batch prediction with leaf masks: the tree logic (no transport, no parties).

For a batch of rows, a party that knows each tree's *skeleton* (the children of
every node) and can decide its own nodes computes, per row and tree, the set
of leaves the row can still reach: at its own nodes the row follows its
decision, at any other node both children stay open. Every party sends these
sets as bitmasks (``np.packbits`` over the tree's leaves in node-id order) in
one message; the active party ANDs them with its own and obtains exactly one
leaf per row and tree, because every internal node is decided by exactly one
party. The number of round trips no longer grows with the depth.

Leakage: a mask reveals the sender's decision at *all* of its nodes for every
row (the set of reachable leaves determines it), not only at the nodes on the
row's actual path, as node-by-node routing does. In exchange the passive party
learns nothing about the rows' paths (node-by-node routing tells it which rows
reach each of its nodes, hence other parties' decisions above them).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from datasets.errors import PeerError, ProtocolError
from vfl.core.params import DEFAULT_PREDICTION as DEFAULT_PREDICTION  # re-exported: the vocabulary
from vfl.core.params import PREDICTIONS as PREDICTIONS  # lives in vfl.core.params (enum Prediction)
from vfl.core.tree import Tree


@dataclass
class Skeleton:
    """The trees as one receiving party sees them: shapes, and record ids at its own nodes.

    Arrays are concatenated over trees; ``left``/``right`` are node ids local to
    each tree (-1 at leaves), ``record_ids`` is the receiver's record id at its
    own nodes and -1 elsewhere. Nothing else: no threshold, no leaf value, no
    owner of any other node.
    """
    tree_sizes: np.ndarray    # int32 (n_trees,)
    left: np.ndarray          # int32 (total nodes,)
    right: np.ndarray         # int32
    record_ids: np.ndarray    # int64

    @property
    def n_trees(self) -> int:
        return len(self.tree_sizes)

    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.tree_sizes, dtype=np.int64)])

    def n_leaves(self) -> np.ndarray:
        off = self.offsets()
        leaf = self.left < 0
        return np.array([int(leaf[off[t]:off[t + 1]].sum()) for t in range(self.n_trees)], dtype=np.int64)

    def mask_bytes(self) -> np.ndarray:
        """Bytes of one row's packed mask, per tree."""
        return (self.n_leaves() + 7) // 8

    def validate(self, n_records: int | None = None) -> "Skeleton":
        """Check it describes proper binary trees (children after parents, one parent each);
        :class:`ProtocolError` otherwise. ``n_records``: the receiver's lookup-table size."""
        arrs = {"tree_sizes": self.tree_sizes, "left": self.left, "right": self.right,
                "record_ids": self.record_ids}
        for name, a in arrs.items():
            if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype.kind not in "iu":
                raise ProtocolError(f"skeleton {name} must be a 1-d integer array")
        sizes = self.tree_sizes.astype(np.int64)
        total = int(sizes.sum()) if sizes.size else 0
        if sizes.size and sizes.min() < 1:
            raise ProtocolError("skeleton: every tree needs at least one node")
        if not len(self.left) == len(self.right) == len(self.record_ids) == total:
            raise ProtocolError(f"skeleton: node arrays of lengths {len(self.left)}, {len(self.right)}, "
                                f"{len(self.record_ids)} do not match the {total} nodes of tree_sizes")
        left, right = self.left.astype(np.int64), self.right.astype(np.int64)
        rec = self.record_ids.astype(np.int64)
        off = self.offsets()
        for t in range(self.n_trees):
            s, e = int(off[t]), int(off[t + 1])
            L, R, size = left[s:e], right[s:e], e - s
            ids = np.arange(size)
            leaf = (L == -1) & (R == -1)
            internal = ~leaf
            if np.any(internal & ((L <= ids) | (R <= ids) | (L >= size) | (R >= size) | (L == R))):
                raise ProtocolError(f"skeleton: tree {t} has a node whose children are not later nodes "
                                    "of the same tree")
            counts = np.bincount(np.concatenate([L[internal], R[internal]]), minlength=size)
            if counts[0] != 0 or np.any(counts[1:] != 1):
                raise ProtocolError(f"skeleton: in tree {t} not every node but the root has exactly "
                                    "one parent")
            if np.any(rec[s:e][leaf] != -1):
                raise ProtocolError(f"skeleton: tree {t} has a record id at a leaf")
        if rec.size and rec.min() < -1:
            raise ProtocolError("skeleton: negative record id")
        if n_records is not None and rec.size and rec.max() >= n_records:
            raise ProtocolError(f"skeleton: record id {int(rec.max())} is not in the lookup table "
                                f"({n_records} records)")
        return self

    def to_fields(self) -> dict:
        return {"tree_sizes": self.tree_sizes, "left": self.left, "right": self.right,
                "record_ids": self.record_ids}


def skeleton_of(trees: list[Tree], party: str) -> Skeleton:
    """The skeleton of ``trees`` for ``party``: its record ids at its nodes, -1 elsewhere."""
    sizes, left, right, rec = [], [], [], []
    for tree in trees:
        sizes.append(len(tree.nodes))
        for node in tree.nodes:
            leaf = node.is_leaf
            left.append(-1 if leaf else node.left)
            right.append(-1 if leaf else node.right)
            rec.append(node.record_id if (not leaf and node.owner == party) else -1)
    return Skeleton(np.array(sizes, dtype=np.int32), np.array(left, dtype=np.int32),
                    np.array(right, dtype=np.int32), np.array(rec, dtype=np.int64))


def leaf_masks(skeleton: Skeleton, own_nodes: np.ndarray, go_left: np.ndarray) -> np.ndarray:
    """Packed reachable-leaf masks ``(n_rows, sum(mask_bytes))`` uint8.

    ``own_nodes`` are flat node indices (into the concatenated skeleton) that
    this party decides; ``go_left[:, j]`` is its decision at ``own_nodes[j]``
    for every row. Every other internal node keeps both children open.
    """
    go_left = np.asarray(go_left, dtype=bool)
    n_rows = go_left.shape[0]
    col = {int(f): j for j, f in enumerate(np.asarray(own_nodes).tolist())}
    off = skeleton.offsets()
    out = []
    for t in range(skeleton.n_trees):
        s, e = int(off[t]), int(off[t + 1])
        L, R = skeleton.left[s:e].tolist(), skeleton.right[s:e].tolist()
        reach = np.zeros((e - s, n_rows), dtype=bool)
        reach[0] = True
        for v in range(e - s):
            if L[v] < 0:
                continue
            j = col.get(s + v)
            if j is None:
                reach[L[v]] = reach[v]
                reach[R[v]] = reach[v]
            else:
                g = go_left[:, j]
                reach[L[v]] = reach[v] & g
                reach[R[v]] = reach[v] & ~g
        leaves = [v for v in range(e - s) if L[v] < 0]
        out.append(np.packbits(reach[leaves].T, axis=1))
    if not out:
        return np.zeros((n_rows, 0), dtype=np.uint8)
    return np.ascontiguousarray(np.concatenate(out, axis=1))


def check_masks(masks, skeleton: Skeleton, n_rows: int, party: str) -> np.ndarray:
    """A party's masks have the right shape and leave each row at least one leaf per tree."""
    width = int(skeleton.mask_bytes().sum())
    if not isinstance(masks, np.ndarray) or masks.dtype != np.uint8 or masks.shape != (n_rows, width):
        raise PeerError(f"party {party!r} sent leaf masks of shape {getattr(masks, 'shape', None)} "
                        f"({getattr(masks, 'dtype', type(masks).__name__)}), expected ({n_rows}, {width}) uint8")
    counts = _leaf_counts(masks, skeleton)
    if counts.size and counts.min() == 0:
        raise PeerError(f"party {party!r} sent leaf masks that exclude every leaf of a tree")
    return masks


def _unpack(masks: np.ndarray, skeleton: Skeleton):
    """Yield ``(tree index, (n_rows, n_leaves) bool)`` per tree."""
    nl, nb = skeleton.n_leaves(), skeleton.mask_bytes()
    start = 0
    for t in range(skeleton.n_trees):
        block = masks[:, start:start + int(nb[t])]
        start += int(nb[t])
        yield t, np.unpackbits(block, axis=1, count=int(nl[t])).astype(bool)


def _leaf_counts(masks: np.ndarray, skeleton: Skeleton) -> np.ndarray:
    if skeleton.n_trees == 0:
        return np.zeros((masks.shape[0], 0), dtype=np.int64)
    return np.stack([bits.sum(axis=1) for _, bits in _unpack(masks, skeleton)], axis=1)


def resolve_leaves(masks: np.ndarray, skeleton: Skeleton, parties: list[str]) -> np.ndarray:
    """Leaf node id (local to its tree) per ``(row, tree)`` from the AND of all parties' masks.

    Raises :class:`PeerError` unless exactly one leaf is left for every row and tree.
    """
    n_rows = masks.shape[0]
    out = np.zeros((n_rows, skeleton.n_trees), dtype=np.int64)
    off = skeleton.offsets()
    for t, bits in _unpack(masks, skeleton):
        counts = bits.sum(axis=1)
        if np.any(counts != 1):
            bad = int(np.sum(counts != 1))
            raise PeerError(f"the leaf masks of parties {parties} are inconsistent: {bad} row(s) of tree {t} "
                            f"reach {sorted(set(counts[counts != 1].tolist()))} leaves instead of one")
        leaves = np.flatnonzero(skeleton.left[int(off[t]):int(off[t + 1])] < 0)
        out[:, t] = leaves[np.argmax(bits, axis=1)]
    return out

