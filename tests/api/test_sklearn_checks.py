"""scikit-learn's own estimator checks (``check_estimator``) on both estimators.

The checks fit the estimators dozens of times on small tables, so they run in plain mode with few
trees (``mode="he"`` grows the same trees: tests/api/test_estimators.py). Every check passes: none
is an expected failure (the weight checks too: the learner trains with sample weights). They run with
``min_node_rows=1``: the default (2) keeps both children of every split at two *rows* (issue 31: what a
passive party enforces), and a row of weight 2 is one row, so weights and duplicated rows may then
split differently where a child would hold a single row.
"""
import pytest
from sklearn.utils.estimator_checks import check_estimator, parametrize_with_checks

from vfl.estimators import VerticalBoostingClassifier, VerticalBoostingRegressor

ESTIMATORS = [VerticalBoostingClassifier(mode="plain", n_estimators=5, min_node_rows=1),
              VerticalBoostingRegressor(mode="plain", n_estimators=5, min_node_rows=1)]


@parametrize_with_checks(ESTIMATORS)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


@pytest.mark.slow
def test_check_estimator_reports_every_check_passed():
    """The same through check_estimator itself: every check passes, none is expected to fail."""
    statuses = {}

    def record(estimator, check_name, exception, status, expected_to_fail, expected_to_fail_reason):
        statuses.setdefault(check_name, set()).add(status)

    est = VerticalBoostingClassifier(mode="plain", n_estimators=3, max_depth=3, n_parties=3, min_node_rows=1)
    check_estimator(est, on_fail=None, on_skip=None, callback=record)
    failed = {name for name, s in statuses.items() if "failed" in s}
    xfail = {name for name, s in statuses.items() if "xfail" in s}
    assert failed == set() and xfail == set()
    assert len([name for name, s in statuses.items() if s == {"passed"}]) >= 50
