"""TrainingProtocol (parties.passive_checks) driven directly, one rule at a time: each request an
honest active party never sends is refused naming its rule, and the refusal ends the training."""
import numpy as np
import pytest

from parties.passive_checks import TrainingProtocol
from vfl.core.errors import ProtocolError

ROOT = np.zeros((1, 8), np.int32)
ONE = np.zeros(1, np.int32)


def _split(a, row_nodes):
    b = a.copy()
    b[0] = row_nodes
    return b


def _at_level_one(max_depth=3, n_rounds=1):
    """A protocol after the root and the root's split into nodes 1 and 2 (histogram of node 1)."""
    proto = TrainingProtocol("telco", n_rounds=n_rounds, max_depth=max_depth, min_node_rows=1)
    proto.histogram_request(0, ROOT, ONE, ONE * 0)
    level1 = _split(ROOT, [1, 1, 1, 1, 2, 2, 2, 2])
    proto.histogram_request(0, level1, ONE, np.array([1]))
    return proto, level1


def test_an_honest_round_passes_and_counts_its_requests():
    proto, level1 = _at_level_one()
    proto.split_request(0, np.zeros(2, np.int32), np.array([1, 2]))
    level2 = _split(level1, [3, 3, 4, 4, 5, 5, 6, 6])
    proto.histogram_request(0, level2, np.zeros(2), np.array([3, 5]))
    assert (proto.round, proto.requests, proto.total_requests, proto.refused) == (0, 3, 3, None)


def test_rounds_go_upwards():
    proto = TrainingProtocol("telco", n_rounds=3, max_depth=2, min_node_rows=1)
    proto.histogram_request(1, ROOT, ONE, ONE * 0)
    with pytest.raises(ProtocolError, match=r"party 'telco' refuses HistogramRequest of round 0: rule 'round bound': "
                                            r"round 0 after round 1; the training ends"):
        proto.histogram_request(0, ROOT, ONE, ONE * 0)
    assert proto.refused.startswith("rule 'round bound'")


def test_a_round_starts_at_the_root():
    proto = TrainingProtocol("telco", n_rounds=1, max_depth=2, min_node_rows=1)
    with pytest.raises(ProtocolError, match="rule 'fixed sample': the first request of a round must put every row "
                                            "at the root"):
        proto.histogram_request(0, _split(ROOT, [0, 0, 0, 0, 1, 1, 2, 2]), ONE, ONE * 0)


def test_rows_outside_the_sample_may_be_at_the_root_but_the_sample_is_fixed():
    proto = TrainingProtocol("telco", n_rounds=1, max_depth=3, min_node_rows=1)
    first = _split(ROOT, [0, 0, 0, 0, 0, 0, -2, -2])     # two rows outside the tree's sample (code -2 - node)
    proto.histogram_request(0, first, ONE, ONE * 0)
    with pytest.raises(ProtocolError, match="rule 'fixed sample': tree 0: the rows in the tree's sample"):
        proto.histogram_request(0, _split(ROOT, [1, 1, 1, 2, 2, 2, 2, -2]), ONE, np.array([1]))


def test_the_number_of_trees_is_fixed_within_a_round():
    proto = TrainingProtocol("telco", n_rounds=1, max_depth=3, min_node_rows=1)
    proto.histogram_request(0, ROOT, ONE, ONE * 0)
    two = np.vstack([_split(ROOT, [1, 1, 1, 1, 2, 2, 2, 2])] * 2)
    with pytest.raises(ProtocolError, match="rule 'fixed sample': 2 trees, the round's first request had 1"):
        proto.histogram_request(0, two, ONE, np.array([1]))


def test_a_node_this_party_split_must_be_divided():
    proto = TrainingProtocol("telco", n_rounds=1, max_depth=3, min_node_rows=1)
    proto.histogram_request(0, ROOT, ONE, ONE * 0)
    proto.record_split(0, 0, np.array([1, 1, 1, 1, 0, 0, 0, 0], bool))
    with pytest.raises(ProtocolError, match="rule 'own split': tree 0: node 0 was split by this party but its rows "
                                            "were not divided"):
        proto.histogram_request(0, ROOT, ONE, ONE * 0)


def test_only_nodes_of_the_level_being_grown_are_divided():
    proto, level1 = _at_level_one(max_depth=4)
    level2 = _split(level1, [3, 3, 4, 4, 2, 2, 2, 2])       # node 2 became a leaf
    proto.histogram_request(0, level2, ONE, np.array([3]))
    with pytest.raises(ProtocolError, match="rule 'refinement': tree 0: node 2 is divided but it is not a node of the "
                                            "level being grown"):
        proto.histogram_request(0, _split(level2, [3, 3, 4, 4, 5, 5, 6, 6]), ONE, np.array([5]))


def test_children_are_new_nodes():
    proto, level1 = _at_level_one()
    with pytest.raises(ProtocolError, match=r"rule 'refinement': tree 0: node 2 \(from node 1\) is not a new node"):
        proto.histogram_request(0, _split(level1, [2, 2, 3, 3, 4, 4, 4, 4]), ONE, np.array([3]))
    proto, level1 = _at_level_one()
    with pytest.raises(ProtocolError, match=r"node 4 \(from node 2\) is not a new node"):
        proto.histogram_request(0, _split(level1, [3, 3, 4, 4, 4, 4, 5, 5]), ONE, np.array([3]))


def test_an_empty_node_beyond_the_tree_or_of_an_old_level_is_refused():
    proto, level1 = _at_level_one()
    level2 = _split(level1, [3, 3, 4, 4, 5, 5, 6, 6])
    with pytest.raises(ProtocolError, match="rule 'splittable nodes': tree 0: node 15 is not a node of the level"):
        proto.histogram_request(0, level2, np.zeros(2), np.array([3, 15]))
    proto, level1 = _at_level_one()
    with pytest.raises(ProtocolError, match="rule 'splittable nodes': tree 0: node 0 is not a node of the level"):
        proto.histogram_request(0, level2, np.zeros(2), np.array([3, 0]))
    proto, level1 = _at_level_one()                           # an empty new node (a DP model's full level): fine
    proto.histogram_request(0, level2, np.zeros(2), np.array([3, 9]))
    assert proto.refused is None


def test_split_requests_name_the_current_round_and_level():
    proto, _ = _at_level_one(n_rounds=2)
    with pytest.raises(ProtocolError, match="refuses SplitRequest of round 1: rule 'splittable nodes': round 1 has no "
                                            "histogram request"):
        proto.split_request(1, ONE, ONE)
    proto, _ = _at_level_one()
    proto.split_request(0, ONE, np.array([7]))                # a node without rows, never used: nothing to split
    with pytest.raises(ProtocolError, match="rule 'splittable nodes': tree 0: node 0 is not a node of the level"):
        proto.split_request(0, ONE, ONE * 0)
    with pytest.raises(ProtocolError, match="the training ended after a refused request"):
        proto.split_request(0, ONE, np.array([1]))


def test_a_request_not_answered_is_rolled_back_unless_refused():
    proto, level1 = _at_level_one()
    snap = proto.snapshot()
    level2 = _split(level1, [3, 3, 4, 4, 5, 5, 6, 6])
    proto.histogram_request(0, level2, np.zeros(2), np.array([3, 5]))
    proto.restore(snap)
    assert proto.requests == 2
    proto.histogram_request(0, level2, np.zeros(2), np.array([3, 5]))      # the retry passes again
    assert proto.requests == 3
