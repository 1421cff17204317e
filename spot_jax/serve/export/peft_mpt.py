"""Hugging Face PEFT MULTITASK_PROMPT_TUNING adapters <-> spot-jax `MultitaskPrompt` parameters.

An adapter directory as peft 0.21 writes it for T5 with an encoder-only prompt:

  adapter_config.json        the prompt-tuning fields (`peft_io.adapter_config`) with
                             "peft_type": "MULTITASK_PROMPT_TUNING", "num_tasks": K,
                             "num_ranks": r, "prompt_tuning_init": "RANDOM",
                             "prompt_tuning_init_state_dict_path": null, "prompt_tuning_init_task":
                             0
  adapter_model.safetensors  {"prompt_embeddings": P* [L, E], "prefix_task_cols": U [K, L, r],
                              "prefix_task_rows": V [K, r, E]} float32

peft computes task k's prompt as P* o (U_k V_k) and prepends it to the embedded encoder input,
as `MultitaskPrompt` does with "prefix" placement (task_ids there, task_index here).

`initializer` starts a target's `MultitaskPrompt` from an MPT source (an adapter or a
spot_jax.train run directory), with PEFT's choices for the factors: "average" (the mean of the
sources' U and of their V: AVERAGE_SOURCE_TASKS), "task" (one source task's: EXACT_SOURCE_TASK).
"""
from __future__ import annotations

import json
import pathlib
import sys
from typing import Optional

import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import initializers
from spot_jax.serve.export import peft_io
from spot_jax.backbones.t5.config import T5Config

PEFT_TYPE = "MULTITASK_PROMPT_TUNING"
KEYS = {"shared": "prompt_embeddings", "task_cols": "prefix_task_cols",
        "task_rows": "prefix_task_rows"}
FACTORS = ("average", "task")


def _check(arrays: dict, where: str) -> tuple[int, int, int, int]:
  """(L, E, K, r) of {"shared", "task_cols", "task_rows"}, or a ConfigError naming `where`."""
  missing = sorted(set(KEYS) - set(arrays))
  if missing:
    raise ConfigError(f"{where}: lacks {missing}; an MPT prompt has shared, task_cols, task_rows")
  shared, cols, rows = (np.asarray(arrays[k]) for k in ("shared", "task_cols", "task_rows"))
  if shared.ndim != 2 or cols.ndim != 3 or rows.ndim != 3:
    raise ConfigError(f"{where}: shapes {shared.shape}, {cols.shape}, {rows.shape}; expected "
                      f"[L, E], [K, L, r], [K, r, E]")
  length, embed = shared.shape
  k, r = cols.shape[0], cols.shape[2]
  if cols.shape[1] != length or rows.shape != (k, r, embed):
    raise ConfigError(f"{where}: shapes {shared.shape}, {cols.shape}, {rows.shape} do not agree; "
                      f"expected [L, E], [K, L, r], [K, r, E]")
  if not all(np.all(np.isfinite(a)) for a in (shared, cols, rows)):
    raise ConfigError(f"{where}: the prompt holds NaN or infinite values; give a finite prompt")
  return length, embed, k, r


def adapter_config(length: int, num_tasks: int, rank: int, config: T5Config,
                   base_model_name_or_path: Optional[str] = None) -> dict:
  """The adapter_config.json of an encoder-only MPT prompt."""
  cfg = peft_io.adapter_config(length, config, base_model_name_or_path)
  cfg.update(peft_type=PEFT_TYPE, num_tasks=int(num_tasks), num_ranks=int(rank),
             prompt_tuning_init="RANDOM", prompt_tuning_init_state_dict_path=None,
             prompt_tuning_init_task=0)
  return cfg


def export_adapter(arrays: dict, config: T5Config, output_dir: str, *,
                   base_model_name_or_path: Optional[str] = None, overwrite: bool = False) -> None:
  """Writes a PEFT MPT adapter of `arrays` ({"shared", "task_cols", "task_rows"}, see
  `MultitaskPrompt.shared_and_factors`), via a temporary directory.

  Raises:
    ConfigError: shapes that do not make an MPT prompt of the model's width, or an existing output.
  """
  length, embed, k, r = _check(arrays, "the MPT prompt")
  if embed != config.emb_dim:
    raise ConfigError(f"the MPT prompt has width {embed} but the model's is {config.emb_dim}; give "
                      "a prompt trained for this model")
  peft_io.write_adapter(output_dir, {KEYS[n]: a for n, a in arrays.items() if n in KEYS},
                        adapter_config(length, k, r, config, base_model_name_or_path), overwrite)


