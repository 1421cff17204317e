"""spot-jax: soft prompts for frozen T5 models in JAX/Flax."""

from spot_jax import startup as _startup

__version__ = "0.1.0"

# `python -m spot_jax.<prog>`: TensorFlow's and XLA's start-up log lines stay off (see startup.py)
_startup.quiet_if_module_run()
