"""T5X / orbax parameters -> a Hugging Face T5 directory (config.json + model.safetensors).

The inverse of the loader in `hf.py`: every t5x parameter goes to the Hugging Face name that
`hf.t5x_name` maps onto it (kernels transposed to PyTorch's [out, in]). The output layer:

  T5.1.1 / LM-adapted (logits_via_embedding=False): `lm_head.weight` is written and config.json
    says `tie_word_embeddings: false`; transformers 4.x unties and does not scale, and 5.x
    (which always sets tie_word_embeddings=True) reads it as `scale_decoder_outputs=False` and
    keeps the stored, different lm_head.
  original T5 (logits_via_embedding=True): no `lm_head.weight`, `tie_word_embeddings: true`;
    both versions tie lm_head to `shared` and scale the decoder output by d_model**-0.5.

Checked with transformers 5.23.0 (tests/serve/test_peft.py); the config.json layout is also
what transformers 4.x writes for these models.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np
from flax import traverse_util

from spot_jax import fileio
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import hf
from spot_jax.backbones.t5.config import T5Config

# spot-jax activation -> transformers feed_forward_proj activation.
_FF_NAMES = {"gelu": "gelu_new", "relu": "relu", "gelu_exact": "gelu", "silu": "silu"}


def hf_config(config: T5Config) -> dict[str, Any]:
  """The config.json dict of `config` (raises ValueError for an unsupported activation set)."""
  acts = tuple(config.mlp_activations)
  gated = len(acts) == 2 and acts[1] == "linear"
  if (len(acts) not in (1, 2)) or (len(acts) == 2 and not gated) or acts[0] not in _FF_NAMES:
    raise ConfigError(f"mlp_activations {acts} have no Hugging Face T5 equivalent; valid: (ACT,) "
                      f"or (ACT, 'linear') with ACT in {', '.join(sorted(_FF_NAMES))}")
  ff = "gated-gelu" if acts == ("gelu", "linear") else (
      f"gated-{_FF_NAMES[acts[0]]}" if gated else _FF_NAMES[acts[0]])
  return {
      "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
      "vocab_size": config.vocab_size, "d_model": config.emb_dim, "d_kv": config.head_dim,
      "d_ff": config.mlp_dim, "num_layers": config.num_encoder_layers,
      "num_decoder_layers": config.num_decoder_layers, "num_heads": config.num_heads,
      "relative_attention_num_buckets": config.relative_attention_num_buckets,
      "relative_attention_max_distance": config.relative_attention_max_distance,
      "dropout_rate": config.dropout_rate, "layer_norm_epsilon": config.layer_norm_epsilon,
      "feed_forward_proj": ff, "tie_word_embeddings": bool(config.logits_via_embedding),
      "is_encoder_decoder": True, "decoder_start_token_id": 0, "pad_token_id": 0,
      "eos_token_id": 1, "use_cache": True,
  }


def hf_names(config: T5Config) -> list[str]:
  """Every Hugging Face tensor name a checkpoint of `config` stores (lm_head only if untied)."""
  names = ["shared.weight", "encoder.final_layer_norm.weight", "decoder.final_layer_norm.weight"]
  if not config.logits_via_embedding:
    names.append("lm_head.weight")
  mlp = ["wi_0", "wi_1", "wo"] if len(config.mlp_activations) == 2 else ["wi", "wo"]
  for stack, layers, parts in (
      ("encoder", config.num_encoder_layers, ("SelfAttention", "DenseReluDense")),
      ("decoder", config.num_decoder_layers,
       ("SelfAttention", "EncDecAttention", "DenseReluDense"))):
    for i in range(layers):
      for j, part in enumerate(parts):
        prefix = f"{stack}.block.{i}.layer.{j}"
        names.append(f"{prefix}.layer_norm.weight")
        leaves = mlp if part == "DenseReluDense" else ["q", "k", "v", "o"]
        names += [f"{prefix}.{part}.{leaf}.weight" for leaf in leaves]
        if i == 0 and part == "SelfAttention":
          names.append(f"{prefix}.SelfAttention.relative_attention_bias.weight")
  return names


def hf_tensors(params: Mapping[str, Any], config: T5Config) -> dict[str, np.ndarray]:
  """{Hugging Face name: float32 array} from a t5x parameter tree (nested or "/"-flat).

  Raises:
    ValueError: a parameter is missing, left over (e.g. a prompt subtree) or mis-shaped.
  """
  flat = dict(params) if all(isinstance(k, str) and "/" in k for k in params) else \
      traverse_util.flatten_dict(dict(params), sep="/")
  tied = config.logits_via_embedding
  out, used = {}, set()
  for name in hf_names(config):
    path, transpose = hf.t5x_name(name, tied)
    if path not in flat:
      raise ConfigError(f"the checkpoint lacks {path} (needed for {name}); give the full backbone "
                        f"of a {'tied' if tied else 'untied'} T5 model")
    value = np.asarray(flat[path], np.float32)
    out[name] = np.ascontiguousarray(value.T if transpose else value)
    used.add(path)
  extra = sorted(set(flat) - used)
  if extra:
    raise ConfigError(f"the checkpoint holds parameters a Hugging Face T5 has no place for: "
                      f"{', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}")
  return out


def export_hf(params: Mapping[str, Any], config: T5Config, output_dir: str, *,
              overwrite: bool = False) -> int:
  """Writes config.json and model.safetensors to `output_dir` (via a temporary directory).

  Returns:
    The number of tensors written.
  Raises:
    FileExistsError: `output_dir` exists and `overwrite` is False.
    ValueError: as `hf_tensors` / `hf_config`.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  if os.path.exists(output_dir) and not overwrite:
    raise ConfigError(f"--output_dir {output_dir} exists; pass --overwrite to replace it")
  tensors = hf_tensors(params, config)
  cfg = hf_config(config)
  with fileio.staged_directory(output_dir) as tmp:
    os.makedirs(tmp)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
      json.dump(cfg, f, indent=2, sort_keys=True)
  return len(tensors)
