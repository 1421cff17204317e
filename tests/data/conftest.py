"""Fixtures the tests in tests/data/ share (pytest finds them here)."""
from tests.helpers.bucketing_task import task_name  # noqa: F401 (a fixture)
