"""Restoring official T5X checkpoints under a prompt, and exporting the prompt at every save.

Both plug into t5x's checkpoint configs through gin (gin/t5x/models/common.gin):

  utils.RestoreCheckpointConfig.state_transformation_fns = [@spot_t5x.strict_prompt_restore]
  utils.RestoreCheckpointConfig.fallback_to_scratch = True
  utils.SaveCheckpointConfig.state_transformation_fns = [@spot_t5x.PromptExporter()]

`strict_prompt_restore` keeps every backbone parameter of the checkpoint and drops only the
prompt-side ones and the checkpoint's optimizer state, so t5x's `fallback_to_scratch` can fill
in exactly the prompt parameters, the prompt's optimizer state and step 0, and nothing else:
a backbone parameter the checkpoint lacks (or one it has that the model does not) is an error
naming it, never a silent random initialisation.
"""
from __future__ import annotations

import os
import pathlib
from typing import Any, Mapping, Optional

import jax
import numpy as np
from flax import traverse_util
from t5x import state_utils

from spot_jax import fileio
from spot_jax.run_dir import RunDir, companion_file
from spot_jax import prompts as prompts_lib
from spot_jax.contrib.t5x.optim import is_prompt_path

_SHOWN = 5


def _param_keys(flat: Mapping[str, Any]) -> set[str]:
  return {k for k in flat if k.startswith("target/")}


def _listing(names: list[str]) -> str:
  more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
  return ", ".join(n[len("target/"):] for n in names[:_SHOWN]) + more


def strict_prompt_restore(ckpt_state: Mapping[str, Any], target_state: Mapping[str, Any], *,
                          is_resuming: bool = False) -> dict:
  """A t5x restore transformation: the backbone from the checkpoint, strictly; no prompt.

  Args:
    ckpt_state: the checkpoint's optimizer state dict ({"target": params, "state": ...}).
    target_state: this model's optimizer state dict (same layout).
    is_resuming: True when t5x resumes this run's own checkpoint: kept whole.

  Returns:
    The checkpoint's parameters without the prompt-side ones and without optimizer state.

  Raises:
    ValueError: naming backbone parameters missing from, or unknown to, the checkpoint.
  """
  if is_resuming:
    return dict(ckpt_state)
  ckpt = state_utils.flatten_state_dict(ckpt_state)
  target = state_utils.flatten_state_dict(target_state)
  ckpt_params, target_params = _param_keys(ckpt), _param_keys(target)
  backbone = {k for k in target_params if not is_prompt_path(k)}
  missing = sorted(backbone - ckpt_params)
  if missing:
    raise ValueError(f"the checkpoint lacks {len(missing)} backbone parameter(s) of this model: "
                     f"{_listing(missing)}; only prompt-side parameters may be initialised fresh, "
                     "so give a checkpoint of the same architecture (model gin file)")
  unknown = sorted(k for k in ckpt_params - target_params if not is_prompt_path(k))
  if unknown:
    raise ValueError(f"the checkpoint has {len(unknown)} parameter(s) this model lacks: "
                     f"{_listing(unknown)}; the model gin file does not match the checkpoint")
  kept = {k: v for k, v in ckpt.items() if k in backbone}
  return traverse_util.unflatten_dict(kept, sep="/")


def host_array(x: Any) -> np.ndarray:
  """A NumPy copy of a replicated (or fully addressable) array on this process."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    if not x.is_fully_replicated:
      raise ValueError(f"prompt parameter of shape {x.shape} is sharded across processes; "
                       f"export needs it replicated (the default prompt axis rules)")
    return np.asarray(x.addressable_data(0))
  return np.asarray(jax.device_get(x))


class PromptExporter:
  """A t5x save transformation writing the prompt next to every checkpoint (state unchanged).

  On process 0 it writes MODEL_DIR/prompts/prompt_step_<step>.npy (the effective prompt, as
  `spot_jax.train` exports it: P [L, E]; SMoP's [k, l, E]; Residual's folded P'; a deep prompt's
  record) and prompt_params_step_<step>.npz (the raw `prompt/` parameters, '/'-joined names, for
  methods whose prompt alone does not determine the model, e.g. SMoP's router), and before the
  prompt the arrays a method exports beside it (DePT: offset_step_<step>.npy, the folded offset).

  Attributes:
    prompt: the prompt module the model was built with (gin: %PROMPT).
    model_dir: the run directory (gin: %MODEL_DIR).
    config: the model's T5Config (the deep prompts lay out their prefixes by it).
  """

  def __init__(self, prompt: Any, model_dir: str, config: Any = None):
    if not isinstance(prompt, prompts_lib.PROMPT_METHODS):
      raise TypeError(f"PromptExporter.prompt is {type(prompt).__name__}; valid: "
                      f"{', '.join(m.__name__ for m in prompts_lib.PROMPT_METHODS)}")
    self.prompt, self.config = prompt, config
    self.run_dir = RunDir(os.fspath(model_dir))

  def __call__(self, state_dict: Mapping[str, Any], parameter_infos: Any) -> tuple[Any, Any]:
    step = int(host_array(state_dict["state"]["step"]))
    self.export(state_dict["target"]["prompt"], step)
    return state_dict, parameter_infos

  def export(self, prompt_params: Mapping[str, Any], step: int) -> Optional[pathlib.Path]:
    """Writes both files for `step`; returns the .npy path (None off process 0)."""
    params = jax.tree.map(host_array, dict(prompt_params))
    if jax.process_index() != 0:
      return None
    flat = traverse_util.flatten_dict(params, sep="/")
    import io  # pylint: disable=g-import-not-at-top
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v, np.float32) for k, v in flat.items()})
    fileio.atomic_write_bytes(self.run_dir.prompt_params_path(step), buf.getvalue())
    path = self.run_dir.prompt_path(step)
    for name, array in prompts_lib.export_arrays(self.prompt, params).items():  # DePT's offset
      fileio.save_npy(companion_file(path, name), array)
    fileio.save_npy(path, prompts_lib.effective_prompt(self.prompt, params, self.config))
    return path


def load_prompt_params(path: str | os.PathLike) -> dict:
  """The `{"prompt": {...}}` subtree from a prompt_params_step_<N>.npz written by PromptExporter."""
  with np.load(path, allow_pickle=False) as data:
    flat = {k: np.asarray(data[k]) for k in data.files}
  return {"prompt": traverse_util.unflatten_dict(flat, sep="/")}
