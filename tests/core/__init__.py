"""Tests of spot_jax's top-level modules (spot_jax/*.py)."""
