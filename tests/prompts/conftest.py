"""Fixtures the tests in tests/prompts/ share (pytest finds them here)."""
from tests.helpers.bucketing_task import task_name  # noqa: F401 (a fixture)
