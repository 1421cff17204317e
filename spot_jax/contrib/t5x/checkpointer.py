"""t5x checkpoints without the frozen backbone: the prompt side is saved, the backbone re-read.

`PromptCheckpointer` is t5x's `checkpoints.Checkpointer` (the T5X checkpoint format: msgpack plus
TensorStore) with two changes. gin/t5x/runs/prompt_tune.gin plugs it in:

  train_script.train.use_orbax = False
  utils.SaveCheckpointConfig.checkpointer_cls = @spot_t5x_ckpt.PromptCheckpointer
  spot_t5x_ckpt.PromptCheckpointer.backbone_path = %INITIAL_CHECKPOINT_PATH

- save: after the configured save transformations (the prompt export among them), every
  parameter outside the top-level `prompt/` subtree and its (empty) optimizer state is dropped:
  MODEL_DIR/checkpoint_<N> holds the prompt parameters, their optimizer state and the step (and
  the dataset position, when t5x saves it). The first save records the backbone's path in
  MODEL_DIR/backbone.json.
- restore: a checkpoint that holds backbone parameters (an official T5X checkpoint, or a run
  saved whole) is restored as t5x does. One without them is read twice: the backbone from
  `backbone_path`, strictly (`state_fns.strict_prompt_restore`, as on the run's first start),
  then the prompt side, optimizer state, step and dataset position from the checkpoint, so a
  restart resumes exactly where the run stopped. `backbone_path` must be the path backbone.json
  names: a prompt trained against one frozen model is never resumed on another.

A save then writes the prompt side's bytes instead of the whole model's: at T5.1.1 XXL 1.6 MB
(a 100 x 4096 prompt) plus its Adafactor state, against 44.5 GB for the 11.1B frozen float32
parameters (docs/t5x.md).

Why the Checkpointer and not t5x's default Orbax manager: `t5x.train` builds the resume's restore
config itself, with t5x's own Orbax manager class and no fallback state, and requires the save
config's manager class to be the same one; only `checkpointer_cls` (used when `use_orbax` is
False) is carried from the save config into the resume. With Orbax, t5x saves whole models.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from absl import logging
from flax import serialization
from flax import traverse_util
from t5x import checkpoints
from tensorflow.io import gfile

from spot_jax.contrib.t5x import state_fns
from spot_jax.contrib.t5x.optim import PROMPT_PREFIX
from spot_jax.errors import ConfigError

BACKBONE_FILE = "backbone.json"


def drop_backbone(state_dict: Mapping[str, Any], parameter_infos: Mapping[str, Any]
                  ) -> tuple[dict, dict]:
  """A t5x save transformation keeping, of the parameters, the `prompt/` subtree only.

  The optimizer state stays: the prompt-only `MultiOptimizer` gives the backbone None entries,
  which t5x writes as nothing.
  """
  def prune(tree: Mapping[str, Any]) -> dict:
    return dict(tree, target={k: v for k, v in tree["target"].items() if k == PROMPT_PREFIX})
  return prune(state_dict), prune(parameter_infos)


def is_backbone_key(key: str) -> bool:
  """True for a '/'-joined state key of a backbone parameter ("target/..." outside `prompt/`)."""
  return key.startswith("target/") and not key.startswith(f"target/{PROMPT_PREFIX}/")


def saved_parameters(path: str) -> Optional[list[str]]:
  """'/'-joined parameter names in a T5X checkpoint's msgpack (None when `path` has none)."""
  file = os.path.join(path, "checkpoint") if gfile.isdir(path) else path
  if not gfile.exists(file) or gfile.isdir(file):
    return None
  with gfile.GFile(file, "rb") as f:
    contents = serialization.msgpack_restore(f.read())
  target = contents.get("optimizer", contents).get("target", {})
  return ["target/" + "/".join(k) for k in traverse_util.flatten_dict(target)]


def _canonical(path: str) -> str:
  """A local path made absolute (a relative INITIAL_CHECKPOINT_PATH names the same folder from any
  working directory); URLs (gs://...) as given."""
  return path if "://" in path else os.path.abspath(path)


