"""Fixtures the tests in tests/tasks/ share (pytest finds them here)."""
from tests.helpers.glue_data import prepared  # noqa: F401 (a fixture)
