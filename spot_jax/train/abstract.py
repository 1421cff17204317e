"""The train step's inputs as shapes: what AOT compiling a step needs, with nothing read or
allocated (no checkpoint array, no weight; a Hugging Face config.json at most).

  step_inputs(model, tx, lengths, batch_size, ...)   -> `StepInputs`: the model as the trainer
      runs it (FROZEN_DTYPE decided, the loss's positions set), the TrainState, the frozen tree
      and a batch, each a tree of `jax.ShapeDtypeStruct`s (with shardings on a mesh)

The frozen tree is in the config's `param_dtype` (bfloat16 halves its bytes), the prompt and its
optimizer state float32, as in training; REMAT is the config's `remat_policy`. A memory plan:

  inputs = abstract.step_inputs(model, optimizers.adamw(), {"inputs": 384, "targets": 128}, 8)
  compiled = jax.jit(step.make_train_step(inputs.model, tx), donate_argnums=(0,)).lower(
      inputs.state, inputs.frozen, inputs.batch).compile()
  compiled.memory_analysis()   # argument (frozen + state + batch), temp, output bytes
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from spot_jax import backbone as backbone_lib
from spot_jax import models
from spot_jax import partitioning
from spot_jax.train.state import TrainState


class StepInputs(NamedTuple):
  """A train step's model and abstract arguments.

  Attributes:
    model: the model with its frozen dtype decided and `for_batches(lengths)` applied.
    state: TrainState of ShapeDtypeStructs (prompt parameters, optimizer state: float32).
    frozen: the frozen parameter tree of ShapeDtypeStructs in the config's `param_dtype`.
    batch: {feature: ShapeDtypeStruct [batch_size, length] int32}.
  """
  model: Any
  state: Any
  frozen: Any
  batch: Mapping[str, jax.ShapeDtypeStruct]


def _with_shardings(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                      shardings)


def step_inputs(model: models.Model, tx: optax.GradientTransformation,
                lengths: Mapping[str, int], batch_size: int, *, mesh: Optional[Any] = None,
                rules: Optional[Any] = None, initial_checkpoint_path: Optional[str] = None,
                trainable: str = "prompt") -> StepInputs:
  """The model and abstract (state, frozen, batch) of `make_train_step(model, tx)`.

  Args:
    model: the model as gin builds it (MODEL): its config's param_dtype may be None.
    tx: the optimizer (its state's shapes come from `tx.init` of the prompt's shapes).
    lengths: TASK_FEATURE_LENGTHS, {"inputs": T, "targets": S}.
    batch_size: the global batch.
    mesh, rules: shardings of the trainer (the rule table's for the frozen tree, replicated
      prompt state, batch over "data"); None: no shardings.
    initial_checkpoint_path: decides FROZEN_DTYPE None as the trainer does (None: float32).
    trainable: "prompt", or "all" (model tuning: the frozen tree is then empty).
  """
  model = backbone_lib.resolve_frozen_dtype(model, initial_checkpoint_path, trainable)
  model = model.for_batches(lengths)
  dummy = model.dummy_batch(lengths["inputs"], lengths["targets"], batch_size)
  rng = jax.random.PRNGKey(0)
  frozen = jax.eval_shape(lambda r: models.unbox(model.init_backbone(r, dummy)), rng)
  if model.has_prompt:
    prompt = jax.eval_shape(lambda r, f: models.unbox(model.init_prompt(r, f, dummy)), rng,
                            frozen)
  else:
    prompt = {}
  if trainable != "prompt":
    prompt, frozen = models.merge_params(frozen, prompt), {}
  state = jax.eval_shape(lambda p: TrainState.create(p, tx, rng), prompt)
  batch = {k: jax.ShapeDtypeStruct(v.shape, jnp.int32) for k, v in dummy.items()}
  if mesh is not None:
    rules = partitioning.logical_rules() if rules is None else rules
    boxed = jax.eval_shape(model.init_backbone, rng, dummy)
    if frozen:
      frozen = _with_shardings(frozen, partitioning.param_shardings(boxed, mesh, rules))
    replicated = partitioning.replicated(mesh)
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                         state)
    data = partitioning.batch_sharding(mesh)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=data) for k, v in batch.items()}
  return StepInputs(model, state, frozen, batch)
