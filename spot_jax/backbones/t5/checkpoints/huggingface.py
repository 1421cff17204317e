"""Hugging Face checkpoints: `config.json` plus safetensors or `pytorch_model.bin`, tensors
renamed to t5x paths and transposed into t5x orientation (see `spot_jax.backbones.t5.hf`)."""
from __future__ import annotations

import json
import os

import numpy as np

from spot_jax.backbones.t5.checkpoints.common import CheckpointError, StoredArray
from spot_jax.backbones.t5.config import T5Config



def hf_arrays(directory: str, config: T5Config) -> dict[str, StoredArray]:
  """The tensors of a HF directory under t5x paths; names with no place stay as HF names."""
  from spot_jax.backbones.t5 import hf  # pylint: disable=g-import-not-at-top
  config_file = os.path.join(directory, "config.json")
  try:
    with open(config_file, encoding="utf-8") as f:
      hf_config = json.load(f)
    mismatches = hf.config_mismatches(hf_config, config)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"cannot use {config_file}: {e}") from e
  if mismatches:
    raise CheckpointError(f"{config_file} does not match the model config: {'; '.join(mismatches)}")
  try:
    tensors = hf.open_tensors(directory)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"cannot open the weights in {directory}: {e}") from e
  groups: dict[str, list[tuple[hf.HFTensor, bool]]] = {}
  stored: dict[str, StoredArray] = {}
  for name, tensor in tensors.items():
    if name in hf.IGNORED_HF_NAMES:
      continue
    placed = hf.t5x_name(name, tied=config.logits_via_embedding)
    if placed is None:
      stored[name] = StoredArray(tensor.shape, tensor.read, f"{tensor.file}, no t5x counterpart")
    else:
      groups.setdefault(placed[0], []).append((tensor, placed[1]))
  for path, members in groups.items():
    members.sort(key=lambda m: m[0].name != "shared.weight")
    head, transpose = members[0]
    for alias, _ in members[1:]:
      _check_same(head, alias, path)
    stored[path] = _hf_stored(head, transpose)
  return stored


def _hf_stored(tensor, transpose: bool) -> StoredArray:
  origin = f"{tensor.name} in {tensor.file}"
  if not transpose:
    return StoredArray(tensor.shape, tensor.read, origin)
  if len(tensor.shape) != 2:
    raise CheckpointError(f"{origin} has shape {list(tensor.shape)}; a 2-D weight was expected")
  return StoredArray(tensor.shape[::-1], lambda idx: np.asarray(tensor.read(idx[::-1])).T, origin)


def _check_same(a, b, path: str, rows: int = 8192) -> None:
  """HF may store tied copies of one weight; they must agree
  (compared a block of rows at a time)."""
  if tuple(a.shape) != tuple(b.shape):
    raise CheckpointError(f"{b.name} {list(b.shape)} and {a.name} {list(a.shape)} both map to "
                          f"{path} but differ in shape")
  for start in range(0, a.shape[0], rows):
    idx = (slice(start, min(start + rows, a.shape[0])),) + (slice(None),) * (len(a.shape) - 1)
    if not np.array_equal(np.asarray(a.read(idx)), np.asarray(b.read(idx))):
      hint = (" (the config ties the output layer to the embedding, but this checkpoint has its "
              "own lm_head: use logits_via_embedding=False)") if b.name == "lm_head.weight" else ""
      raise CheckpointError(f"{b.name} differs from {a.name}, yet both map to {path}{hint}")

