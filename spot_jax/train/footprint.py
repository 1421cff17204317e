"""What the trainer's step needs per device, from XLA's analysis of the compiled step.

`step_inputs` gives the step's arguments as the trainer makes them, as `jax.ShapeDtypeStruct`s
with their shardings (nothing read, nothing allocated): the frozen tree in the config's
`param_dtype`, its matmul kernels quantized as its `quantization` says (int values + scales,
`backbones.quantization.abstract`), sharded by `partitioning.frozen_rules`; the prompt's state
float32, sharded by the rule table. `build` adds the trainer's jitted step (`step.jit_step`);
`measure` compiles it ahead of time and reads `memory_analysis()` (bytes per device) and
`cost_analysis()` (FLOPs per device):

  inputs = footprint.step_inputs(model, optimizers.adamw(), {"inputs": 384, "targets": 128}, 8)
  found = footprint.measure(model, optimizers.adamw(), {"inputs": 384, "targets": 128}, 8, mesh)

  frozen       the frozen weights' shards on one device (from their shapes and shardings)
  trainable    the state: prompt parameters, optimizer state, step, rng, data position
  batch        one device's share of the batch
  temporaries  XLA's temporaries (activations kept for the backward pass, gradients, ...)
               plus outputs not aliased to the donated state (the metrics)
  total        what the step needs at its peak: arguments + unaliased outputs + temporaries

`serve_memory` gives the serving side by arithmetic from shapes: the frozen weights plus the
key/value cache of a number of slots at a given length (`jax.eval_shape` of the model's own
cache where the model has one).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from spot_jax import backbone as backbone_lib
from spot_jax import models
from spot_jax import partitioning
from spot_jax.backbones import quantization
from spot_jax.train import step as step_lib
from spot_jax.train.state import TrainState

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Footprint:
  """Bytes per device of one train step, and its FLOPs per device.

  Attributes:
    frozen: the frozen weights' shards.
    trainable: the training state (prompt, optimizer state, counters).
    batch: the batch's shard.
    temporaries: activations, gradients and other temporaries, plus unaliased outputs.
    flops: floating-point operations of one step on one device (XLA's cost analysis).
    devices: devices of the mesh.
  """
  frozen: int
  trainable: int
  batch: int
  temporaries: int
  flops: float
  devices: int

  @property
  def total(self) -> int:
    return self.frozen + self.trainable + self.batch + self.temporaries

  def as_dict(self) -> dict[str, Any]:
    return dict(dataclasses.asdict(self), total=self.total)


def _bits(dtype: Any) -> int:
  """Bits of one element: an integer type's width (int4: 4), else 8 per byte of it."""
  dtype = jnp.dtype(dtype)
  return jnp.iinfo(dtype).bits if jnp.issubdtype(dtype, jnp.integer) else 8 * dtype.itemsize


def shard_bytes(tree: Any) -> int:
  """Bytes of one device's shards of a tree of ShapeDtypeStructs (or arrays) with shardings
  (int4 values packed two to a byte, as they are stored)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) else x.shape
    total += int(np.prod(shape, dtype=np.int64)) * _bits(x.dtype)
  return (total + 7) // 8


def abstract_frozen(model: models.Model, dummy: Mapping[str, Any], mesh: jax.sharding.Mesh,
                    rules: partitioning.LogicalRules) -> Any:
  """The frozen weights as ShapeDtypeStructs with the trainer's shardings (nothing allocated),
  quantized as the config says (`backbone.load_backbone`'s tree: QArrays of int values and
  scales in place of the matmul kernels).

  A mesh that does not divide a weight is refused in one line (`partitioning.check_divisible`).
  """
  boxed = jax.eval_shape(model.init_backbone, backbone_lib.seed_keys(0)[0], dummy)
  shardings = partitioning.param_shardings(boxed, mesh, rules)
  partitioning.check_divisible(boxed, shardings, mesh, hint=backbone_lib.divisible_hint(rules))
  tree = models.unbox(boxed)
  if quantization.enabled(model.config):
    tree = quantization.abstract(boxed, model.config)
    shardings = quantization.shardings(boxed, model.config, mesh, rules)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def train_batch(model: models.Model, lengths: Mapping[str, int], batch_size: int,
                sharding: jax.sharding.Sharding) -> dict[str, jax.ShapeDtypeStruct]:
  """The abstract batch the trainer's pipeline gives (`spot_jax.data`): the model's features
  plus the targets' loss weights."""
  dummy = model.dummy_batch(lengths["inputs"], lengths["targets"], batch_size)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in dummy.items()}
  batch.setdefault("decoder_loss_weights", batch["decoder_target_tokens"])
  return batch


