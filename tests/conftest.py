"""Fixtures every test directory shares, the hypothesis profiles and the CI rule on skips;
helpers are in support.py."""
import os
import warnings

import pytest
from hypothesis import HealthCheck, settings
from support import KEY_BITS

from crypto import parallel
from crypto.keys import WeakKeyWarning
from datasets import breast_cancer_parties, shared_datasets_dir

#: under CI=true a skip fails the run unless ALLOWED_SKIPS names it: an extra that failed to install
#: would otherwise turn its tests into quiet skips and CI would stay green
CI = os.environ.get("CI", "").strip().lower() in ("true", "1")

#: the skips CI accepts: (a part of the test id, a part of the skip reason), each with why
ALLOWED_SKIPS = (
    # the shared benchmark datasets (UCI/LIBSVM downloads) live outside the repository, in
    # ../shared/datasets or $VFL_SHARED_DATASETS; a CI machine without them skips these few tests
    ("", "shared datasets directory (../shared/datasets or $VFL_SHARED_DATASETS) not present"),
    ("", "../shared/datasets is not available"),
    # resetting the peak RSS needs a kernel (and container) that lets a process write /proc/self/clear_refs
    ("tests/parties/test_low_memory.py", "needs /proc/self/clear_refs to reset the peak RSS"),
    # scikit-learn's array-API estimator checks need SciPy's array-API mode (SCIPY_ARRAY_API=1 before
    # SciPy is imported): the estimators take numpy and pandas input only
    ("tests/api/test_sklearn_checks.py", "SCIPY_ARRAY_API is not set: not checking array_api input"),
    # glibc malloc settings exist on Linux only
    ("tests/parties/test_memory_settings.py", "glibc malloc settings"),
)

# hypothesis profiles: ``dev`` locally, ``ci`` (derandomized: the same examples every run, no
# example database, no deadline) when CI=true, ``thorough`` (ten times the examples) on request:
# HYPOTHESIS_PROFILE=thorough python -m pytest ... . Tests size their example counts with
# support.examples(n), n being the count under the dev and ci profiles.
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True, database=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if CI else "dev"))


def _skip_allowed(nodeid: str, reason: str) -> bool:
    return any(part in nodeid and why in reason for part, why in ALLOWED_SKIPS)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


def _fail_skip(report) -> None:
    """Turn a skip CI does not allow into a failure that names the reason and the rule."""
    reason = _skip_reason(report)
    if report.skipped and not getattr(report, "wasxfail", None) and not _skip_allowed(report.nodeid, reason):
        report.outcome = "failed"
        report.longrepr = (f"{report.nodeid} skipped under CI=true ({reason}); a skip fails CI unless "
                           "tests/conftest.py ALLOWED_SKIPS names it (is a test extra missing?)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if CI:
        _fail_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield        # a module-level importorskip skips a whole module at collection
    if CI:
        _fail_skip(report)
    return report


@pytest.fixture(autouse=True)
def _allow_test_keys():
    """1024-bit keys warn by design; tests use them on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=WeakKeyWarning)
        yield


@pytest.fixture(scope="session")
def keypair():
    import phe
    return phe.generate_paillier_keypair(n_length=KEY_BITS)


@pytest.fixture(scope="session")
def breast2():
    return breast_cancer_parties(2)


@pytest.fixture(scope="session")
def breast3():
    return breast_cancer_parties(3)


@pytest.fixture
def shared_dir():
    d = shared_datasets_dir()
    if d is None:
        pytest.skip("../shared/datasets is not available")
    return d


@pytest.fixture
def always_parallel(monkeypatch):
    """Send even tiny batches to the workers, so the executor paths run on test-sized data."""
    monkeypatch.setattr(parallel, "POLICY", parallel.ParallelPolicy.always())
