"""Tests of spot_jax.prompts."""
