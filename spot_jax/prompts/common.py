"""Pieces shared by the prompt modules: setting checks and embedding-aware parameters."""
from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax.errors import ConfigError
from spot_jax.prompts.initializers import Initializer

Array = jax.Array


def check_positive_int(value: Any, what: str) -> int:
  """Returns `value` if it is an integer >= 1, else raises naming `what`."""
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise ConfigError(f"{what} must be a positive integer, got {value!r}")
  return int(value)


def check_dtype(dtype: Optional[Any], embedded: Array, who: str) -> None:
  """A module's optional `dtype` must agree with the backbone's activation dtype."""
  if dtype is not None and jnp.dtype(dtype) != embedded.dtype:
    raise ConfigError(f"{who}.dtype={jnp.dtype(dtype).name} but the backbone embeds in "
                      f"{embedded.dtype.name}; leave dtype unset to follow the backbone")


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
