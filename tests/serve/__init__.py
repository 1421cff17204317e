"""Tests of spot_jax.serve and `python -m spot_jax.infer`."""