def adapter_type(path: str) -> Optional[str]:
  """The peft_type of the adapter directory `path` (None when its config is unreadable)."""
  try:
    cfg = json.loads((pathlib.Path(path) / peft_io.CONFIG_FILE).read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None
  return cfg.get("peft_type") if isinstance(cfg, dict) else None


def read_adapter(path: str, config: Optional[T5Config] = None) -> dict[str, np.ndarray]:
  """{"shared": [L, E], "task_cols": [K, L, r], "task_rows": [K, r, E]} of a PEFT MPT adapter.

  Raises:
    ConfigError: another peft type, a decoder-side prompt, shapes that disagree with the config,
      or an adapter made for another base model.
  """
  folder = pathlib.Path(path)
  cfg = peft_io.read_config(str(folder))
  if cfg.get("peft_type") != PEFT_TYPE:
    raise ConfigError(f"{path} is a {cfg.get('peft_type')} adapter, not {PEFT_TYPE}; give a "
                      f"multitask prompt-tuning adapter")
  peft_io.check_encoder_prompt(cfg, str(path))
  tensors = peft_io.read_tensors(folder)
  arrays = {n: np.asarray(tensors[key], np.float32) for n, key in KEYS.items() if key in tensors}
  length, embed, k, r = _check(arrays, str(path))
  said = (cfg.get("num_virtual_tokens"), cfg.get("token_dim"), cfg.get("num_tasks", 1),
          cfg.get("num_ranks", 1))
  if said != (length, embed, k, r):
    raise ConfigError(f"{path}: the weights are [L, E, K, r] = {[length, embed, k, r]} but the "
                      f"config says {list(said)}; give an adapter as peft writes it")
  peft_io.check_base_model(cfg, config, str(path))
  return arrays


def source_arrays(source: str, config: Optional[T5Config] = None) -> dict[str, np.ndarray]:
  """The MPT arrays of a PEFT MPT adapter or of a spot_jax.train run of a MultitaskPrompt."""
  folder = pathlib.Path(source)
  if (folder / peft_io.CONFIG_FILE).is_file():
    return read_adapter(source, config)
  from spot_jax.run_dir import RunDir  # pylint: disable=g-import-not-at-top
  params = RunDir(folder).prompt_params(warn=lambda line: print(line, file=sys.stderr))
  if "task_cols" not in params or "shared" not in params:
    raise ConfigError(f"{source} is neither a PEFT MPT adapter nor the run of a MultitaskPrompt "
                      f"with a trained shared prompt (its prompt parameters: {sorted(params)}); "
                      "give a gin/prompts/mpt_distill.gin run or a PEFT MPT adapter")
  arrays = {n: np.asarray(params[n], np.float32) for n in KEYS}
  _check(arrays, source)
  return arrays


def initializer(source: str, part: str, factors: str = "average", task: int = 0
                ) -> initializers.Initializer:
  """An initialiser of a target MultitaskPrompt's `part` ("shared", "task_cols", "task_rows")
  from an MPT source (read now, at configuration time: the trainer creates prompts under jit).

  Args:
    source: a PEFT MPT adapter directory or a spot_jax.train run directory of a MultitaskPrompt.
    part: which parameter it fills.
    factors: for the factors, "average" (mean over the source tasks) or "task" (source task
      `task`'s), as PEFT's AVERAGE_SOURCE_TASKS / EXACT_SOURCE_TASK.
    task: the source task for factors="task".
  """
  validate.one_of(part, "peft_mpt.initializer part", KEYS)
  validate.one_of(factors, "peft_mpt.initializer factors", FACTORS)

  start = source_arrays(source)[part]
  if part != "shared":
    if factors == "task":
      if not 0 <= task < start.shape[0]:
        raise ConfigError(f"{source} has {start.shape[0]} source tasks; task={task} is not one")
      start = start[task:task + 1]
    else:
      start = start.mean(axis=0, keepdims=True)

  def init(rng, shape, embedding):
    del rng, embedding
    value = (start if part == "shared"
             else np.broadcast_to(start, (int(shape[0]),) + start.shape[1:]))
    if tuple(value.shape) != tuple(shape):
      raise ConfigError(f"{source}: its {part} has shape {value.shape}, the prompt needs "
                        f"{tuple(shape)} (length, width and rank must match)")
    return np.array(value, np.float32)

  return init


def source_part(source: str, part: str = "shared") -> np.ndarray:
  """One array of an MPT source (e.g. its shared prompt, for a target's `frozen_shared`)."""
  if part not in KEYS:
    raise ConfigError(f"peft_mpt.source_part part={part!r}; valid: {', '.join(KEYS)}")
  return source_arrays(source)[part]