def abstract_state(model: models.Model, tx: optax.GradientTransformation, frozen: Any,
                   dummy: Mapping[str, Any], mesh: jax.sharding.Mesh,
                   rules: partitioning.LogicalRules) -> Any:
  """The fresh training state as ShapeDtypeStructs with the shardings the trainer's state gets
  (the prompt's from the rule table, the optimizer state's as XLA propagates them)."""
  rng = backbone_lib.seed_keys(0)
  boxed = jax.eval_shape(model.init_prompt, rng[1], frozen, dummy)
  prompt_shardings = partitioning.param_shardings(boxed, mesh, rules)
  prompt = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        models.unbox(boxed), prompt_shardings)
  rep = partitioning.replicated(mesh)
  create = jax.jit(lambda p, r: TrainState.create(p, tx, r), in_shardings=(prompt_shardings, rep))
  key = jax.ShapeDtypeStruct(rng[2].shape, rng[2].dtype, sharding=rep)
  compiled = create.lower(prompt, key).compile()
  shapes = jax.eval_shape(lambda p, r: TrainState.create(p, tx, r), prompt, key)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      shapes, compiled.output_shardings)


class StepInputs(NamedTuple):
  """A train step's model and abstract arguments (ShapeDtypeStructs with shardings).

  Attributes:
    model: the model as the trainer runs it (FROZEN_DTYPE decided, `for_batches` applied).
    state: the fresh TrainState (prompt parameters, optimizer state: float32).
    frozen: the frozen tree in the config's `param_dtype` (quantized kernels as QArrays).
    batch: {feature: [batch_size, length]} as the trainer's pipeline gives it.
  """
  model: Any
  state: Any
  frozen: Any
  batch: Mapping[str, jax.ShapeDtypeStruct]


def step_inputs(model: models.Model, tx: optax.GradientTransformation,
                lengths: Mapping[str, int], batch_size: int,
                mesh: Optional[jax.sharding.Mesh] = None, *, fsdp: bool = False,
                shard_prompt_embed: bool = False,
                initial_checkpoint_path: Optional[str] = None) -> StepInputs:
  """The model and abstract (state, frozen, batch) of the trainer's step.

  Args:
    model: the prompted model as gin builds it (its config carries the frozen dtype, None: the
      checkpoint's, decided as the trainer does; the remat policy; the quantization).
    tx: the optimizer.
    lengths: TASK_FEATURE_LENGTHS ({"inputs": T, "targets": S}).
    batch_size: the global batch (sharded over "data").
    mesh: the ("data", "model") mesh (None: this host's first device).
    fsdp: shard the frozen weights over "data" too.
    shard_prompt_embed: as the trainer's setting of that name.
    initial_checkpoint_path: decides a FROZEN_DTYPE of None (None: float32).
  """
  mesh = mesh if mesh is not None else partitioning.create_mesh(1, jax.devices()[:1])
  rules = partitioning.logical_rules(shard_prompt_embed)
  model = backbone_lib.resolve_frozen_dtype(model, initial_checkpoint_path)
  model = model.for_batches(lengths)
  dummy = model.dummy_batch(lengths["inputs"], lengths["targets"])
  frozen = abstract_frozen(model, dummy, mesh, partitioning.frozen_rules(rules, fsdp))
  with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
    state = abstract_state(model, tx, frozen, dummy, mesh, rules)
  batch = train_batch(model, lengths, batch_size, partitioning.batch_sharding(mesh))
  return StepInputs(model, state, frozen, batch)


