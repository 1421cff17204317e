"""Tests of spot_jax.backbones.t5."""
