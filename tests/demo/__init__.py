"""Tests of spot_jax.demo."""
