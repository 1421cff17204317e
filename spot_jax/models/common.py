"""What the two kinds of prompted model share: the parameter split and the loss of a batch.

The parameter tree is split by structure: the prompt method's parameters are the top-level
`prompt/` subtree (`PROMPT_KEY`), everything else is the frozen backbone.
"""
from __future__ import annotations

from typing import Any, Mapping, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from spot_jax import losses

Array = jax.Array
Params = Mapping[str, Any]

PROMPT_KEY = "prompt"


def merge_params(frozen: Params, trainable: Params) -> dict[str, Any]:
  """The full parameter tree from its two disjoint top-level parts."""
  overlap = set(frozen) & set(trainable)
  if overlap:
    raise ValueError(f"frozen and trainable parameters overlap at {sorted(overlap)}")
  return {**frozen, **trainable}


def unbox(tree: Any) -> Any:
  """Strips logical-axis boxes from a parameter tree (without adding sharding constraints,
  so it also works on `jax.eval_shape` results inside a mesh context)."""
  def strip(x):
    if isinstance(x, nn.LogicallyPartitioned):
      return x.unbox(apply_constraint=False)
    return x.unbox() if isinstance(x, nn.meta.AxisMetadata) else x
  return jax.tree.map(strip, tree, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))


def loss_and_metrics(logits: Array, targets: Array, weights: Array, state: Mapping[str, Any], *,
                     z_loss: float, label_smoothing: float,
                     loss_normalizing_factor: Union[None, str, float]
                     ) -> tuple[Array, dict[str, Array]]:
  """The loss of teacher-forced `logits` [B, S, V] against `targets` [B, S] where `weights`
  [B, S] is non-zero, plus the auxiliary losses and intermediates sown in `state`.

  Returns:
    (cross-entropy + z-loss + auxiliary losses, metrics: the loss's sums, "aux_loss",
    "num_examples" and "intermediates/<path>" of every sown value).
  """
  loss, metrics = losses.cross_entropy_with_z_loss(
      logits, targets, weights, z_loss=z_loss, label_smoothing=label_smoothing,
      loss_normalizing_factor=loss_normalizing_factor)
  aux = jax.tree_util.tree_leaves(state.get("aux_loss", {}))
  aux_total = sum((jnp.sum(a) for a in aux), jnp.zeros((), jnp.float32))
  metrics["aux_loss"] = aux_total
  metrics["num_examples"] = jnp.asarray(targets.shape[0], jnp.float32)
  for path, value in jax.tree_util.tree_flatten_with_path(state.get("intermediates", {}))[0]:
    name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    metrics[f"intermediates/{name}"] = value
  return loss + aux_total, metrics
