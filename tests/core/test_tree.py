"""vfl.core.tree: Node and Tree, and their JSON-safe round trip."""
import json
import math

import pytest

from vfl.core.tree import Node, Tree


def small_tree():
    """root (active, feature 1) -> left leaf, right (passive 'telco', record 3) -> two leaves."""
    t = Tree()
    t.add(Node(0, 0, is_leaf=False, left=1, right=2, owner="bank", feature_idx=1, feature="age",
               threshold=0.25, default_left=True, gain=3.5, sum_gradients=-1.25, sum_hessians=4.0, n_samples=10))
    t.add(Node(1, 1, parent=0, value=-0.125, sum_gradients=-2.0, sum_hessians=1.5, n_samples=4))
    t.add(Node(2, 1, parent=0, is_leaf=False, left=3, right=4, owner="telco", record_id=3, gain=1.0,
               sum_gradients=0.75, sum_hessians=2.5, n_samples=6))
    t.add(Node(3, 2, parent=2, value=0.0625, n_samples=2))
    t.add(Node(4, 2, parent=2, value=0.3, n_samples=4))
    return t


def test_tree_shape_helpers():
    t = small_tree()
    assert t.max_depth == 2 and Tree().max_depth == 0
    assert [n.node_id for n in t.leaves()] == [1, 3, 4]
    with pytest.raises(AssertionError):
        t.add(Node(7, 3))                     # node ids are positions: no gaps


def test_tree_round_trip_through_json():
    t = small_tree()
    d = json.loads(json.dumps(t.to_dict(), allow_nan=False))
    back = Tree.from_dict(d)
    assert back == t
    assert back.structure() == t.structure()
    assert back.to_dict() == t.to_dict()


def test_structure_sees_what_predicts():
    t, u = small_tree(), small_tree()
    u.nodes[3].n_samples, u.nodes[0].gain = 99, 0.0          # statistics: not part of the structure
    assert u.structure() == t.structure()
    u.nodes[4].value = 0.31
    assert u.structure() != t.structure()
    v = small_tree()
    v.nodes[0].default_left = False
    assert v.structure() != t.structure()


@pytest.mark.parametrize("x", [float("inf"), float("-inf"), 1e308, -0.0, 5e-324, 0.1 + 0.2])
def test_node_floats_round_trip_exactly(x):
    node = Node(0, 0, is_leaf=False, left=1, right=2, owner="bank", feature_idx=0, feature="f", threshold=x,
                default_left=False, gain=x, value=x, sum_gradients=x, sum_hessians=x)
    d = json.loads(json.dumps(node.to_dict(), allow_nan=False))    # JSON-safe: no bare Infinity
    back = Node.from_dict(d)
    assert back == node
    assert math.copysign(1.0, back.threshold) == math.copysign(1.0, x)


def test_node_nan_round_trips_as_nan():
    node = Node(0, 0, value=float("nan"), gain=float("nan"))
    back = Node.from_dict(json.loads(json.dumps(node.to_dict(), allow_nan=False)))
    assert math.isnan(back.value) and math.isnan(back.gain) and back.threshold is None


def test_a_passive_split_holds_no_threshold():
    """The active party's copy of a passive party's split: owner and record id only."""
    d = small_tree().nodes[2].to_dict()
    assert d["owner"] == "telco" and d["record_id"] == 3
    assert d["threshold"] is None and d["feature"] is None and d["feature_idx"] == -1
    assert d["default_left"] is None
