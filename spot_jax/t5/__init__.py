"""Frozen T5 backbone: configuration, Flax network, checkpoints and generation."""
from spot_jax.t5.config import CONFIGS, T5Config, config_by_name
from spot_jax.t5.network import Transformer
from spot_jax.t5 import decoding
from spot_jax.t5.decoding import beam_search, brevity_penalty, temperature_sample
from spot_jax.t5.generation import generate
from spot_jax.t5.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
