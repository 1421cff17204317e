"""Hugging Face PEFT adapters (task_type CAUSAL_LM) of decoder-only soft prompts, both ways.

As peft 0.21.2 writes them for a decoder-only model (LlamaForCausalLM, Gemma3ForCausalLM):

  PROMPT_TUNING  adapter_config.json {"peft_type": "PROMPT_TUNING", "task_type": "CAUSAL_LM",
                 "num_virtual_tokens": L, "token_dim": E, "num_attention_heads": H,
                 "num_layers": n, "num_transformer_submodules": 1, ...};
                 adapter_model.safetensors {"prompt_embeddings": [L, E]}. peft prepends it to
                 the embedded input (after Gemma's sqrt(E) scaling), and positions count it:
                 spot-jax's PromptTuning on `DecoderLM`. A Residual prompt goes out folded.
  PREFIX_TUNING  {"peft_type": "PREFIX_TUNING", "task_type": "CAUSAL_LM", "token_dim": K*D,
                 "num_attention_heads": K, "prefix_projection": false, ...}, where K is the
                 number of key/value heads (peft sizes prefixes by them under grouped-query
                 attention) and D the head size; {"prompt_embeddings": [P, n*2*K*D]}, viewed
                 [P, 2n, K, D]: layer i's key is slot 2i, its value slot 2i+1. peft hands them to
                 the model as a cache of length P (no RoPE, no norm on them); the real tokens sit
                 at positions P.. — `DecoderLM(...)(tokens, prefixes=...)`.

Prefixes travel here as one array kv [n, 2, P, K, D] (layer, key/value, position, head, depth);
`decoder_prefixes(kv)` gives the network's per-layer (key, value) pairs. Reading refuses, in one
line, another peft or task type and an adapter whose sizes are not the backbone's (both named);
a prefix adapter trained with `prefix_projection` reads as any other (peft saves it folded).
"""
from __future__ import annotations

import pathlib
from typing import Optional

import numpy as np

from spot_jax.backbones.decoder.config import DecoderConfig
from spot_jax.errors import ConfigError
from spot_jax.prompts import initializers
from spot_jax.serve.export import peft_io

CAUSAL_LM = "CAUSAL_LM"
PROMPT_TUNING = "PROMPT_TUNING"
PREFIX_TUNING = peft_io.PREFIX_TUNING
WEIGHTS_KEY = peft_io.WEIGHTS_KEY


def prompt_adapter_config(length: int, config: DecoderConfig,
                          base_model_name_or_path: Optional[str] = None) -> dict:
  """The adapter_config.json of a `length`-token input prompt on the decoder `config`."""
  return peft_io.prompt_config(CAUSAL_LM, length, config.emb_dim, config.num_heads,
                               config.num_layers, base_model_name_or_path)


def prefix_adapter_config(length: int, config: DecoderConfig,
                          base_model_name_or_path: Optional[str] = None) -> dict:
  """The adapter_config.json of `length` plain (unprojected) prefixes on the decoder `config`."""
  return peft_io.prefix_config(CAUSAL_LM, length, config.num_kv_heads, config.head_dim,
                               config.num_layers, 1, base_model_name_or_path)


def export_prompt_adapter(prompt: np.ndarray, config: DecoderConfig, output_dir: str, *,
                          base_model_name_or_path: Optional[str] = None,
                          overwrite: bool = False) -> None:
  """Writes a CAUSAL_LM PROMPT_TUNING adapter of `prompt` [L, E] (staged, then renamed).

  A Residual prompt is exported folded: pass `spot_jax.prompts.effective_prompt(module, params)`.

  Raises:
    ConfigError: a prompt that is not [L, E] of the model's width, or an existing output.
  """
  prompt = peft_io.checked_prompt(prompt, config.emb_dim)
  peft_io.write_adapter(output_dir, {WEIGHTS_KEY: prompt},
                        prompt_adapter_config(prompt.shape[0], config, base_model_name_or_path),
                        overwrite)


