"""Frozen T5 backbone: configuration, Flax network, checkpoints and generation.

  config       T5Config, one frozen dataclass with t5x's field names, and the named configs
  layers       building blocks in Flax linen, with t5x's parameter names and logical axes
  network      the encoder-decoder `Transformer`, t5x's parameter tree and call convention
  prefixes     what attention layers receive in front of their keys and values (deep prompts)
  decoding     temperature sampling (greedy) and beam search over an incremental decoder
  generation   encode once, then search the decoder
  scoring      log-likelihoods of targets given the encoder output; label scores (one encoder
               pass per input)
  checkpoints/ strict loading and saving: T5X legacy, orbax, Hugging Face
  hf           Hugging Face configs and tensor names mapped onto the t5x tree
  hf_export    T5X / orbax parameters -> a Hugging Face directory (config.json + safetensors)
"""
from spot_jax.backbones.t5.config import CONFIGS, T5Config, config_by_name
from spot_jax.backbones.t5.network import Transformer
from spot_jax.backbones.t5 import decoding
from spot_jax.backbones.t5.decoding import beam_search, brevity_penalty, temperature_sample
from spot_jax.backbones.t5.generation import generate
from spot_jax.backbones.t5.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