def build(model: models.Model, tx: optax.GradientTransformation, lengths: Mapping[str, int],
          batch_size: int, mesh: jax.sharding.Mesh, *, fsdp: bool = False,
          shard_prompt_embed: bool = False, dropout_rng: str = "threefry"
          ) -> tuple[Any, Any, Any, Any]:
  """(the trainer's jitted step, abstract state, abstract frozen weights, abstract batch).

  The arguments are `step_inputs`'; dropout_rng is the trainer's setting of that name.
  """
  inputs = step_inputs(model, tx, lengths, batch_size, mesh, fsdp=fsdp,
                       shard_prompt_embed=shard_prompt_embed)
  step = step_lib.jit_step(
      inputs.model, tx, mesh, state_shardings=jax.tree.map(lambda x: x.sharding, inputs.state),
      frozen_shardings=jax.tree.map(lambda x: x.sharding, inputs.frozen),
      batch_sharding=partitioning.batch_sharding(mesh), dropout_rng=dropout_rng)
  return step, inputs.state, inputs.frozen, inputs.batch


def compile_step(step: Any, state: Any, frozen: Any, batch: Any, mesh: jax.sharding.Mesh,
                 shard_prompt_embed: bool = False) -> Any:
  """The step compiled ahead of time for these abstract arguments, under the trainer's rules."""
  rules = partitioning.logical_rules(shard_prompt_embed)
  with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
    return step.lower(state, frozen, batch).compile()


def measure(model: models.Model, tx: optax.GradientTransformation, lengths: Mapping[str, int],
            batch_size: int, mesh: jax.sharding.Mesh, *, fsdp: bool = False,
            shard_prompt_embed: bool = False, dropout_rng: str = "threefry") -> Footprint:
  """Compiles the trainer's step for `model` on abstract arrays; its footprint per device.

  The arguments are `build`'s.
  """
  step, state, frozen, batch = build(model, tx, lengths, batch_size, mesh, fsdp=fsdp,
                                     shard_prompt_embed=shard_prompt_embed,
                                     dropout_rng=dropout_rng)
  compiled = compile_step(step, state, frozen, batch, mesh, shard_prompt_embed)
  stats = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  sizes = {"frozen": shard_bytes(frozen), "trainable": shard_bytes(state),
           "batch": shard_bytes(batch)}
  outputs = max(0, stats.output_size_in_bytes - stats.alias_size_in_bytes)
  return Footprint(**sizes, temporaries=int(stats.temp_size_in_bytes + outputs),
                   flops=float((cost or {}).get("flops", float("nan"))), devices=mesh.size)


def serve_memory(model: models.Model, mesh: jax.sharding.Mesh, slots: int, max_length: int,
                 *, fsdp: bool = False) -> dict[str, int]:
  """Serving bytes per device by arithmetic from shapes: frozen weights + key/value cache.

  The cache is `slots` sequences of `max_length` positions (prompt included) in the activation
  dtype, its batch split over "data": a decoder-only model's cache as `jax.eval_shape` of its own
  (`DecoderOnlyModel._empty_cache`); for T5, the decoder's self-attention cache plus the
  cross-attention keys and values of `max_length` encoder positions.
  """
  rules = partitioning.frozen_rules(partitioning.logical_rules(), fsdp)
  dummy = model.dummy_batch(4, 4)
  frozen = shard_bytes(abstract_frozen(model, dummy, mesh, rules))
  config = model.config
  ways = math.gcd(slots, mesh.shape[partitioning.DATA])
  if getattr(model, "kind", "t5") == "decoder":
    cache = jax.eval_shape(lambda: model._empty_cache(None, slots, max_length))  # pylint: disable=protected-access
    cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
  else:
    itemsize = jnp.dtype(config.dtype).itemsize
    per_position = 2 * config.num_heads * config.head_dim * itemsize
    cache_bytes = slots * max_length * per_position * 2 * config.num_decoder_layers
  return {"frozen": frozen, "cache": cache_bytes // ways, "total": frozen + cache_bytes // ways}
