"""Hugging Face PEFT prompt-tuning adapters and google-research/prompt-tuning .npy prompts.

A PEFT adapter directory, as peft 0.21 writes it for T5 with an encoder-only prompt:

  adapter_config.json          {"peft_type": "PROMPT_TUNING", "task_type": "SEQ_2_SEQ_LM",
                                "num_virtual_tokens": L, "token_dim": E,
                                "num_transformer_submodules": 1, "num_attention_heads": H,
                                "num_layers": encoder layers, "base_model_name_or_path": ...}
  adapter_model.safetensors    {"prompt_embeddings": [L, E] float32}

peft prepends the prompt to the embedded encoder input (spot-jax's "prefix" placement); a
Residual prompt is exported folded, an SMoP export is refused (peft has no router). The
.npy format of google-research/prompt-tuning is a bare float32 [L, E] array.

PREFIX_TUNING adapters (peft's prefix tuning, decoder self-attention prefixes on T5) are read
and written by the functions of the last section (`export_prefix_adapter`,
`read_prefix_adapter`, `prefix_initializer`).
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Optional

import numpy as np

from spot_jax import fileio
from spot_jax.errors import ConfigError
from spot_jax.prompts import initializers
from spot_jax.backbones.t5.config import T5Config

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
WEIGHTS_KEY = "prompt_embeddings"
PREFIX_TUNING = "PREFIX_TUNING"
PEFT_VERSION = "0.21.2"  # the peft version whose output this format was checked against


def prompt_config(task_type: str, length: int, token_dim: int, heads: int, layers: int,
                  base_model_name_or_path: Optional[str]) -> dict:
  """The adapter_config.json of a PROMPT_TUNING adapter of `length` virtual tokens, as peft
  writes it for `task_type` ("SEQ_2_SEQ_LM", "CAUSAL_LM")."""
  return {
      "auto_mapping": None, "base_model_name_or_path": base_model_name_or_path,
      "inference_mode": True, "modules_to_save": None,
      "num_attention_heads": heads, "num_layers": layers,
      "num_transformer_submodules": 1, "num_virtual_tokens": int(length),
      "peft_type": "PROMPT_TUNING", "peft_version": PEFT_VERSION,
      "prompt_tuning_init": "RANDOM", "prompt_tuning_init_text": None, "revision": None,
      "task_type": task_type, "token_dim": token_dim, "tokenizer_kwargs": None,
      "tokenizer_name_or_path": None,
  }


def prefix_config(task_type: str, length: int, heads: int, head_dim: int, layers: int,
                  submodules: int, base_model_name_or_path: Optional[str]) -> dict:
  """The adapter_config.json of a PREFIX_TUNING adapter of `length` plain (unprojected, or
  folded) prefixes of `heads` x `head_dim`, as peft writes it for `task_type`."""
  width = heads * head_dim
  return {
      "auto_mapping": None, "base_model_name_or_path": base_model_name_or_path,
      "encoder_hidden_size": width, "inference_mode": True, "init_weights": None,
      "modules_to_save": None, "num_attention_heads": heads,
      "num_layers": layers, "num_transformer_submodules": submodules,
      "num_virtual_tokens": int(length), "peft_type": PREFIX_TUNING, "peft_version": PEFT_VERSION,
      "prefix_projection": False, "revision": None, "task_type": task_type,
      "token_dim": width,
  }


def adapter_config(prompt_length: int, config: T5Config,
                   base_model_name_or_path: Optional[str] = None) -> dict:
  """The adapter_config.json of an encoder-only prompt of `prompt_length` tokens."""
  return prompt_config("SEQ_2_SEQ_LM", prompt_length, config.emb_dim, config.num_heads,
                       config.num_encoder_layers, base_model_name_or_path)


def checked_prompt(prompt: np.ndarray, emb_dim: int, hint: str = "") -> np.ndarray:
  """`prompt` as float32 [L, E] with E = `emb_dim` (raises ConfigError; `hint` ends the
  message of a prompt that is not [L, E])."""
  prompt = np.asarray(prompt, np.float32)
  if prompt.ndim != 2:
    raise ConfigError(f"a PEFT prompt-tuning adapter holds one [L, E] prompt, got shape "
                      f"{prompt.shape}{hint}")
  if prompt.shape[1] != emb_dim:
    raise ConfigError(f"the prompt has width {prompt.shape[1]} but the model's is {emb_dim}")
  return prompt


def export_adapter(prompt: np.ndarray, config: T5Config, output_dir: str, *,
                   base_model_name_or_path: Optional[str] = None, overwrite: bool = False) -> None:
  """Writes a PEFT prompt-tuning adapter for `prompt` [L, E] (via a temporary directory).

  Raises:
    ConfigError: a prompt that is not [L, E] of the model's width, or an existing output.
  """
  prompt = checked_prompt(prompt, config.emb_dim,
                          " (SMoP prompts need their router, which peft lacks)")
  write_adapter(output_dir, {WEIGHTS_KEY: prompt},
                adapter_config(prompt.shape[0], config, base_model_name_or_path), overwrite)


def write_adapter(output_dir: str, tensors: dict, adapter_cfg: dict, overwrite: bool) -> None:
  """A peft adapter directory (safetensors weights + adapter_config.json), written staged: an
  existing `output_dir` is replaced only with `overwrite`, and only once the new one is whole."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  if os.path.exists(output_dir) and not overwrite:
    raise ConfigError(f"{output_dir} exists; pass --overwrite to replace it")
  with fileio.staged_directory(output_dir) as tmp:
    os.makedirs(tmp)
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
              os.path.join(tmp, WEIGHTS_FILE), metadata={"format": "pt"})
    with open(os.path.join(tmp, CONFIG_FILE), "w", encoding="utf-8") as f:
      json.dump(adapter_cfg, f, indent=2)


