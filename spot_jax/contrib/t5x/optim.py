"""An optimizer that updates only the prompt-side parameters (`prompt/` subtree) under t5x.

t5x's training loop takes the gradient of the whole parameter tree (the contrib model stops it
at the backbone, so those gradients are zeros); a `MultiOptimizer` whose single traversal
selects `prompt/...` gives the backbone no optimizer state and no update, so every frozen
weight stays bit-identical to the checkpoint it was restored from.
"""
from __future__ import annotations

from typing import Any, Mapping

from flax import traverse_util
from t5x import optimizers

PROMPT_PREFIX = "prompt"


def is_prompt_path(path: str) -> bool:
  """True for a '/'-joined parameter path under the model's top-level `prompt/` subtree."""
  parts = [p for p in path.split("/") if p]
  if parts and parts[0] == "target":  # t5x state dicts nest params under "target"
    parts = parts[1:]
  return bool(parts) and parts[0] == PROMPT_PREFIX


def prompt_traversal() -> traverse_util.ModelParamTraversal:
  """Selects the prompt-side parameters of a parameter tree."""
  return traverse_util.ModelParamTraversal(lambda path, _: is_prompt_path(path))


def prompt_only(optimizer_def: optimizers.OptimizerDef) -> optimizers.MultiOptimizer:
  """`optimizer_def` (e.g. t5x's Adafactor) applied to the prompt-side parameters only."""
  return optimizers.MultiOptimizer(((prompt_traversal(), optimizer_def),))


def backbone_paths_updated(optimizer_def: optimizers.OptimizerDef,
                           params: Mapping[str, Any]) -> list[str]:
  """The '/'-joined parameter paths outside `prompt/` that `optimizer_def` would update.

  A `MultiOptimizer` updates what its traversals select (asked on a tree of the parameters'
  own paths); any other optimizer updates every parameter.
  """
  paths = ["/".join(k) for k in traverse_util.flatten_dict(dict(params))]
  if isinstance(optimizer_def, optimizers.MultiOptimizer):
    named = traverse_util.unflatten_dict({tuple(p.split("/")): p for p in paths})
    paths = [p for traversal in optimizer_def.traversals for p in traversal.iterate(named)]
  return sorted(p for p in set(paths) if not is_prompt_path(p))
