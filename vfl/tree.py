"""Tree and node structures as the active party keeps them.

A node split by the active party stores its own ``feature_idx``/``threshold``;
a node split by a passive party stores only ``(owner, record_id)``: the
threshold lives in that party's lookup table.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


def _f(x):
    """JSON-safe exact float (inf/nan as strings)."""
    x = float(x)
    return x if x == x and abs(x) != float("inf") else repr(x)


def _unf(x):
    return float(x)


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
    def from_dict(cls, d: dict) -> "Tree":
        return cls([Node.from_dict(n) for n in d["nodes"]])

    def structure(self) -> list[tuple]:
        """Everything that defines the tree's predictions (for equality checks)."""
        return [(n.node_id, n.is_leaf, n.value, n.left, n.right, n.owner, n.feature_idx,
                 n.threshold, n.default_left, n.record_id,
                 None if n.categories is None else tuple(n.categories)) for n in self.nodes]
