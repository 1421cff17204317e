"""Tests of spot_jax.data."""
