"""Under CI=true a skip fails the run unless tests/ci_rules.py's ALLOWED_SKIPS names it (issue 26,
item 4): a module-level importorskip of a missing extra must not turn its tests into quiet skips."""
import re
from pathlib import Path

import ci_rules
import pytest
from _pytest.reports import CollectReport, TestReport


def _test_report(nodeid, reason, outcome="skipped"):
    return TestReport(nodeid, ("x.py", 1, "t"), {}, outcome, ("x.py", 1, f"Skipped: {reason}"), "call")


def test_a_skip_ci_does_not_allow_fails_and_names_the_reason_and_the_rule():
    report = _test_report("tests/network/test_serving.py::test_x", "could not import 'grpc'")
    ci_rules.fail_skip(report)
    assert report.outcome == "failed"
    assert "could not import 'grpc'" in report.longrepr and "ALLOWED_SKIPS" in report.longrepr


def test_a_module_skipped_at_collection_fails_too():
    report = CollectReport("tests/api/test_parquet.py", "skipped",
                           ("tests/api/test_parquet.py", 15, "Skipped: could not import 'pyarrow'"), [])
    ci_rules.fail_skip(report)
    assert report.outcome == "failed" and "pyarrow" in report.longrepr


def test_allowed_skips_stay_skips_only_where_the_list_names_them():
    shared = _test_report("tests/core/test_categorical.py::test_y", ci_rules.SHARED_SKIP)
    ci_rules.fail_skip(shared)
    assert shared.outcome == "skipped"
    malloc = "glibc malloc settings"
    here = _test_report("tests/parties/test_memory_settings.py::test_m", malloc)
    elsewhere = _test_report("tests/parties/test_training.py::test_m", malloc)
    ci_rules.fail_skip(here)
    ci_rules.fail_skip(elsewhere)
    assert here.outcome == "skipped" and elsewhere.outcome == "failed"


def test_passes_failures_and_expected_failures_are_left_alone():
    passed = _test_report("t.py::a", "", "passed")
    xfail = _test_report("t.py::b", "known")
    xfail.wasxfail = "known"
    for report in (passed, xfail):
        ci_rules.fail_skip(report)
    assert passed.outcome == "passed" and xfail.outcome == "skipped"


def test_every_allowed_skip_says_why():
    """Each entry of the allow-list has a comment above it (the list stays short and explained)."""
    source = Path(ci_rules.__file__).read_text()
    block = source[source.index("ALLOWED_SKIPS = ("):source.index(")\n\n", source.index("ALLOWED_SKIPS = ("))]
    entries = [line for line in block.splitlines()[1:] if line.strip().startswith("(")]
    assert 0 < len(entries) <= 6
    lines = block.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("(") and not lines[i - 1].strip().startswith(("#", "(")):
            raise AssertionError(f"ALLOWED_SKIPS entry without a comment: {line.strip()}")


def test_every_skip_for_missing_shared_data_says_how_to_point_the_suite_at_it():
    """Issue 37, item 10: the fixtures and helpers that skip without the shared data sets give
    SHARED_SKIP (which names VFL_SHARED_DATASETS); no test skips for them with a reason of its own."""
    assert "VFL_SHARED_DATASETS=" in ci_rules.SHARED_SKIP and "../shared/datasets" in ci_rules.SHARED_SKIP
    tests = Path(ci_rules.__file__).parent
    for f in tests.rglob("*.py"):
        for call in re.findall(r"pytest\.skip\(([^)]*)\)", f.read_text()):
            if "shared" in call.lower() or "dataset" in call.lower():
                assert call.strip() == "SHARED_SKIP", f"{f}: pytest.skip({call})"


def test_the_shared_data_fixture_skips_with_the_pointer(monkeypatch, tmp_path):
    # tests/conftest.py by its path: under the whole suite the module name "conftest" may be
    # tests/network/conftest.py (both import as "conftest"), which has no shared_dir
    import importlib.util
    spec = importlib.util.spec_from_file_location("_tests_conftest", Path(ci_rules.__file__).parent / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    monkeypatch.setenv("VFL_SHARED_DATASETS", str(tmp_path / "missing"))
    with pytest.raises(pytest.skip.Exception, match="set VFL_SHARED_DATASETS=/path/to/datasets"):
        conftest.shared_dir.__wrapped__()
