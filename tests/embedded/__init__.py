"""Tests of spot_jax.embedded."""
