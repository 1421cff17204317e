"""The training state: only what trains, never the frozen backbone."""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  """Everything that changes during training.

  Attributes:
    step: optimizer steps taken (int32 scalar).
    params: the trainable parameters only (`{"prompt": ...}` for prompt methods, the whole
      network for model tuning).
    opt_state: optimizer state built on `params` only.
    rng: base PRNG key (uint32[2]); step keys are `fold_in(rng, step)`.
    data_position: training batches consumed, so a resumed run reads the same stream.
  """
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  data_position: jax.Array

  @classmethod
  def create(cls, params: Any, tx: optax.GradientTransformation, rng: jax.Array) -> "TrainState":
    return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
               rng=rng, data_position=jnp.zeros((), jnp.int32))
