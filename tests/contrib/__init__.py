"""Tests of spot_jax.contrib.t5x (skip without t5x)."""
