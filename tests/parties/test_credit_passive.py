"""A passive party's categorical split records: what it stores, and malformed requests refused."""
import numpy as np
import pytest

from datasets.errors import PeerError, ProtocolError
from parties.passive_state import LookupTable
from parties.remote import RemoteSource
from vfl.core.binning import Binner


def _binner():
    X = np.array([[0, 1.0], [1, 2.0], [2, 3.0], [0, 4.0], [np.nan, 5.0], [3, 6.0]])
    return Binner(8, [True, False], max_cat=2).fit(X)


def test_categorical_records_store_codes_and_route_raw_codes():
    b, t = _binner(), LookupTable()
    assert b.categories_[0].tolist() == [0, 1]            # 0 most frequent, then the smallest code
    rid = t.add_categorical("p", ["c", "x"], b, 0, [1, 2], True, 4, 0, 0, 0)   # bin 2: pooled {2, 3}
    assert t.records[rid]["categories"] == [1, 2, 3] and t.records[rid]["threshold"] is None
    num = t.add("p", ["c", "x"], b, 1, 2, False, 0, 0, 1)
    x = np.array([[0.0, 2.0], [1.0, 9.0], [np.nan, np.nan], [-1.0, 1.0]])
    got = t.go_left(np.array([[rid, num]] * 4), x)
    assert got.tolist() == [[False, True], [True, False], [True, False], [False, True]]


@pytest.mark.parametrize("call", [
    lambda t, b: t.add("p", ["c", "x"], b, 0, 0, False, 0, 0, 0),                # threshold on a category
    lambda t, b: t.add_categorical("p", ["c", "x"], b, 1, [0], False, 4, 0, 0, 0),  # set on a number
    lambda t, b: t.add_categorical("p", ["c", "x"], b, 0, [3], False, 4, 0, 0, 0),  # the missing bin
    lambda t, b: t.add_categorical("p", ["c", "x"], b, 0, [0, 0], False, 4, 0, 0, 0),
    lambda t, b: t.add_categorical("p", ["c", "x"], b, 5, [0], False, 4, 0, 0, 0),
])
def test_malformed_split_requests_are_protocol_errors(call):
    with pytest.raises(ProtocolError):
        call(LookupTable(), _binner())


def test_the_active_party_refuses_inconsistent_declarations():
    with pytest.raises(PeerError, match="declared categorical for 1 of its 2 features"):
        RemoteSource(None, "p", np.array([0, 3, 6]), None, np.array([True]), None)
    with pytest.raises(PeerError, match="invalid monotone constraints"):
        RemoteSource(None, "p", np.array([0, 3, 6]), None, np.array([True, False]), np.array([1, 0], np.int8))
    with pytest.raises(PeerError, match="invalid monotone constraints"):
        RemoteSource(None, "p", np.array([0, 3, 6]), None, None, np.array([2, 0], np.int8))
