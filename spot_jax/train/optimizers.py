"""Optimizers and learning-rate schedules, as plain factories that gin can configure.

Every optimizer is wrapped with `optax.inject_hyperparams` so the current learning rate is
part of the optimizer state (`opt_state.hyperparams["learning_rate"]`) and can be logged.
The defaults of `adafactor` are Prompt Tuning's: learning rate 0.3 constant, decay rate 0.8,
no parameter scaling, weight decay 1e-5, unfactored second moments.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import optax

from spot_jax import validate
from spot_jax.errors import ConfigError

Schedule = Union[float, Callable[[int], float]]


def _with_learning_rate(make: Callable[[Schedule], optax.GradientTransformation],
                        learning_rate: Schedule,
                        grad_clip_norm: Optional[float]) -> optax.GradientTransformation:
  if not callable(learning_rate):
    validate.positive(learning_rate, "learning_rate", finite=False)
  tx = optax.inject_hyperparams(
      lambda learning_rate: make(learning_rate))(learning_rate=learning_rate)
  if grad_clip_norm is not None:
    validate.positive(grad_clip_norm, "grad_clip_norm", finite=False)
    tx = optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx)
  return tx


def adafactor(learning_rate: Schedule = 0.3, decay_rate: float = 0.8,
              multiply_by_parameter_scale: bool = False, weight_decay_rate: Optional[float] = 1e-5,
              factored: bool = False, clipping_threshold: Optional[float] = 1.0,
              min_dim_size_to_factor: int = 128, momentum: Optional[float] = None,
              grad_clip_norm: Optional[float] = None) -> optax.GradientTransformation:
  """optax Adafactor with Prompt Tuning's defaults (set factored=True for model tuning)."""
  return _with_learning_rate(lambda lr: optax.adafactor(
      learning_rate=lr, decay_rate=decay_rate,
      multiply_by_parameter_scale=multiply_by_parameter_scale,
      weight_decay_rate=weight_decay_rate, factored=factored, clipping_threshold=clipping_threshold,
      min_dim_size_to_factor=min_dim_size_to_factor, momentum=momentum), learning_rate,
                             grad_clip_norm)


def adam(learning_rate: Schedule = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         grad_clip_norm: Optional[float] = None) -> optax.GradientTransformation:
  """optax Adam."""
  return _with_learning_rate(lambda lr: optax.adam(lr, b1=b1, b2=b2, eps=eps), learning_rate,
                             grad_clip_norm)


def adamw(learning_rate: Schedule = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 1e-2, grad_clip_norm: Optional[float] = None
          ) -> optax.GradientTransformation:
  """optax AdamW (decoupled weight decay)."""
  return _with_learning_rate(lambda lr: optax.adamw(lr, b1=b1, b2=b2, eps=eps,
                                                    weight_decay=weight_decay),
                             learning_rate, grad_clip_norm)


FIRST, SECOND = "first", "second"


def two_learning_rates(optimizer: Callable[..., optax.GradientTransformation] = adafactor,
                       learning_rate: Schedule = 0.3, second_learning_rate: Schedule = 1e-4,
                       second_subtrees: Sequence[str] = ("offset",)
                       ) -> optax.GradientTransformation:
  """`optimizer` twice, at two learning rates: DePT's prompt and its embedding offset.

  Parameters under a subtree named in `second_subtrees` (anywhere in their path, e.g. DePT's
  `prompt/offset/{a,b}`) get `optimizer(learning_rate=second_learning_rate)`, all others
  `optimizer(learning_rate=learning_rate)`; each group has its own optimizer state. Under gin,
  `optimizer = @optimizers.adafactor` keeps the run file's Adafactor settings for both groups.

  Args:
    optimizer: a factory taking `learning_rate` (e.g. `adafactor`, `adam`).
    learning_rate: the prompt's learning rate (or schedule).
    second_learning_rate: the learning rate (or schedule) of the named subtrees.
    second_subtrees: subtree names whose parameters take the second rate.
  """
  if isinstance(second_subtrees, str) or not all(isinstance(n, str) and n for n in second_subtrees):
    raise ConfigError(f"second_subtrees={second_subtrees!r}; give a tuple of subtree names, "
                      f"e.g. ('offset',)")
  names = frozenset(second_subtrees)

  def labels(params: Any) -> Any:
    def label(path, _):
      keys = {getattr(k, "key", getattr(k, "name", None)) for k in path}
      return SECOND if keys & names else FIRST
    return jax.tree_util.tree_map_with_path(label, params)

  return optax.multi_transform({FIRST: optimizer(learning_rate=learning_rate),
                                SECOND: optimizer(learning_rate=second_learning_rate)}, labels)


def constant_schedule(value: float) -> Callable[[int], jnp.ndarray]:
  """A constant learning rate."""
  validate.positive(value, "value", finite=False)
  return optax.constant_schedule(value)


def warmup_linear_decay(peak_value: float, warmup_steps: int, decay_steps: int,
                        end_value: float = 0.0, init_value: float = 0.0) -> optax.Schedule:
  """Linear warmup to `peak_value`, then linear decay to `end_value` over `decay_steps`."""
  validate.positive(peak_value, "peak_value", finite=False)
  validate.positive_int(warmup_steps, "warmup_steps", minimum=0)
  validate.positive_int(decay_steps, "decay_steps", minimum=0)
  return optax.join_schedules(
      [optax.linear_schedule(init_value, peak_value, max(warmup_steps, 1)),
       optax.linear_schedule(peak_value, end_value, max(decay_steps, 1))], [warmup_steps])


def warmup_cosine_decay(peak_value: float, warmup_steps: int, decay_steps: int,
                        end_value: float = 0.0, init_value: float = 0.0) -> optax.Schedule:
  """Linear warmup then cosine decay (optax.warmup_cosine_decay_schedule)."""
  validate.positive(peak_value, "peak_value", finite=False)
  validate.positive_int(warmup_steps, "warmup_steps", minimum=0)
  validate.positive_int(decay_steps, "decay_steps", minimum=0)
  return optax.warmup_cosine_decay_schedule(init_value, peak_value, warmup_steps,
                                            warmup_steps + decay_steps, end_value)


def rsqrt_decay(base_value: float = 1.0, warmup_steps: int = 10000) -> optax.Schedule:
  """T5's pre-training schedule: base / sqrt(max(step, warmup_steps))."""
  validate.positive(base_value, "base_value", finite=False)
  validate.positive_int(warmup_steps, "warmup_steps", minimum=0)
  return lambda step: base_value / jnp.sqrt(jnp.maximum(step, warmup_steps).astype(jnp.float32))


def current_learning_rate(opt_state) -> Optional[jnp.ndarray]:
  """The learning rate stored by `inject_hyperparams` in an optimizer state, if any.

  With `two_learning_rates`, the first group's (the prompt's).
  """
  inner = getattr(opt_state, "inner_states", None)
  if isinstance(inner, dict) and FIRST in inner:  # a multi_transform of two_learning_rates
    return current_learning_rate(getattr(inner[FIRST], "inner_state", inner[FIRST]))
  states = [opt_state]
  if getattr(opt_state, "hyperparams", None) is None and isinstance(opt_state, tuple):
    states = list(opt_state)  # a chain (e.g. gradient clipping first)
  for s in states:
    hyper = getattr(s, "hyperparams", None)
    if hyper is not None and "learning_rate" in hyper:
      return hyper["learning_rate"]
  return None
