"""Tree and node structures as the active party keeps them.

A node split by the active party stores its own ``feature_idx``/``threshold``;
a node split by a passive party stores only ``(owner, record_id)``: the
threshold lives in that party's lookup table.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from datasets.errors import InputError


def _f(x):
    """JSON-safe exact float (inf/nan as strings)."""
    x = float(x)
    return x if x == x and abs(x) != float("inf") else repr(x)


def _unf(x):
    return float(x)


# --------------------------------------------------------------------------- structural checks
class Damaged(InputError):
    """A model, lookup table or checkpoint file that does not hold what this toolkit writes."""


def damaged(source: str, where: str, problem: str) -> Damaged:
    return Damaged(f"{source} is damaged: field {where}: {problem}")


def need_int(v, source: str, where: str, lo: int | None = None, hi: int | None = None) -> int:
    """``v`` as an int (a JSON integer, not a bool or a float) within ``[lo, hi)``."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise damaged(source, where, f"expected an integer, got {_show(v)}")
    if (lo is not None and v < lo) or (hi is not None and v >= hi):
        rng = f"from {lo}" + (f" to {hi - 1}" if hi is not None else "")
        raise damaged(source, where, f"{v} is out of range (expected {rng})")
    return v


def need_float(v, source: str, where: str, finite: bool = True, allow_none: bool = False,
               allow_nan: bool = False) -> float | None:
    """``v`` as a float: a JSON number, or "inf"/"-inf"/"nan" as written by :func:`_f`."""
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise damaged(source, where, f"expected a number, got {_show(v)}")
    if isinstance(v, str) and v not in ("inf", "-inf", "nan"):
        raise damaged(source, where, f"expected a number, got {_show(v)}")
    try:
        x = float(v)
    except OverflowError:
        raise damaged(source, where, f"{_show(v)} is out of the float range") from None
    if (math.isnan(x) and not allow_nan) or (finite and math.isinf(x)):
        raise damaged(source, where, f"expected a finite number, got {_show(v)}")
    return x


def need_str(v, source: str, where: str, allow_none: bool = False) -> str | None:
    if v is None and allow_none:
        return None
    if not isinstance(v, str):
        raise damaged(source, where, f"expected a string, got {_show(v)}")
    return v


def need_bool(v, source: str, where: str, allow_none: bool = False) -> bool | None:
    if v is None and allow_none:
        return None
    if not isinstance(v, bool):
        raise damaged(source, where, f"expected true or false, got {_show(v)}")
    return v


def need_list(v, source: str, where: str, min_len: int = 0) -> list:
    if not isinstance(v, list):
        raise damaged(source, where, f"expected a list, got {_show(v)}")
    if len(v) < min_len:
        raise damaged(source, where, f"expected at least {min_len} entr{'y' if min_len == 1 else 'ies'}, "
                                     f"got {len(v)}")
    return v


def need_dict(v, source: str, where: str) -> dict:
    if not isinstance(v, dict):
        raise damaged(source, where, f"expected an object, got {_show(v)}")
    return v


def need_key(d: dict, key: str, source: str, where: str):
    if key not in d:
        raise damaged(source, f"{where}{'.' if where else ''}{key}", "missing")
    return d[key]


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


_NODE_FIELDS = None


def _node_fields() -> dict:
    global _NODE_FIELDS
    if _NODE_FIELDS is None:
        _NODE_FIELDS = {f.name: f for f in fields(Node)}
    return _NODE_FIELDS


@dataclass
class Node:
    node_id: int
    depth: int
    parent: int = -1
    is_leaf: bool = True
    value: float = 0.0            # leaf weight, learning rate included
    left: int = -1
    right: int = -1
    owner: str | None = None      # party that holds the split
    feature_idx: int = -1         # active-owned splits only
    feature: str | None = None    # active-owned splits only
    threshold: float | None = None  # active-owned splits only
    default_left: bool | None = None  # active-owned splits only
    record_id: int = -1           # passive-owned splits only
    categories: list | None = None  # active-owned categorical splits: the category codes going left
    gain: float = 0.0
    sum_gradients: float = 0.0
    sum_hessians: float = 0.0
    n_samples: int = 0

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("value", "gain", "sum_gradients", "sum_hessians"):
            d[k] = _f(d[k])
        if d["threshold"] is not None:
            d["threshold"] = _f(d["threshold"])
        if d["categories"] is None:
            del d["categories"]          # numeric and passive splits: the format as before
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Node":
        d = dict(d)
        for k in ("value", "gain", "sum_gradients", "sum_hessians"):
            d[k] = _unf(d[k])
        if d.get("threshold") is not None:
            d["threshold"] = _unf(d["threshold"])
        return cls(**d)