class PromptCheckpointer(checkpoints.Checkpointer):
  """t5x's Checkpointer saving the prompt side only and re-reading the backbone on restore.

  Attributes:
    backbone_path: the frozen backbone's checkpoint (gin: %INITIAL_CHECKPOINT_PATH), read when
      a checkpoint without backbone parameters is restored.
  """

  def __init__(self, *args, backbone_path: Optional[str] = None, **kwargs):
    super().__init__(*args, **kwargs)
    self.backbone_path = os.fspath(backbone_path) if backbone_path else None

  def save(self, train_state: Any, state_transformation_fns: Sequence[Any] = (), **kwargs) -> None:
    """t5x's save of `train_state` without the backbone (after `state_transformation_fns`)."""
    self._record_backbone()
    super().save(train_state, tuple(state_transformation_fns) + (drop_backbone,), **kwargs)

  def restore(self, step: Optional[int] = None, path: Optional[str] = None,
              state_transformation_fns: Sequence[Any] = (),
              fallback_state: Optional[Mapping[str, Any]] = None, lazy_parameters: bool = False):
    """t5x's restore; a checkpoint without backbone parameters gets them from `backbone_path`."""
    where = os.fspath(path) if path else os.fspath(self._get_checkpoint_dir(
        self.latest_step() if step is None else step))
    names = saved_parameters(where)
    if names is None or any(is_backbone_key(n) for n in names):
      return super().restore(step=step, path=path,
                             state_transformation_fns=state_transformation_fns,
                             fallback_state=fallback_state, lazy_parameters=lazy_parameters)
    self._check_backbone(where)
    logging.info("%s holds the prompt side only: reading the frozen backbone from %s first (t5x "
                 "logs the entries each read fills in as 'from scratch')", where,
                 self.backbone_path)
    # 1. The backbone, strictly, as the run's first start read it, by a Checkpointer without the
    # dataset iterator; zeros stand in for the prompt side, which step 2 reads.
    reader = checkpoints.Checkpointer(self._train_state, self._partitioner, "",
                                      restore_dtype=self.restore_dtype)
    backbone = reader.restore(path=self.backbone_path, fallback_state=self._prompt_side_zeros(),
                              state_transformation_fns=[state_fns.strict_prompt_restore])
    # 2. The checkpoint, with the backbone filling in what it does not hold.
    return super().restore(step=step, path=path, state_transformation_fns=state_transformation_fns,
                           fallback_state=backbone.state_dict(), lazy_parameters=lazy_parameters)

  def _prompt_side_zeros(self) -> dict:
    """Zeros for every state entry but the backbone's parameters (host arrays, prompt-sized; the
    backbone's optimizer state stays None)."""
    flat = traverse_util.flatten_dict(self._train_state.state_dict(), sep="/")
    return traverse_util.unflatten_dict(
        {k: None if v is None else np.zeros(v.shape, v.dtype)
         for k, v in flat.items() if not is_backbone_key(k)}, sep="/")

  def _record_backbone(self) -> None:
    """Writes MODEL_DIR/backbone.json once (process 0): the backbone a restore must read."""
    record = os.path.join(os.fspath(self.checkpoints_dir), BACKBONE_FILE)
    if jax.process_index() != 0 or gfile.exists(record):
      return
    if not self.backbone_path:
      raise ConfigError("PromptCheckpointer.backbone_path is not set, so checkpoints without the "
                        "frozen backbone could not be resumed; valid: %INITIAL_CHECKPOINT_PATH (as "
                        "in gin/t5x/runs/prompt_tune.gin)")
    gfile.makedirs(os.path.dirname(record))
    with gfile.GFile(record + ".tmp", "w") as f:
      f.write(json.dumps({"backbone_path": _canonical(self.backbone_path)}) + "\n")
    gfile.rename(record + ".tmp", record, overwrite=True)

  def _check_backbone(self, checkpoint_dir: str) -> None:
    """The backbone `checkpoint_dir` was trained against is `backbone_path`, or a ConfigError."""
    record = os.path.join(os.path.dirname(checkpoint_dir.rstrip("/")), BACKBONE_FILE)
    saved = None
    if gfile.exists(record):
      with gfile.GFile(record) as f:
        saved = json.loads(f.read())["backbone_path"]
    if saved is None:
      raise ConfigError(f"{checkpoint_dir} holds the prompt side only and {record} is missing, so "
                        f"the backbone it was trained against is unknown; valid: restore that file "
                        f"or start a new MODEL_DIR")
    if not self.backbone_path or _canonical(self.backbone_path) != saved:
      raise ConfigError(f"{checkpoint_dir} holds the prompt side only, trained against the "
                        f"backbone {saved}; INITIAL_CHECKPOINT_PATH is "
                        f"{self.backbone_path or 'not set'}; valid: "
                        f"INITIAL_CHECKPOINT_PATH='{saved}'")