def prefix_embeddings(kv: np.ndarray, config: DecoderConfig) -> np.ndarray:
  """Prefixes kv [n, 2, P, K, D] as peft's prompt_embeddings [P, n*2*K*D] (slots 2i, 2i+1).

  Raises:
    ConfigError: kv of another shape than the model's layers, key/value heads and head size.
  """
  kv = np.asarray(kv, np.float32)
  want = (config.num_layers, 2, config.num_kv_heads, config.head_dim)
  if kv.ndim != 5 or (kv.shape[0], kv.shape[1], kv.shape[3], kv.shape[4]) != want:
    raise ConfigError(f"prefixes of shape {kv.shape} do not fit the model: want [layers=, 2, P, "
                      f"kv_heads=, head_dim=] = [{want[0]}, 2, P, {want[2]}, {want[3]}]")
  layers, _, length, heads, depth = kv.shape
  # [n, 2, P, K, D] -> [P, n, 2, K, D]: slot 2i + j of the [P, 2n, K, D] view is layer i's j.
  return np.ascontiguousarray(kv.transpose(2, 0, 1, 3, 4)).reshape(
      length, layers * 2 * heads * depth)


def export_prefix_adapter(kv: np.ndarray, config: DecoderConfig, output_dir: str, *,
                          base_model_name_or_path: Optional[str] = None,
                          overwrite: bool = False) -> None:
  """Writes a CAUSAL_LM PREFIX_TUNING adapter of prefixes kv [n, 2, P, K, D] (staged).

  Raises:
    ConfigError: as `prefix_embeddings`, or an existing output.
  """
  embeddings = prefix_embeddings(kv, config)
  peft_io.write_adapter(output_dir, {WEIGHTS_KEY: embeddings},
                        prefix_adapter_config(embeddings.shape[0], config,
                                              base_model_name_or_path), overwrite)


def _check_config(path: str, cfg: dict, peft_type: str, want: dict) -> None:
  """Another peft type, task type or base model (sizes: the adapter's and the model's)."""
  if cfg.get("peft_type") != peft_type:
    raise ConfigError(f"{path} is a {cfg.get('peft_type')} adapter, not {peft_type}; give a "
                      f"{peft_type} adapter")
  if cfg.get("task_type") != CAUSAL_LM:
    raise ConfigError(f"{path} is a {cfg.get('task_type')} adapter; a decoder-only model's is "
                      f"{CAUSAL_LM}")
  if cfg.get("num_transformer_submodules", 1) != 1:
    raise ConfigError(f"{path} has num_transformer_submodules="
                      f"{cfg.get('num_transformer_submodules')}; a decoder-only model has 1")
  wrong = [f"{k}={cfg.get(k)} (model: {v})" for k, v in want.items() if cfg.get(k) != v]
  if wrong:
    raise ConfigError(f"{path} was made for another base model: {', '.join(wrong)}; give an "
                      f"adapter trained on this model")


def read_prompt_adapter(path: str, config: DecoderConfig) -> np.ndarray:
  """The prompt [L, E] float32 (PromptTuning's `prompt`) of a CAUSAL_LM PROMPT_TUNING adapter.

  Raises:
    ConfigError: a missing/malformed file, another peft or task type, or another base model.
  """
  cfg = peft_io.read_config(path)
  _check_config(path, cfg, PROMPT_TUNING, {
      "token_dim": config.emb_dim, "num_attention_heads": config.num_heads,
      "num_layers": config.num_layers})
  return peft_io.read_weights(path, (cfg.get("num_virtual_tokens"), config.emb_dim))


def initializer(path: str, config: DecoderConfig) -> initializers.Initializer:
  """A PromptTuning `prompt_init` from a CAUSAL_LM PROMPT_TUNING adapter (training starts there)."""
  return initializers.from_array(read_prompt_adapter(path, config),
                                 source=f"peft adapter {path}")


def read_prefix_adapter(path: str, config: DecoderConfig) -> np.ndarray:
  """Prefixes kv [n, 2, P, K, D] float32 of a CAUSAL_LM PREFIX_TUNING adapter (see module doc).

  Raises:
    ConfigError: a missing/malformed file, another peft or task type, or another base model.
  """
  cfg = peft_io.read_config(path)
  heads, depth, layers = config.num_kv_heads, config.head_dim, config.num_layers
  _check_config(path, cfg, PREFIX_TUNING, {
      "token_dim": heads * depth, "num_attention_heads": heads, "num_layers": layers})
  length = cfg.get("num_virtual_tokens")
  embeddings = peft_io.read_weights(path, (length, layers * 2 * heads * depth))
  return np.ascontiguousarray(
      embeddings.reshape(length, layers, 2, heads, depth).transpose(1, 2, 0, 3, 4))


def decoder_prefixes(kv: np.ndarray) -> tuple:
  """kv [n, 2, P, K, D] -> DecoderLM's `prefixes`: per layer (key, value), each [1, P, K, D]."""
  kv = np.asarray(kv, np.float32)
  return tuple((layer[0][None], layer[1][None]) for layer in kv)
