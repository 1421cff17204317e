"""What the decoder's checkpoint formats share: the error type, the strict shape check, the
model's dimensions read from its config, and placing a tree on devices."""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import numpy as np
from flax import traverse_util
from jax.sharding import Mesh

from spot_jax import partitioning
from spot_jax.errors import ConfigError

Params = dict[str, Any]

_MAX_LISTED = 6


class CheckpointError(ConfigError):
  """A checkpoint does not fit the model, or cannot be read; the message names the array."""


class Dims(NamedTuple):
  """The sizes a checkpoint's arrays are checked against (V, E, N, K, H, F, layers)."""
  vocab: int
  embed: int
  heads: int
  kv_heads: int
  head_dim: int
  mlp: int
  layers: int
  qk_norm: bool
  post_norms: bool


def dims(config: Any) -> Dims:
  """The sizes of `config` (a DecoderConfig)."""
  return Dims(config.vocab_size, config.emb_dim, config.num_heads, config.num_kv_heads,
              config.head_dim, config.mlp_dim, config.num_layers, bool(config.qk_norm),
              bool(config.post_norms))


def _shape(shape: Sequence[int]) -> str:
  return str(tuple(int(n) for n in shape))


def check_fit(stored: Mapping[str, Sequence[int]], expected: Mapping[str, Sequence[int]],
              source: str, hint: str = "give the checkpoint of this config, or the config of "
              "this checkpoint") -> None:
  """Raises `CheckpointError` unless `stored` has exactly the `expected` names and shapes.

  The message is one line naming each offending array (the first few when there are many),
  then `hint`: what would be valid.
  """
  problems = [f"{n} has shape {_shape(stored[n])}, expected {_shape(expected[n])}"
              for n in sorted(set(stored) & set(expected))
              if tuple(stored[n]) != tuple(expected[n])]
  problems += [f"{n} {_shape(expected[n])} is missing" for n in sorted(set(expected) - set(stored))]
  problems += [f"{n} {_shape(stored[n])} is not part of the model"
               for n in sorted(set(stored) - set(expected))]
  if problems:
    more = f"; and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
    count = f" ({len(problems)} problems)" if len(problems) > 1 else ""
    raise CheckpointError(f"{source} does not fit the model config{count}: "
                          f"{'; '.join(problems[:_MAX_LISTED])}{more}; {hint}")


def _unboxed(tree: Any) -> Any:
  """The tree without its axis metadata (no sharding constraint: nothing is traced here)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x: x.value if isinstance(x, nn.meta.AxisMetadata) else x, tree,
                      is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))


def check_params(params: Params, config: Any, source: str = "the parameter tree"
                 ) -> dict[str, Any]:
  """`params` flat ("/"-joined paths), refused unless it is exactly `DecoderLM(config)`'s tree.

  Raises:
    CheckpointError: one line naming each missing, unexpected or mis-shaped parameter.
  """
  from spot_jax.backbones.decoder import network  # pylint: disable=g-import-not-at-top
  expected = traverse_util.flatten_dict(_unboxed(network.abstract_params(config)), sep="/")
  flat = traverse_util.flatten_dict(_unboxed(dict(params)), sep="/")
  check_fit({p: np.shape(x) for p, x in flat.items()},
            {p: x.shape for p, x in expected.items()}, source,
            "give the parameters of this config (DecoderLM(config).init)")
  return flat


def placer(config: Any, mesh: Optional[Mesh] = None,
           rules: Optional[partitioning.LogicalRules] = None, dtype: Any = None
           ) -> Callable[[str, np.ndarray], jax.Array]:
  """A function (our "/"-joined path, numpy array) -> jax Array, cast to `dtype` (None: as
  given) and placed on the default device, or on `mesh` with the rule table's sharding of that
  parameter. Loaders call it as each array is read, so the host never holds the whole model.

  Raises (when called):
    CheckpointError: an axis that the mesh cannot split evenly, named.
  """
  dtype = None if dtype is None else np.dtype(dtype)
  cast = lambda x: np.asarray(x) if dtype is None else np.asarray(x).astype(dtype, copy=False)  # noqa: E731
  if mesh is None:
    device = jax.local_devices()[0]
    return lambda path, value: jax.device_put(cast(value), device)
  from spot_jax.backbones.decoder import network  # pylint: disable=g-import-not-at-top
  rules = partitioning.DEFAULT_RULES if rules is None else rules
  shardings = traverse_util.flatten_dict(
      partitioning.param_shardings(network.abstract_params(config), mesh, rules), sep="/")

  def put(path: str, value: np.ndarray) -> jax.Array:
    sharding, value = shardings[path], cast(value)
    for dim, (size, axes) in enumerate(zip(value.shape, sharding.spec)):
      axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
      parts = int(np.prod([mesh.shape[a] for a in axes]))
      if size % parts:
        raise CheckpointError(f"{path} {list(value.shape)}: axis {dim} of size {size} cannot be "
                              f"split over mesh axes {axes} ({parts} devices); use a mesh whose "
                              "axis sizes divide it or override its logical axis rule")
    return jax.make_array_from_callback(value.shape, sharding, lambda index, v=value: v[index])

  return put


def place(params: Params, config: Any, mesh: Optional[Mesh] = None,
          rules: Optional[partitioning.LogicalRules] = None, dtype: Any = None) -> Params:
  """`params` (numpy) as jax Arrays in `dtype` (None: as given): on the default device, or on
  `mesh` with the rule table's shardings of the network's logical axes (see `placer`)."""
  put = placer(config, mesh, rules, dtype)
  flat = traverse_util.flatten_dict(params, sep="/")
  return traverse_util.unflatten_dict({p: put(p, v) for p, v in flat.items()}, sep="/")
