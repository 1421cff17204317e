"""Pieces shared by the prompt modules: setting checks and embedding-aware parameters."""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import placement as placement_lib
from spot_jax.prompts.initializers import Initializer

Array = jax.Array


def check_dtype(dtype: Optional[Any], embedded: Array, who: str) -> None:
  """A module's optional `dtype` must agree with the backbone's activation dtype."""
  if dtype is not None and jnp.dtype(dtype) != embedded.dtype:
    raise ConfigError(f"{who}.dtype={jnp.dtype(dtype).name} but the backbone embeds in "
                      f"{embedded.dtype.name}; leave dtype unset to follow the backbone")


def validity(tokens: Array, valid: Optional[Array]) -> Array:
  """[B, T] bool, the real positions: the caller's `valid` mask (the prompt modules' contract:
  every id a tokenizer has is a token), or, when a caller gives none, `tokens > 0` (T5's
  vocabularies, which reserve id 0 for padding)."""
  return tokens > 0 if valid is None else jnp.asarray(valid).astype(bool)


def prompt_param(module: nn.Module, name: str, init: Initializer, shape: Sequence[int],
                 axes: tuple[str, ...], embedding: Array) -> Array:
  """A float32 prompt parameter whose initialiser also sees the frozen [V, E] table."""
  if not callable(init):
    raise ConfigError(f"{type(module).__name__}.prompt_init must be an initialiser "
                      f"init(rng, shape, embedding), got {init!r}")

  def flax_init(rng: Array, shape: tuple[int, ...]) -> Array:
    value = jnp.asarray(init(rng, shape, embedding), jnp.float32)
    if value.shape != tuple(shape):
      raise ConfigError(f"{type(module).__name__}: the initialiser returned shape {value.shape}, "
                        f"expected {tuple(shape)}")
    return value

  return module.param(name, nn.with_logical_partitioning(flax_init, axes), tuple(shape))


def unboxed_numpy(tree: Any) -> Any:
  """A parameter tree with partitioning boxes removed and leaves as NumPy arrays."""
  return jax.tree_util.tree_map(np.asarray, nn.meta.unbox(tree))


def mean_embedding(embedded: Array, valid: Array) -> Array:
  """[B, T, E], [B, T] -> [B, E] float32 mean over real positions (zero for empty rows)."""
  mask = valid.astype(jnp.float32)[..., None]
  total = jnp.sum(embedded.astype(jnp.float32) * mask, axis=1)
  return total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)


class Constant:
  """A float32 array a prompt module holds as a constant, not a parameter (never trained).

  Hashable and compared by content, so a module holding one stays a valid static argument of
  `jax.jit`. Under jit the array is a compile-time constant of every program that uses it
  (embedded in the executable, transferred once): fine for a few source prompts
  (S * L * E * 4 bytes), not meant for large tables.

  Attributes:
    value: the read-only float32 array.
  """

  def __init__(self, value: Any):
    array = np.array(value.value if isinstance(value, Constant) else value, np.float32)
    array.setflags(write=False)
    self.value = array
    self._digest = hashlib.sha256(repr(array.shape).encode() + array.tobytes()).hexdigest()

  @property
  def shape(self) -> tuple[int, ...]:
    return self.value.shape

  def __hash__(self) -> int:
    return hash(self._digest)

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, Constant) and other._digest == self._digest

  def __repr__(self) -> str:
    return f"Constant(shape={self.shape}, sha256={self._digest[:12]})"


def max_pool(x: Array, valid: Array) -> Array:
  """[B, T, E], [B, T] -> [B, E] float32 maximum over real positions (zero for empty rows)."""
  x = jnp.where(valid[..., None], x.astype(jnp.float32), -jnp.inf)
  pooled = jnp.max(x, axis=1)
  return jnp.where(jnp.any(valid, axis=1)[:, None], pooled, 0.0)


def torch_linear_init(fan_in: int) -> Any:
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's nn.Linear default, as the papers' code uses."""
  bound = 1.0 / np.sqrt(fan_in)
  return lambda rng, shape, dtype=jnp.float32: jax.random.uniform(rng, shape, dtype, -bound, bound)


class TaskIndexed(nn.Module):
  """The keyword-only settings of the prompt modules that hold one prompt per task and read each
  row's `task_index` (`Attempt`, `MultitaskPrompt`); the backbone hands them the index.

  Attributes:
    default_task: the task of rows without a task index, in [0, number of tasks).
    placement: "prefix", "after_bos" or "suffix".
    dtype: optional activation dtype; must equal the backbone's (None follows it).
  """
  _: dataclasses.KW_ONLY
  default_task: int = 0
  placement: str = "prefix"
  dtype: Optional[Any] = None

  task_indexed = True  # the backbone hands it each row's task_index

  def check_task_settings(self, num_tasks: int, who: str) -> None:
    """Checks placement and that `default_task` is one of `num_tasks` tasks."""
    validate.one_of(self.placement, f"{who}.placement", placement_lib.PLACEMENTS)
    if not isinstance(self.default_task, int) or not 0 <= self.default_task < num_tasks:
      raise ConfigError(f"{who}.default_task={self.default_task!r}; valid: 0..{num_tasks - 1}")

  @nn.compact
  def __call__(self, embedded: Array, tokens: Array, *, embedding: Array, deterministic: bool,
               task_index: Optional[Array] = None, valid: Optional[Array] = None
               ) -> tuple[Array, Array]:
    """embedded [B, T, E], tokens [B, T], valid [B, T] bool (None: tokens > 0), task_index [B]
    or None
    -> (x [B, m + T, E], valid [B, m + T]), m the prompt tokens of `row_prompts`."""
    del deterministic  # no task-indexed method has randomness
    check_dtype(self.dtype, embedded, type(self).__name__)
    valid = validity(tokens, valid)
    if task_index is None:
      task_index = jnp.full((embedded.shape[0],), self.default_task, jnp.int32)
    prompt = self.row_prompts(embedded, valid, task_index, embedding)
    return placement_lib.combine(prompt, embedded, valid, self.placement)

  def row_prompts(self, embedded: Array, valid: Array, task_index: Array,
                  embedding: Array) -> Array:
    """Each row's prompt [B, m, E] for its task (declares the parameters; see subclasses)."""
    raise NotImplementedError(f"{type(self).__name__} must define row_prompts")
