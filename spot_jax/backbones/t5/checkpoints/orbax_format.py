"""Orbax checkpoints: parameters under `optimizer/target`, `target`, a lone `params` key or
at the root, restored by orbax straight into the target shardings."""
from __future__ import annotations

from typing import Mapping, Sequence

import jax
import numpy as np
from flax import traverse_util
from jax.sharding import Sharding

from spot_jax.backbones.t5.checkpoints.common import (CheckpointError, Index, Params,
                                                      StoredArray, brief, check_divisible,
                                                      check_fit)



def orbax_shapes(directory: str) -> tuple[tuple[str, ...], dict[str, StoredArray]]:
  """(prefix of the params subtree, {path: shape-only StoredArray}) from orbax metadata."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  try:
    meta = ocp.PyTreeCheckpointer().metadata(directory)
  except Exception as e:
    raise CheckpointError(f"cannot read orbax metadata of {directory}: {e}") from e
  tree = getattr(getattr(meta, "item_metadata", meta), "tree", getattr(meta, "item_metadata", meta))
  if isinstance(tree.get("optimizer"), dict) and "target" in tree["optimizer"]:
    prefix = ("optimizer", "target")
  elif isinstance(tree.get("target"), dict):
    prefix = ("target",)
  elif list(tree) == ["params"] and isinstance(tree["params"], dict):  # a flax variables dict
    prefix = ("params",)
  else:
    prefix = ()
  for key in prefix:
    tree = tree[key]

  def restored_by_orbax(index: Index) -> np.ndarray:
    raise NotImplementedError(f"arrays of the orbax checkpoint {directory} are read by orbax")
  stored = {p: StoredArray(tuple(getattr(m, "shape", ())), restored_by_orbax,
                           f"{directory} (orbax)")
            for p, m in traverse_util.flatten_dict(tree, sep="/").items()}
  return prefix, stored


def load_orbax(directory: str, expected: Mapping[str, jax.ShapeDtypeStruct],
                shardings: Mapping[str, Sharding], allow_missing: Sequence[str], dtype: np.dtype,
                strict: bool = True) -> Params:
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  prefix, stored = orbax_shapes(directory)
  if strict:
    check_fit(stored, {p: s.shape for p, s in expected.items()}, allow_missing, directory)
  wanted = {p: s for p, s in expected.items() if p in stored}
  for p, s in wanted.items():
    check_divisible(p, s.shape, shardings[p])
  item = traverse_util.unflatten_dict(
      {p: jax.ShapeDtypeStruct(s.shape, dtype, sharding=shardings[p]) for p, s in wanted.items()},
      sep="/")
  args = jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype,
                                                     global_shape=x.shape), item)
  for key in reversed(prefix):
    item, args = {key: item}, {key: args}
  try:
    restored = ocp.PyTreeCheckpointer().restore(
        directory, args=ocp.args.PyTreeRestore(item=item, restore_args=args, partial_restore=True))
  except Exception as e:
    raise CheckpointError(f"orbax restore of {directory} failed: {brief(e)}") from e
  for key in prefix:
    restored = restored[key]
  return traverse_util.unflatten_dict(traverse_util.flatten_dict(restored, sep="/"), sep="/")

