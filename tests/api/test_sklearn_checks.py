"""scikit-learn's own estimator checks (``check_estimator``) on both estimators.

The checks fit the estimators dozens of times on small tables, so they run in plain mode with few
trees (``mode="he"`` grows the same trees: tests/api/test_estimators.py). Every check passes: none
is an expected failure (the weight checks too: the learner trains with sample weights).
"""
import pytest
from sklearn.utils.estimator_checks import check_estimator, parametrize_with_checks

from vfl.estimators import VerticalBoostingClassifier, VerticalBoostingRegressor

ESTIMATORS = [VerticalBoostingClassifier(mode="plain", n_estimators=5),
              VerticalBoostingRegressor(mode="plain", n_estimators=5)]


@parametrize_with_checks(ESTIMATORS)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


@pytest.mark.slow
def test_check_estimator_reports_every_check_passed():
    """The same through check_estimator itself: every check passes, none is expected to fail."""
    statuses = {}

    def record(estimator, check_name, exception, status, expected_to_fail, expected_to_fail_reason):
        statuses.setdefault(check_name, set()).add(status)

    est = VerticalBoostingClassifier(mode="plain", n_estimators=3, max_depth=3, n_parties=3)
    check_estimator(est, on_fail=None, on_skip=None, callback=record)
    failed = {name for name, s in statuses.items() if "failed" in s}
    xfail = {name for name, s in statuses.items() if "xfail" in s}
    assert failed == set() and xfail == set()
    assert len([name for name, s in statuses.items() if s == {"passed"}]) >= 50
