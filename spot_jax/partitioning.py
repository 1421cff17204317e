"""Device meshes and the one rule table that maps logical axis names onto them.

Parameters carry logical names (`embed`, `mlp`, `heads`, `kv`, `joined_kv`, `vocab`,
`relpos_buckets`, and the prompt axes `prompt`, `prompt_embed`, `prompts`, `prompt_mlp`);
`DEFAULT_RULES` maps them onto a 2-D mesh with axes ("data", "model"), as t5x's standard rules
do. Prompt axes are replicated by default; `shard_prompt_embed=True` shards the prompt's
embedding axis over "model", which helps only for the very largest models.

FSDP for the frozen weights (`frozen_rules(rules, fsdp=True)`): the frozen parameters' "embed"
axis is sharded over "data" as well, so each device holds 1/(data x model) of a weight, and
XLA's SPMD partitioner all-gathers each weight where a layer uses it. This is a rule set of the
frozen parameters only: activations keep the table's rules ("batch" on "data", "embed"
replicated), so no activation names "data" twice, as MaxText keeps its weight and activation
rules apart.
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


def frozen_rules(rules: LogicalRules, fsdp: bool = False) -> tuple[tuple[str, Optional[str]], ...]:
  """The rules of the frozen parameters: `rules`, with "embed" also on "data" under FSDP.

  Args:
    rules: the rule table of the activations and the trainable parameters.
    fsdp: shard the frozen weights' "embed" axis over "data" (all-gathered per use).
  """
  table = dict(rules)
  if fsdp:
    if table.get("embed") not in (None, DATA):
      raise ConfigError(f"FSDP=True shards 'embed' over 'data', but the rules map it to "
                        f"{table['embed']!r}; give FSDP=False or leave 'embed' unmapped")
    table["embed"] = DATA
  return tuple(table.items())


def check_divisible(abstract: Any, shardings: Any, mesh: Mesh, what: str = "frozen parameter",
                    hint: str = "") -> None:
  """Refuses, in one line, a sharding whose mesh axes do not divide the array it shards.

  Args:
    abstract: a tree of arrays or ShapeDtypeStructs (`nn.Partitioned` boxes are unboxed).
    shardings: the matching tree of NamedShardings.
    mesh: the mesh (named in the message).
    what: what the arrays are, for the message.
    hint: what would be valid, appended to the message.
  """
  # The boxes' values, read directly: `nn.unbox` applies a sharding constraint, which an
  # abstract array refuses under a mesh context.
  values = jax.tree_util.tree_flatten_with_path(
      jax.tree.map(lambda x: x.value if isinstance(x, nn.Partitioned) else x, abstract,
                   is_leaf=lambda x: isinstance(x, nn.Partitioned)))[0]
  specs = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  for (path, x), sharding in zip(values, specs):
    for axis, (size, names) in enumerate(zip(x.shape, sharding.spec)):
      names = (names,) if isinstance(names, str) else tuple(names or ())
      ways = int(np.prod([mesh.shape[n] for n in names])) if names else 1
      if size % ways:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        grid = " x ".join(f"{k}={v}" for k, v in mesh.shape.items())
        raise ConfigError(f"{what} {name} of shape {list(x.shape)} does not divide over the "
                          f"mesh ({grid}): axis {axis} ({size}) over {'+'.join(names)} "
                          f"({ways}){'; ' + hint if hint else ''}")


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
