"""scikit-learn's own estimator checks (``check_estimator``) on both estimators.

The checks fit the estimators dozens of times on small tables, so they run in plain mode with few
trees (``mode="he"`` grows the same trees: tests/api/test_estimators.py). The only checks allowed to
fail are the ones :func:`vfl.estimators.sklearn_expected_failed_checks` lists, with their reason.
"""
import numpy as np
import pytest
from sklearn.utils.estimator_checks import check_estimator, parametrize_with_checks

from vfl.core.errors import InputError
from vfl.estimators import (
    WEIGHTED_TRAINING,
    VerticalBoostingClassifier,
    VerticalBoostingRegressor,
    sklearn_expected_failed_checks,
)

ESTIMATORS = [VerticalBoostingClassifier(mode="plain", n_estimators=5),
              VerticalBoostingRegressor(mode="plain", n_estimators=5)]


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=sklearn_expected_failed_checks)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


def test_expected_failures_are_only_the_weight_checks_and_fail_for_that_reason():
    """The list is empty once vfl.api trains with weights; until then it holds the three checks that
    train with weights other than 0 and 1, and fit refuses such weights with the reason given."""
    for est in ESTIMATORS + [VerticalBoostingRegressor(objective="pseudohuber")]:
        expected = sklearn_expected_failed_checks(est)
        if WEIGHTED_TRAINING:
            assert expected == {}
            continue
        assert set(expected) == {"check_sample_weights_list", "check_sample_weights_not_overwritten",
                                 "check_sample_weight_equivalence_on_dense_data"}
        assert all("weighted training" in reason for reason in expected.values())
    if not WEIGHTED_TRAINING:
        X = np.random.default_rng(0).normal(size=(30, 3))
        with pytest.raises(InputError, match="weights other than 0 and 1 need weighted training"):
            VerticalBoostingRegressor(mode="plain", n_estimators=2).fit(X, X[:, 0], sample_weight=[3] * 30)


@pytest.mark.slow
def test_check_estimator_reports_every_check_passed():
    """The same through check_estimator itself: every check passes, or is one of the expected failures."""
    statuses = {}

    def record(estimator, check_name, exception, status, expected_to_fail, expected_to_fail_reason):
        statuses.setdefault(check_name, set()).add(status)

    est = VerticalBoostingClassifier(mode="plain", n_estimators=3, max_depth=3, n_parties=3)
    check_estimator(est, expected_failed_checks=sklearn_expected_failed_checks(est), on_fail=None,
                    on_skip=None, callback=record)
    failed = {name for name, s in statuses.items() if "failed" in s}
    xfail = {name for name, s in statuses.items() if "xfail" in s}
    assert failed == set() and xfail <= set(sklearn_expected_failed_checks(est))
    assert len([name for name, s in statuses.items() if s == {"passed"}]) >= 50
