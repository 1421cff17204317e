"""Tests of spot_jax.spot."""
