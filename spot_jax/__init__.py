"""spot-jax: soft prompts for frozen T5 models in JAX/Flax."""

__version__ = "0.1.0"
