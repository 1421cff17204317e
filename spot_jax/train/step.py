"""The pure train step: gradients of the trainable tree only, the frozen tree an input.

`train_step(state, frozen_params, batch)` differentiates `state.params` (the prompt method's
parameters, or every parameter for model tuning) and never the frozen backbone. Step keys are
`fold_in(state.rng, state.step)`, so a resumed run draws the same dropout masks.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import optax

from spot_jax import models
from spot_jax import partitioning
from spot_jax import validate
from spot_jax.train import optimizers
from spot_jax.train.state import TrainState


DROPOUT_RNGS = ("threefry", "rbg", "unsafe_rbg")


def dropout_key(step_rng: jax.Array, dropout_rng: str = "threefry") -> jax.Array:
  """The dropout key of a step: the step key itself, or a key of another PRNG seeded by it.

  "threefry" (the default) is JAX's counter-based hash. "rbg" and "unsafe_rbg" draw the dropout
  bits with XLA's RngBitGenerator (t5x's USE_HARDWARE_RNG sets "unsafe_rbg" for all of its
  randomness); "unsafe_rbg" also derives the per-layer keys with it, which leaves out the
  threefry code of every dropout site (a smaller program: faster to compile, a little faster to
  run). Masks keep their rate and layout; only the random stream differs. Either way the key is a
  pure function of (state.rng, step), so resuming stays exact with the same setting.
  """
  if dropout_rng == "threefry":
    return step_rng
  validate.one_of(dropout_rng, "DROPOUT_RNG", DROPOUT_RNGS)
  return jax.random.wrap_key_data(jax.random.bits(step_rng, (4,), jnp.uint32), impl=dropout_rng)


def make_train_step(model: models.Model, tx: optax.GradientTransformation,
                    dropout_rng: str = "threefry"
                    ) -> Callable[[TrainState, Any,
                                   Mapping[str, jax.Array]], tuple[TrainState, dict]]:
  """The pure train step: gradients of `state.params` only; frozen parameters are an input.

  `dropout_rng` picks the PRNG of the dropout masks (see `dropout_key`).
  """
  dropout_key(jax.random.PRNGKey(0), dropout_rng)  # a bad name fails here, not inside jit

  def train_step(state: TrainState, frozen_params: Any, batch: Mapping[str, jax.Array]):
    step_rng = dropout_key(jax.random.fold_in(state.rng, state.step), dropout_rng)

    def loss_fn(trainable):
      return model.loss_fn(models.merge_params(frozen_params, trainable), batch, step_rng,
                           enable_dropout=True)

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # param_norm: a finite loss and gradient can still give an infinite update (checked on the host)
    metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads),
                   param_norm=optax.tree.norm(params))
    lr = optimizers.current_learning_rate(state.opt_state)
    if lr is not None:
      metrics["learning_rate"] = jnp.asarray(lr, jnp.float32)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              data_position=state.data_position + 1)
    return new_state, metrics

  return train_step


def make_runs_step(model: models.Model, tx: optax.GradientTransformation,
                   dropout_rng: str = "threefry", spmd_axis_name: Optional[str] = None
                   ) -> Callable[[TrainState, Any,
                                  Mapping[str, jax.Array]], tuple[TrainState, dict]]:
  """The same step for K runs stacked along a leading runs axis of the state and the batch.

  `make_train_step` vmapped over (state, batch), the frozen parameters unbatched: each run gets
  its own gradients, optimizer update and dropout keys (`fold_in(rng_k, step_k)`), and every
  matmul against a frozen weight reads it once for the K runs. `spmd_axis_name` names the mesh
  axis the runs axis is sharded over (None: the runs axis is not sharded).
  """
  return jax.vmap(make_train_step(model, tx, dropout_rng), in_axes=(0, None, 0),
                  spmd_axis_name=spmd_axis_name)


def jit_step(model: models.Model, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh, *,
             state_shardings: Any, frozen_shardings: Any, batch_sharding: Any,
             dropout_rng: str = "threefry", stacked: bool = False,
             runs_axis: Optional[str] = None) -> Any:
  """The trainer's jitted step (the one `python -m spot_jax.plan` compiles ahead of time).

  Explicit shardings in and out; the state is donated, the frozen parameters never are.
  `stacked`: the K-run step (`make_runs_step`), its runs axis sharded over `runs_axis`.
  """
  step = (make_runs_step(model, tx, dropout_rng, runs_axis) if stacked
          else make_train_step(model, tx, dropout_rng))
  return jax.jit(step, in_shardings=(state_shardings, frozen_shardings, batch_sharding),
                 out_shardings=(state_shardings, partitioning.replicated(mesh)),
                 donate_argnums=(0,))
