"""Tests of spot_jax.cli: the runner, flags and gin files."""