@dataclass
class Tree:
    nodes: list[Node] = field(default_factory=list)

    def add(self, node: Node) -> Node:
        assert node.node_id == len(self.nodes)
        self.nodes.append(node)
        return node

    @property
    def max_depth(self) -> int:
        return max((n.depth for n in self.nodes), default=0)

    def leaves(self) -> list[Node]:
        return [n for n in self.nodes if n.is_leaf]

    def to_dict(self) -> dict:
        return {"nodes": [n.to_dict() for n in self.nodes]}

    @classmethod
    def from_dict(cls, d: dict, source: str = "model", where: str = "tree", owners=None) -> "Tree":
        """A tree from its dict, checked (see :meth:`check_dict`): ``Damaged`` (an InputError
        naming ``source`` and the field) for anything this toolkit would not have written."""
        return cls.check_dict(d, source, where, owners)

    @classmethod
    def check_dict(cls, d, source: str = "model", where: str = "tree", owners=None) -> "Tree":
        """Schema and invariants of a tree: node ids are positions; the root is node 0 at depth
        0; every split has two distinct children after it, whose parent and depth match; every
        node but the root is the child of exactly one split (so leaves = splits + 1); a split's
        owner is a known party (``owners``: ``{party: number of its features, or None for a
        passive party}``), an active split has a feature index in range, a threshold and a
        default side, a passive split a record id >= 0; leaf values are finite."""
        d = need_dict(d, source, where)
        raw = need_list(need_key(d, "nodes", source, where), source, f"{where}.nodes", min_len=1)
        known = _node_fields()
        nodes = []
        for i, nd in enumerate(raw):
            w = f"{where}.nodes[{i}]"
            nd = need_dict(nd, source, w)
            extra = sorted(set(nd) - set(known))
            if extra:
                raise damaged(source, f"{w}.{extra[0]}", "unknown field")
            missing = [k for k in ("node_id", "depth", "is_leaf", "value") if k not in nd]
            if missing:
                raise damaged(source, f"{w}.{missing[0]}", "missing")
            n = len(raw)
            kw = {"node_id": need_int(nd["node_id"], source, f"{w}.node_id", i, i + 1),
                  "depth": need_int(nd["depth"], source, f"{w}.depth", 0, 64),
                  "parent": need_int(nd.get("parent", -1), source, f"{w}.parent", -1, n),
                  "is_leaf": need_bool(nd["is_leaf"], source, f"{w}.is_leaf"),
                  "value": need_float(nd["value"], source, f"{w}.value"),
                  "left": need_int(nd.get("left", -1), source, f"{w}.left", -1, n),
                  "right": need_int(nd.get("right", -1), source, f"{w}.right", -1, n),
                  "owner": need_str(nd.get("owner"), source, f"{w}.owner", allow_none=True),
                  "feature_idx": need_int(nd.get("feature_idx", -1), source, f"{w}.feature_idx", -1),
                  "feature": need_str(nd.get("feature"), source, f"{w}.feature", allow_none=True),
                  "threshold": need_float(nd.get("threshold"), source, f"{w}.threshold", finite=False,
                                          allow_none=True),
                  "default_left": need_bool(nd.get("default_left"), source, f"{w}.default_left", allow_none=True),
                  "record_id": need_int(nd.get("record_id", -1), source, f"{w}.record_id", -1),
                  "gain": need_float(nd.get("gain", 0.0), source, f"{w}.gain", finite=False, allow_nan=True),
                  "sum_gradients": need_float(nd.get("sum_gradients", 0.0), source, f"{w}.sum_gradients",
                                              finite=False, allow_nan=True),
                  "sum_hessians": need_float(nd.get("sum_hessians", 0.0), source, f"{w}.sum_hessians",
                                             finite=False, allow_nan=True),
                  "n_samples": need_int(nd.get("n_samples", 0), source, f"{w}.n_samples", 0)}
            cats = nd.get("categories")
            if cats is not None:        # an active categorical split: the category codes going left
                cats = need_list(cats, source, f"{w}.categories")
                kw["categories"] = [need_int(c, source, f"{w}.categories[{j}]", 0) for j, c in enumerate(cats)]
            nodes.append(Node(**kw))
        root = nodes[0]
        if root.depth != 0 or root.parent != -1:
            raise damaged(source, f"{where}.nodes[0]", "the root must have depth 0 and no parent")
        child_of = {}
        for nd in nodes:
            w = f"{where}.nodes[{nd.node_id}]"
            if nd.is_leaf:
                if nd.left != -1 or nd.right != -1:
                    raise damaged(source, f"{w}.left", "a leaf has no children")
                continue
            for side in ("left", "right"):
                c = getattr(nd, side)
                if c <= nd.node_id:
                    raise damaged(source, f"{w}.{side}", f"child index {c} must come after the node "
                                                         f"(tree has {len(nodes)} nodes)")
                if c in child_of:
                    raise damaged(source, f"{w}.{side}", f"node {c} is already a child of node {child_of[c]}")
                child_of[c] = nd.node_id
                ch = nodes[c]
                if ch.parent != nd.node_id or ch.depth != nd.depth + 1:
                    raise damaged(source, f"{where}.nodes[{c}].parent",
                                  f"node {c} is a child of node {nd.node_id} but records parent {ch.parent}, "
                                  f"depth {ch.depth}")
            if nd.owner is None:
                raise damaged(source, f"{w}.owner", "a split needs the party that holds it")
            if owners is not None:
                if nd.owner not in owners:
                    raise damaged(source, f"{w}.owner", f"unknown party {nd.owner!r}")
                n_features = owners[nd.owner]
                if n_features is not None:          # the active party's own split
                    need_int(nd.feature_idx, source, f"{w}.feature_idx", 0, n_features)
                    if nd.categories is None and (nd.threshold is None or math.isnan(nd.threshold)):
                        raise damaged(source, f"{w}.threshold", "an active split needs a threshold (or categories)")
                    if nd.default_left is None:
                        raise damaged(source, f"{w}.default_left", "an active split needs a default side")
                else:
                    need_int(nd.record_id, source, f"{w}.record_id", 0)
        orphans = [nd.node_id for nd in nodes[1:] if nd.node_id not in child_of]
        if orphans:
            raise damaged(source, f"{where}.nodes[{orphans[0]}]", "the node is no split's child")
        return cls(nodes)

    def structure(self) -> list[tuple]:
        """Everything that defines the tree's predictions (for equality checks)."""
        return [(n.node_id, n.is_leaf, n.value, n.left, n.right, n.owner, n.feature_idx,
                 n.threshold, n.default_left, n.record_id,
                 None if n.categories is None else tuple(n.categories)) for n in self.nodes]
