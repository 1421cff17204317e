"""Tests of spot_jax.t5."""
