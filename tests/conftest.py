"""Fixtures every test directory shares, the hypothesis profiles, the ``slow`` marker of the
multi-process modules and the CI rule on skips (ci_rules.py); helpers are in support.py."""
import os
import warnings

import pytest
from ci_rules import CI, SHARED_SKIP, fail_skip
from hypothesis import HealthCheck, settings
from support import KEY_BITS

from crypto import parallel
from crypto.executor import LocalExecutor
from crypto.keys import WeakKeyWarning
from datasets import breast_cancer_parties, shared_datasets_dir

# hypothesis profiles: ``dev`` locally, ``ci`` (derandomized: the same examples every run, no
# example database, no deadline) when CI=true, ``thorough`` (ten times the examples) on request:
# HYPOTHESIS_PROFILE=thorough python -m pytest ... . Tests size their example counts with
# support.examples(n), n being the count under the dev and ci profiles.
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True, database=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if CI else "dev"))


#: where every test starts processes or servers (party processes over gRPC and TLS, Dask clusters):
#: marked ``slow`` here, in one place. Elsewhere a test that starts worker pools or takes more than
#: about a second carries ``@pytest.mark.slow`` itself; ``-m "not slow"`` is the quick loop.
MULTI_PROCESS = ("tests/network/", "tests/parties/test_dask_executor.py")
#: modules whose module-scoped processes (Dask clusters) the tests only read: their tests run on one
#: xdist worker (``--dist loadgroup``), so each cluster starts once, not once per worker
ONE_WORKER = {"tests/parties/test_dask_executor.py": "dask-clusters"}


def pytest_collection_modifyitems(config, items):
    grouped = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if item.nodeid.startswith(MULTI_PROCESS):
            item.add_marker(pytest.mark.slow)
        group = ONE_WORKER.get(item.nodeid.split("::")[0])
        if group and grouped:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if CI:
        fail_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield        # a module-level importorskip skips a whole module at collection
    if CI:
        fail_skip(report)
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
        pytest.skip(SHARED_SKIP)
    return d


@pytest.fixture
def always_parallel(monkeypatch):
    """Send even tiny batches to the workers, so the executor paths run on test-sized data."""
    monkeypatch.setattr(parallel, "POLICY", parallel.ParallelPolicy.always())


@pytest.fixture
def started_pids(monkeypatch):
    """pid of every worker process a LocalExecutor starts during the test (a pool axis must really
    use pools; a failed training must leave none alive)."""
    pids = []
    real = LocalExecutor._start

    def start(self):
        fresh = not self._workers
        real(self)
        if fresh:
            pids.extend(self.pids)

    monkeypatch.setattr(LocalExecutor, "_start", start)
    return pids
