"""Tests of spot_jax.experiment."""
