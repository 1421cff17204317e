"""Fixtures the tests in tests/backbones/t5/ share (pytest finds them here)."""
from tests.helpers.glue_data import prepared  # noqa: F401 (a fixture)
