"""Converting decoder-only checkpoints: Hugging Face <-> the gemma library's orbax layout.

`python -m spot_jax.convert` dispatches here when `--hf_dir`'s config.json names a
decoder-only model type (llama, gemma2, gemma3, qwen2, qwen3), or when `--model` names a
decoder config:

  --hf_dir=DIR --output_dir=OUT [--format=gemma]      HF -> Gemma orbax (the gemma library
                                                      loads it; the layout names Gemma's)
  --checkpoint=CKPT --model=NAME --output_dir=OUT     Gemma orbax (or HF) -> HF directory

Both directions read strictly (a missing, extra or mis-shaped array is one line naming it) and
write atomically (beside OUT, then renamed), so a failed conversion leaves nothing behind.
"""
from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional

import jax

from spot_jax.errors import ConfigError
from spot_jax.backbones.decoder import checkpoints, hf
from spot_jax.backbones.decoder.config import DecoderConfig

FORMATS = ("gemma",)


def is_decoder_dir(config_dict: Mapping[str, Any]) -> bool:
  """Whether a Hugging Face config.json describes a decoder-only model this kind reads."""
  return config_dict.get("model_type") in hf.MODEL_TYPES


def parameter_count(params: Any) -> int:
  return sum(math.prod(a.shape) for a in jax.tree_util.tree_leaves(params))


def hf_to_gemma(hf_dir: str, output_dir: str, *, config: Optional[DecoderConfig] = None,
                overwrite: bool = False) -> tuple[DecoderConfig, int]:
  """Writes a Hugging Face decoder directory as a Gemma orbax checkpoint.

  Args:
    hf_dir: config.json + safetensors of a Gemma 2/3 model (Llama and Qwen have no Gemma
      layout: their norms, activations or biases differ, refused in one line).
    output_dir: the checkpoint directory to create.
    config: the config the weights must match (default: config.json's).
    overwrite: replace an existing `output_dir`.

  Returns:
    (config, number of parameters).
  """
  stored, params = checkpoints.load_checkpoint(hf_dir, config)
  if os.path.exists(output_dir) and not overwrite:
    raise ConfigError(f"--output_dir {output_dir} exists; pass --overwrite to replace it")
  # Gemma 2 2B's released checkpoint stores its gating weights untransposed ([2, E, F]).
  transpose = not (stored.num_layers == 26 and stored.emb_dim == 2304)
  checkpoints.save_gemma_orbax(output_dir, stored, params, transpose_gating=transpose,
                               overwrite=overwrite)
  return stored, parameter_count(params)


def to_hf(checkpoint: str, config: DecoderConfig, output_dir: str, *,
          overwrite: bool = False) -> int:
  """Writes a decoder checkpoint (Gemma orbax or HF) of `config` as a Hugging Face directory;
  returns the number of parameters."""
  if os.path.exists(output_dir) and not overwrite:
    raise ConfigError(f"--output_dir {output_dir} exists; pass --overwrite to replace it")
  _, params = checkpoints.load_checkpoint(checkpoint, config)
  checkpoints.save_hf_dir(output_dir, config, params, overwrite=overwrite)
  return parameter_count(params)
