"""Device meshes and the one rule table that maps logical axis names onto them.

Parameters carry logical names (`embed`, `mlp`, `heads`, `kv`, `joined_kv`, `vocab`,
`relpos_buckets`, and the prompt axes `prompt`, `prompt_embed`, `prompts`, `prompt_mlp`);
`DEFAULT_RULES` maps them onto a 2-D mesh with axes ("data", "model"), as t5x's standard rules
do. Prompt axes are replicated by default; `shard_prompt_embed=True` shards the prompt's
embedding axis over "model", which helps only for the very largest models.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spot_jax.errors import ConfigError

LogicalRules = Sequence[tuple[str, Optional[str]]]

DATA, MODEL = "data", "model"

DEFAULT_RULES: tuple[tuple[str, Optional[str]], ...] = (
    ("batch", DATA),
    ("vocab", MODEL),
    ("embed", None),
    ("mlp", MODEL),
    ("heads", MODEL),
    ("kv", None),
    ("kv_heads", None),
    ("joined_kv", MODEL),
    ("relpos_buckets", None),
    ("length", None),
    ("prompt", None),
    ("prompt_embed", None),
    ("prompts", None),
    ("prompt_mlp", None),
)


def logical_rules(
    shard_prompt_embed: bool = False,
    overrides: Sequence[tuple[str, Optional[str]]] = ()) -> tuple[tuple[str, Optional[str]], ...]:
  """The default rule table, optionally sharding the prompt embedding axis, plus overrides.

  Args:
    shard_prompt_embed: map `prompt_embed` to "model" instead of replicating it.
    overrides: (logical, mesh axis or None) pairs replacing the defaults of the same name.
  """
  table = dict(DEFAULT_RULES)
  if shard_prompt_embed:
    table["prompt_embed"] = MODEL
  for name, axis in overrides:
    if axis not in (None, DATA, MODEL):
      raise ConfigError(f"rule for {name!r} maps to unknown mesh axis {axis!r}; valid: None, "
                        "'data', 'model'")
    table[name] = axis
  return tuple(table.items())


def create_mesh(num_partitions: int = 1, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A ("data", "model") mesh over all devices with `num_partitions` devices per model replica.

  Args:
    num_partitions: size of the "model" axis (model parallelism); must divide the device count.
    devices: devices to use (default: all of `jax.devices()`).
  """
  devices = list(jax.devices() if devices is None else devices)
  if num_partitions < 1 or len(devices) % num_partitions:
    raise ConfigError(f"num_partitions={num_partitions} must be a positive divisor of the "
                      f"device count {len(devices)}")
  grid = np.asarray(devices, dtype=object).reshape(len(devices) // num_partitions, num_partitions)
  return Mesh(grid, (DATA, MODEL))


def logical_to_sharding(logical_specs: Any, mesh: Mesh, rules: LogicalRules) -> Any:
  """Maps a tree of logical PartitionSpecs to NamedShardings on `mesh`."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, list(rules))


def param_shardings(boxed_tree: Any, mesh: Mesh, rules: LogicalRules) -> Any:
  """NamedShardings for a tree of `nn.LogicallyPartitioned` parameters (e.g. from eval_shape)."""
  return logical_to_sharding(nn.get_partition_spec(boxed_tree), mesh, rules)


def replicated(mesh: Mesh) -> NamedSharding:
  """A fully replicated sharding on `mesh`."""
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Shards the leading (batch) axis over "data"."""
  return NamedSharding(mesh, PartitionSpec(DATA))


def global_batch(rows: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
  """A global array of `rows` placed with `sharding`.

  Every process passes the same NumPy value (each process builds the same batch); each
  addressable device takes its slice of it.
  """
  return jax.make_array_from_callback(rows.shape, sharding, lambda index: rows[index])


def fetch(x: Any) -> np.ndarray:
  """The whole value of an array on this host, also when it spans other processes' devices.

  A single-process (fully addressable) array is copied; one that spans several processes is
  gathered from all of them (a collective: every process must call it).
  """
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def place(tree: Any, sharding: jax.sharding.Sharding) -> Any:
  """Host values (the same on every process) as global arrays with `sharding`."""
  return jax.tree.map(lambda x: global_batch(np.asarray(x), sharding), tree)
