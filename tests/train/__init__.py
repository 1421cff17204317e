"""Tests of spot_jax.train."""
