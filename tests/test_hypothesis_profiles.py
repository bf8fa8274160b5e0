"""The hypothesis profiles of tests/conftest.py: ``ci`` is derandomized (CI=true picks it), ``thorough``
runs ten times the examples, and support.examples(n) scales a test's count with the profile."""
import pytest
from hypothesis import settings
from support import examples


@pytest.fixture
def restore_profile():
    current = settings.get_current_profile_name()
    yield
    settings.load_profile(current)


def test_ci_is_derandomized_without_a_database_or_deadline():
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.database is None and ci.deadline is None


def test_examples_scale_with_the_profile(restore_profile):
    for name, factor in (("dev", 1), ("ci", 1), ("thorough", 10)):
        settings.load_profile(name)
        assert examples(25) == 25 * factor and examples(1) == factor
