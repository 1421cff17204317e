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
from spot_jax.t5.config import T5Config

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
WEIGHTS_KEY = "prompt_embeddings"
PEFT_VERSION = "0.21.2"  # the peft version whose output this format was checked against


def adapter_config(prompt_length: int, config: T5Config,
                   base_model_name_or_path: Optional[str] = None) -> dict:
  """The adapter_config.json of an encoder-only prompt of `prompt_length` tokens."""
  return {
      "auto_mapping": None, "base_model_name_or_path": base_model_name_or_path,
      "inference_mode": True, "modules_to_save": None,
      "num_attention_heads": config.num_heads, "num_layers": config.num_encoder_layers,
      "num_transformer_submodules": 1, "num_virtual_tokens": int(prompt_length),
      "peft_type": "PROMPT_TUNING", "peft_version": PEFT_VERSION,
      "prompt_tuning_init": "RANDOM", "prompt_tuning_init_text": None, "revision": None,
      "task_type": "SEQ_2_SEQ_LM", "token_dim": config.emb_dim, "tokenizer_kwargs": None,
      "tokenizer_name_or_path": None,
  }


def export_adapter(prompt: np.ndarray, config: T5Config, output_dir: str, *,
                   base_model_name_or_path: Optional[str] = None, overwrite: bool = False) -> None:
  """Writes a PEFT prompt-tuning adapter for `prompt` [L, E] (via a temporary directory).

  Raises:
    ConfigError: a prompt that is not [L, E] of the model's width, or an existing output.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  prompt = np.asarray(prompt, np.float32)
  if prompt.ndim != 2:
    raise ConfigError(f"a PEFT prompt-tuning adapter holds one [L, E] prompt, got shape "
                      f"{prompt.shape} (SMoP prompts need their router, which peft lacks)")
  if prompt.shape[1] != config.emb_dim:
    raise ConfigError(f"the prompt has width {prompt.shape[1]} but the model's is {config.emb_dim}")
  if os.path.exists(output_dir) and not overwrite:
    raise ConfigError(f"{output_dir} exists; pass --overwrite to replace it")
  with fileio.staged_directory(output_dir) as tmp:
    os.makedirs(tmp)
    save_file({WEIGHTS_KEY: np.ascontiguousarray(prompt)}, os.path.join(tmp, WEIGHTS_FILE),
              metadata={"format": "pt"})
    with open(os.path.join(tmp, CONFIG_FILE), "w", encoding="utf-8") as f:
      json.dump(adapter_config(prompt.shape[0], config, base_model_name_or_path), f, indent=2)


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
  try:
    cfg = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise ConfigError(f"{folder / CONFIG_FILE} is not readable JSON ({type(e).__name__}); give a "
                      f"PEFT adapter directory") from None
  if not isinstance(cfg, dict):
    raise ConfigError(f"{folder / CONFIG_FILE} is not a JSON object; give a PEFT adapter directory")
  peft_type = cfg.get("peft_type")
  if peft_type != "PROMPT_TUNING":
    raise ConfigError(f"{path} is a {peft_type} adapter; only PROMPT_TUNING adapters hold a soft "
                      f"prompt")
  if cfg.get("task_type") not in (None, "SEQ_2_SEQ_LM"):
    raise ConfigError(f"{path} is a {cfg.get('task_type')} adapter; a T5 prompt is SEQ_2_SEQ_LM")
  if cfg.get("num_transformer_submodules", 1) != 1:
    raise ConfigError(f"{path} has num_transformer_submodules="
                      f"{cfg.get('num_transformer_submodules')} (a decoder prompt as well); "
                      f"spot-jax prompts are encoder-only (1)")
  prompt = _read_weights(folder)
  length, width = cfg.get("num_virtual_tokens"), cfg.get("token_dim")
  if prompt.ndim != 2 or (length, width) != prompt.shape:
    raise ConfigError(f"{path}: {WEIGHTS_KEY} has shape {prompt.shape} but the config says "
                      f"[{length}, {width}]")
  if config is not None:
    want = {"token_dim": config.emb_dim, "num_attention_heads": config.num_heads,
            "num_layers": config.num_encoder_layers}
    wrong = [f"{k}={cfg.get(k)} (model: {v})" for k, v in want.items()
             if cfg.get(k) is not None and cfg.get(k) != v]
    if wrong:
      raise ConfigError(f"{path} was made for another base model: {', '.join(wrong)}; give an "
                        f"adapter trained on this model")
  if not np.all(np.isfinite(prompt)):
    raise ConfigError(f"{path}: the prompt holds NaN or infinite values")
  return prompt


def _read_weights(folder: pathlib.Path) -> np.ndarray:
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
  if WEIGHTS_KEY not in tensors:
    raise ConfigError(f"{folder}: the weights hold {sorted(tensors)} but no {WEIGHTS_KEY!r}; only "
                      f"prompt-tuning adapters can be read")
  return np.asarray(tensors[WEIGHTS_KEY], np.float32)


def initializer(path: str, config: Optional[T5Config] = None) -> initializers.Initializer:
  """A prompt initialiser (see `spot_jax.prompts.initializers`) from a PEFT adapter."""
  return initializers.from_array(read_adapter(path, config), source=f"peft adapter {path}")


def export_npy(prompt: np.ndarray, path: str) -> None:
  """Writes [L, E] float32 as a bare .npy (google-research/prompt-tuning's format), atomically."""
  prompt = np.asarray(prompt, np.float32)
  if prompt.ndim != 2:
    raise ConfigError(f"a prompt-tuning .npy holds one [L, E] prompt, got shape {prompt.shape}")
  fileio.save_npy(pathlib.Path(path), prompt)