def read_config(path: str) -> dict:
  """An adapter directory's adapter_config.json, a JSON object (else one line naming it)."""
  file = pathlib.Path(path) / CONFIG_FILE
  try:
    cfg = json.loads(file.read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise ConfigError(f"{file} is not readable JSON ({type(e).__name__}); give a PEFT adapter "
                      f"directory") from None
  if not isinstance(cfg, dict):
    raise ConfigError(f"{file} is not a JSON object; give a PEFT adapter directory")
  return cfg


def check_base_model(cfg: dict, config: Optional[T5Config], path: str) -> None:
  """An adapter config made for another model (width, heads, layers) is refused in one line."""
  if config is None:
    return
  want = {"token_dim": config.emb_dim, "num_attention_heads": config.num_heads,
          "num_layers": config.num_encoder_layers}
  wrong = [f"{k}={cfg.get(k)} (model: {v})" for k, v in want.items()
           if cfg.get(k) is not None and cfg.get(k) != v]
  if wrong:
    raise ConfigError(f"{path} was made for another base model: {', '.join(wrong)}; give an "
                      f"adapter trained on this model")


def read_adapter(path: str, config: Optional[T5Config] = None) -> np.ndarray:
  """The [L, E] float32 prompt of a PEFT prompt-tuning adapter directory.

  Args:
    path: the adapter directory.
    config: the base model it must fit (width, heads, encoder layers), if known.

  Raises:
    ConfigError: a missing/malformed file, another peft type or task, a decoder-side prompt,
      or an adapter made for another base model.
  """
  folder = pathlib.Path(path)
  cfg = read_config(path)
  peft_type = cfg.get("peft_type")
  if peft_type != "PROMPT_TUNING":
    raise ConfigError(f"{path} is a {peft_type} adapter; only PROMPT_TUNING adapters hold a soft "
                      f"prompt")
  check_encoder_prompt(cfg, path)
  prompt = _read_weights(folder)
  length, width = cfg.get("num_virtual_tokens"), cfg.get("token_dim")
  if prompt.ndim != 2 or (length, width) != prompt.shape:
    raise ConfigError(f"{path}: {WEIGHTS_KEY} has shape {prompt.shape} but the config says "
                      f"[{length}, {width}]")
  check_base_model(cfg, config, path)
  if not np.all(np.isfinite(prompt)):
    raise ConfigError(f"{path}: the prompt holds NaN or infinite values")
  return prompt


def check_encoder_prompt(cfg: dict, path: str) -> None:
  """An input-prompt adapter's config is a seq2seq one with an encoder-side prompt only."""
  if cfg.get("task_type") not in (None, "SEQ_2_SEQ_LM"):
    raise ConfigError(f"{path} is a {cfg.get('task_type')} adapter; a T5 prompt is SEQ_2_SEQ_LM")
  if cfg.get("num_transformer_submodules", 1) != 1:
    raise ConfigError(f"{path} has num_transformer_submodules="
                      f"{cfg.get('num_transformer_submodules')} (a decoder prompt as well); "
                      f"spot-jax prompts are encoder-only (1)")


def _read_weights(folder: pathlib.Path) -> np.ndarray:
  tensors = read_tensors(folder)
  if WEIGHTS_KEY not in tensors:
    raise ConfigError(f"{folder}: the weights hold {sorted(tensors)} but no {WEIGHTS_KEY!r}; only "
                      f"prompt-tuning adapters can be read")
  return np.asarray(tensors[WEIGHTS_KEY], np.float32)


def read_weights(path: str, expected: tuple[int, int]) -> np.ndarray:
  """prompt_embeddings of the adapter `path`, float32, of shape `expected`, finite (else one
  line)."""
  tensors = read_tensors(pathlib.Path(path))
  if WEIGHTS_KEY not in tensors:
    raise ConfigError(f"{path}: the weights hold {sorted(tensors)} but no {WEIGHTS_KEY!r}")
  array = np.asarray(tensors[WEIGHTS_KEY], np.float32)
  if array.shape != expected:
    raise ConfigError(f"{path}: {WEIGHTS_KEY} has shape {list(array.shape)} but the config says "
                      f"{list(expected)}")
  if not np.all(np.isfinite(array)):
    raise ConfigError(f"{path}: {WEIGHTS_KEY} holds NaN or infinite values")
  return array


def read_tensors(folder: pathlib.Path) -> dict:
  """An adapter directory's tensors by name (adapter_model.safetensors, else adapter_model.bin)."""
  safetensors_file, bin_file = folder / WEIGHTS_FILE, folder / "adapter_model.bin"
  try:
    if safetensors_file.exists():
      from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
      tensors = load_file(str(safetensors_file))
    elif bin_file.exists():
      import torch  # pylint: disable=g-import-not-at-top
      tensors = {k: v.float().numpy()
                 for k, v in torch.load(bin_file, map_location="cpu", weights_only=True).items()}
    else:
      raise ConfigError(f"{folder} holds no {WEIGHTS_FILE} (or adapter_model.bin)")
  except ConfigError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError(f"{folder}: the adapter weights are unreadable ({type(e).__name__}); give "
                      f"a PEFT adapter directory") from None
  return tensors


def initializer(path: str, config: Optional[T5Config] = None) -> initializers.Initializer:
  """A prompt initialiser (see `spot_jax.prompts.initializers`) from a PEFT adapter."""
  return initializers.from_array(read_adapter(path, config), source=f"peft adapter {path}")


def export_npy(prompt: np.ndarray, path: str) -> None:
  """Writes [L, E] float32 as a bare .npy (google-research/prompt-tuning's format), atomically."""
  prompt = np.asarray(prompt, np.float32)
  if prompt.ndim != 2:
    raise ConfigError(f"a prompt-tuning .npy holds one [L, E] prompt, got shape {prompt.shape}")
  fileio.save_npy(pathlib.Path(path), prompt)


# --- PREFIX_TUNING adapters ----------------------------------------------------------------
#
# peft 0.21.2 writes, for T5 (SEQ_2_SEQ_LM), adapter_config.json with "peft_type":
# "PREFIX_TUNING", "num_virtual_tokens": P, "token_dim": T (= H * D for the prefix to fit),
# "num_attention_heads": H, "num_layers": n (the encoder's depth), "num_transformer_submodules": 2,
# "prefix_projection", "encoder_hidden_size"; and adapter_model.safetensors with
# "prompt_embeddings" [P, 2 n T]: the plain prefixes (the projection MLP's output when it had
# one: peft saves and loads prefix adapters folded). Only decoder self-attention reads them, layer
# i its key from slot 4i mod 2n and its value from slot 4i+1 mod 2n (see
# `spot_jax.prompts.prefix_tuning`, layout "peft").



def peft_type(path: str) -> Optional[str]:
  """The peft_type of the adapter directory `path`, or None when it has no adapter_config.json."""
  file = pathlib.Path(path) / CONFIG_FILE
  if not file.is_file():
    return None
  try:
    cfg = json.loads(file.read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None
  return cfg.get("peft_type") if isinstance(cfg, dict) else None


def prefix_adapter_config(length: int, config: T5Config,
                          base_model_name_or_path: Optional[str] = None) -> dict:
  """The adapter_config.json of a T5 prefix adapter of `length` virtual tokens (folded)."""
  return prefix_config("SEQ_2_SEQ_LM", length, config.num_heads, config.head_dim,
                       config.num_encoder_layers, 2, base_model_name_or_path)


def _peft_slots(config: T5Config) -> list[tuple[int, int]]:
  from spot_jax.prompts import prefix_tuning  # pylint: disable=g-import-not-at-top
  return prefix_tuning.slot_map(("decoder",), "peft", config)["decoder"]


def prefix_embeddings(parts: dict, config: T5Config) -> np.ndarray:
  """A deep prompt's plain prefixes as peft's prompt_embeddings [P, 2 n T].

  Raises:
    ConfigError: prefixes peft cannot place (encoder or cross-attention ones, deep prompt
      tokens, two decoder layers that peft's layout gives one slot but that differ, unequal
      stack depths).
  """
  others = sorted(set(parts) - {"decoder"})
  if others or "decoder" not in parts:
    raise ConfigError(f"peft's prefix tuning reaches only T5's decoder self-attention; this prompt "
                      f"has {', '.join(others) or 'no decoder'} prefixes (export a PrefixTuning "
                      f"trained with attention=('decoder',))")
  if config.num_encoder_layers != config.num_decoder_layers:
    raise ConfigError(f"peft sizes T5 prefixes by the encoder ({config.num_encoder_layers} layers) "
                      f"but the decoder has {config.num_decoder_layers}; no adapter fits")
  kv = np.asarray(parts["decoder"], np.float32)  # [layers, 2, P, H, D]
  layers, _, length, heads, depth = kv.shape
  slots = np.zeros((length, 2 * config.num_encoder_layers, heads * depth), np.float32)
  owner: dict[int, int] = {}
  for i, pair in enumerate(_peft_slots(config)):
    for j, slot in enumerate(pair):
      value = kv[i, j].reshape(length, heads * depth)
      if slot in owner and not np.array_equal(slots[:, slot], value):
        raise ConfigError(f"decoder layers {owner[slot]} and {i} share one prefix slot in peft's "
                          f"T5 layout but differ here; train with PrefixTuning(layout='peft') to "
                          f"export to peft")
      owner[slot] = i
      slots[:, slot] = value
  return slots.reshape(length, -1)


def export_prefix_adapter(parts: dict, config: T5Config, output_dir: str, *,
                          base_model_name_or_path: Optional[str] = None,
                          overwrite: bool = False) -> None:
  """Writes a peft PREFIX_TUNING adapter of a deep prompt's decoder prefixes (staged).

  Raises:
    ConfigError: as `prefix_embeddings`, or an existing output.
  """
  embeddings = prefix_embeddings(parts, config)
  write_adapter(output_dir, {WEIGHTS_KEY: embeddings},
                prefix_adapter_config(embeddings.shape[0], config, base_model_name_or_path),
                overwrite)


def read_prefix_embeddings(path: str, config: T5Config) -> np.ndarray:
  """peft's prompt_embeddings [P, 2 n T] of a T5 PREFIX_TUNING adapter made for `config`.

  Raises:
    ConfigError: a missing/malformed file, another peft type or task, or another base model.
  """
  cfg = read_config(path)
  if cfg.get("peft_type") != PREFIX_TUNING:
    raise ConfigError(f"{path} is a {cfg.get('peft_type')} adapter, not {PREFIX_TUNING}")
  if cfg.get("task_type") not in (None, "SEQ_2_SEQ_LM") or \
      cfg.get("num_transformer_submodules", 2) != 2:
    raise ConfigError(f"{path} is a {cfg.get('task_type')} prefix adapter with "
                      f"num_transformer_submodules={cfg.get('num_transformer_submodules')}; a T5 "
                      f"prefix adapter is SEQ_2_SEQ_LM with 2")
  want = {"token_dim": config.num_heads * config.head_dim, "num_attention_heads": config.num_heads,
          "num_layers": config.num_encoder_layers}
  wrong = [f"{k}={cfg.get(k)} (model: {v})" for k, v in want.items() if cfg.get(k) != v]
  if wrong:
    raise ConfigError(f"{path} was made for another base model: {', '.join(wrong)}; give an "
                      f"adapter trained on this model")
  return read_weights(path, (cfg.get("num_virtual_tokens"),
                             2 * config.num_encoder_layers * want["token_dim"]))


def read_prefix_adapter(path: str, config: T5Config) -> dict:
  """The deep prompt parts {"decoder": [layers, 2, P, H, D]} of a peft PREFIX_TUNING adapter."""
  if config.num_encoder_layers != config.num_decoder_layers:
    raise ConfigError(f"peft's T5 prefix layout needs as many decoder as encoder layers; the model "
                      f"has {config.num_encoder_layers} and {config.num_decoder_layers}")
  embeddings = read_prefix_embeddings(path, config)
  slots = embeddings.reshape(embeddings.shape[0], -1, config.num_heads, config.head_dim)
  kv = np.stack([np.stack([slots[:, k], slots[:, v]]) for k, v in _peft_slots(config)])
  return {"decoder": kv.astype(np.float32)}


def prefix_initializer(path: str, config: T5Config) -> initializers.Initializer:
  """An initialiser of PrefixTuning(layout='peft') plain prefixes from a peft prefix adapter."""
  return initializers.from_array(read_prefix_embeddings(path, config),
                                 source=f"peft prefix adapter {path}")
