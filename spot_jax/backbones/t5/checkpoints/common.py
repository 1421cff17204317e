"""What every checkpoint format shares: the expected tree, stored arrays, strict fit checks,
and placing arrays shard by shard onto their target shardings."""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, Sharding, SingleDeviceSharding

from spot_jax import partitioning
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5.config import T5Config
from spot_jax.backbones.t5.network import Transformer

Index = tuple[slice, ...]
Params = dict[str, Any]

_MAX_LISTED = 8


class CheckpointError(ConfigError):
  """A checkpoint does not fit the model, or cannot be read; the message names the parameter."""


@dataclasses.dataclass(frozen=True)
class StoredArray:
  """One stored parameter, read lazily in t5x orientation.

  Attributes:
    shape: shape as stored (after any transpose into t5x orientation).
    read: returns `array[index]` for a tuple of slices, as numpy.
    origin: where it lives (file, array directory or tensor name), for error messages.
  """
  shape: tuple[int, ...]
  read: Callable[[Index], np.ndarray]
  origin: str



def abstract_params(config: T5Config) -> tuple[dict[str, jax.ShapeDtypeStruct], Any]:
  """The parameters `Transformer(config)` expects, without allocating them.

  Returns:
    (flat {path: ShapeDtypeStruct} with "/"-joined paths, boxed tree with logical axis names).
  """
  flat, boxed = _abstract_params(config)
  return dict(flat), boxed


@functools.lru_cache(maxsize=16)
def _abstract_params(config: T5Config) -> tuple[dict[str, jax.ShapeDtypeStruct], Any]:
  tokens = np.ones((1, 1), np.int32)  # numpy: a jnp array would compile its own fill
  init = lambda: Transformer(config).init(jax.random.PRNGKey(0), tokens, tokens, tokens,
                                          enable_dropout=False)
  boxed = jax.eval_shape(init)["params"]
  return traverse_util.flatten_dict(_unboxed(boxed), sep="/"), boxed


def _unboxed(boxed: Any) -> Any:
  """The tree without its axis metadata and without sharding constraints: abstract shapes carry
  no sharding, and a mesh in context (`jax.set_mesh`) would make `nn.unbox` constrain them."""
  return nn.meta.map_axis_meta(
      lambda x: _unboxed(x.unbox(apply_constraint=False) if isinstance(x, nn.LogicallyPartitioned)
                         else x.unbox()), boxed)


def target_shardings(boxed: Any, mesh: Optional[Mesh], rules) -> dict[str, Sharding]:
  if mesh is None:
    device = SingleDeviceSharding(jax.local_devices()[0])
    return {p: device for p in traverse_util.flatten_dict(_unboxed(boxed), sep="/")}
  rules = partitioning.DEFAULT_RULES if rules is None else rules
  return traverse_util.flatten_dict(partitioning.param_shardings(boxed, mesh, rules), sep="/")


def check_divisible(path: str, shape: Sequence[int], sharding: Sharding) -> None:
  if not isinstance(sharding, NamedSharding):
    return
  for dim, (size, axes) in enumerate(zip(shape, sharding.spec)):
    axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
    parts = math.prod(sharding.mesh.shape[a] for a in axes)
    if size % parts:
      raise CheckpointError(f"{path} {list(shape)}: axis {dim} of size {size} cannot be split over "
                       f"mesh axes {axes} ({parts} devices); use a mesh whose axis sizes divide it "
                       "or override its logical axis rule")


def _allowed(path: str, prefixes: Sequence[str]) -> bool:
  return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def check_fit(stored: Mapping[str, StoredArray], expected: Mapping[str, Sequence[int]],
              allow_missing: Sequence[str], source: str) -> None:
  """Raises `CheckpointError` unless `stored` has exactly the `expected` paths and shapes.

  Paths under an `allow_missing` prefix may be absent, and stored ones there are ignored.
  """
  problems = []
  for p in sorted(set(stored) & set(expected)):
    if tuple(stored[p].shape) != tuple(expected[p]):
      problems.append(f"{p}: expected shape {list(expected[p])}, found {list(stored[p].shape)}")
  problems += [f"missing {p} {list(expected[p])}" for p in sorted(set(expected) - set(stored))
               if not _allowed(p, allow_missing)]
  problems += [f"unexpected {p} {list(stored[p].shape)} ({stored[p].origin})"
               for p in sorted(set(stored) - set(expected)) if not _allowed(p, allow_missing)]
  if problems:
    more = f"; ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
    count = f"{len(problems)} problems" if len(problems) > 1 else "1 problem"
    raise CheckpointError(f"checkpoint {source} does not fit the model config ({count}): "
                          f"{'; '.join(problems[:_MAX_LISTED])}{more}")


def place(path: str, stored: StoredArray, sharding: Sharding, dtype: np.dtype) -> jax.Array:
  """Builds the global array shard by shard from `stored`, each shard read on its own."""

  def read(index: Index) -> np.ndarray:
    try:
      return np.asarray(stored.read(index)).astype(dtype)
    except CheckpointError:
      raise
    except Exception as e:  # tensorstore/safetensors raise assorted types for damaged files
      raise CheckpointError(f"cannot read {path} from {stored.origin}: {brief(e)}") from e

  return jax.make_array_from_callback(tuple(stored.shape), sharding, read)


def brief(error: Exception) -> str:
  """The first line of an error, without tensorstore's long spec dump."""
  text = str(error).strip()
  first = text.splitlines()[0] if text else type(error).__name__
  return first.split(" [tensorstore_spec=")[0]

