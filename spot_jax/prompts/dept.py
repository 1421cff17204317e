"""DePT (Shi & Lipani 2024): a shorter prompt plus a low-rank offset of the input embeddings.

    x'_t = x_t + (alpha / sqrt(r)) * (A B)_t     for every real input position t < s
    encoder input = combine(P, x')               (P [m, E], placed like Prompt Tuning's)

A [s, r] and B [r, E] are trained with the prompt P [m, E], usually at another learning rate
(`spot_jax.train.optimizers.two_learning_rates`, which splits on the `offset/` subtree). As in
the paper's code, A starts as PyTorch's kaiming_uniform(a=sqrt(5)) of an [s, r] matrix,
U(-1/sqrt(r), 1/sqrt(r)), and B at zero, so training starts from Prompt Tuning of length m; the
scale alpha / sqrt(r) is the code's (alpha = 8). Rank 0 has no offset at all: Prompt Tuning.

The offset is indexed by input position, not by token: row t of A B is added to whatever sits
at position t. Positions are counted in the raw input, before the prompt is placed, so the
placement does not move them. Padding positions get nothing (the paper's code adds the offset
there too, but attention never sees padding, so only the zero is different); inputs longer than
s are refused. A length bucket narrower than s uses rows 0..width-1 of the offset: every real
token gets the row of its own position whatever the bucket, so bucketed and fixed-length batches
compute the same thing, and rows >= the width simply go unused in that batch.
"""
from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import common, initializers, placement as placement_lib

Array = jax.Array

OFFSET = "offset"  # the name of the offset's parameter subtree (what the second rate trains)


def _a_init(rank: int):
  """U(-1/sqrt(r), 1/sqrt(r)): kaiming_uniform(a=sqrt(5)) of an [s, r] tensor, as DePT's code."""
  bound = 1.0 / np.sqrt(rank)
  return lambda rng, shape, dtype=jnp.float32: jax.random.uniform(rng, shape, dtype, -bound, bound)


class LowRankOffset(nn.Module):
  """The position offset (alpha / sqrt(r)) A B, [s, E] float32.

  Parameters: a [s, r] ("prompt", "prompt_mlp"), b [r, E] ("prompt_mlp", "prompt_embed").
  The "prompt" axis here counts input positions (replicated like every prompt axis).

  Attributes:
    max_length: s, the input positions the offset covers.
    rank: r (>= 1).
    alpha: the scale's numerator.
  """
  max_length: int
  rank: int
  alpha: float = 8.0

  @nn.compact
  def __call__(self, embed: int) -> Array:
    """-> the offset [s, E] float32 for an embedding width `embed`."""
    a = self.param("a", nn.with_logical_partitioning(_a_init(self.rank), ("prompt", "prompt_mlp")),
                   (self.max_length, self.rank), jnp.float32)
    b = self.param("b", nn.with_logical_partitioning(nn.initializers.zeros,
                                                     ("prompt_mlp", "prompt_embed")),
                   (self.rank, embed), jnp.float32)
    scale = self.alpha / np.sqrt(self.rank)
    return scale * jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST)


class DePT(nn.Module):
  """A prompt P [m, E] plus a rank-r offset of the first s input embeddings.

  Parameters (under the backbone's `prompt/` subtree):
    prompt [m, E] float32, axes ("prompt", "prompt_embed");
    offset/a [s, r], offset/b [r, E] (see LowRankOffset; absent when rank = 0).

  Attributes:
    length: m, the prompt tokens (>= 1).
    max_length: s, the longest input (in tokens, EOS included) the offset covers; the paper
      uses the task's maximum input length (256).
    rank: r (>= 0; 0 is Prompt Tuning of length m).
    alpha: the offset's scale is alpha / sqrt(r) (the paper's code: 8).
    prompt_init: initialiser of P, `init(rng, shape, embedding)`.
    placement: "prefix", "after_bos" or "suffix" (of P; the offset follows input positions).
    dtype: optional activation dtype; must equal the backbone's (None follows it).
  """
  length: int
  max_length: int
  rank: int = 8
  alpha: float = 8.0
  prompt_init: initializers.Initializer = initializers.uniform()
  placement: str = "prefix"
  dtype: Optional[Any] = None

  def __post_init__(self):
    validate.positive_int(self.length, "DePT.length")
    validate.positive_int(self.max_length, "DePT.max_length")
    validate.positive_int(self.rank, "DePT.rank", minimum=0, note="0 is Prompt Tuning")
    validate.positive(self.alpha, "DePT.alpha", note="the paper's code uses 8", example=8)
    validate.one_of(self.placement, "DePT.placement", placement_lib.PLACEMENTS)
    super().__post_init__()

  @property
  def max_input_length(self) -> int:
    """The longest encoder input this module accepts (s)."""
    return int(self.max_length)

  def _offset(self, **kwargs: Any) -> LowRankOffset:
    return LowRankOffset(self.max_length, self.rank, self.alpha, **kwargs)

  @nn.compact
  def __call__(self, embedded: Array, tokens: Array, *, embedding: Array, deterministic: bool,
               valid: Optional[Array] = None) -> tuple[Array, Array]:
    """embedded [B, T, E], tokens [B, T], valid [B, T] bool (None: tokens > 0)
    -> (x [B, m + T, E], valid [B, m + T])."""
    del deterministic  # DePT has no randomness.
    common.check_dtype(self.dtype, embedded, "DePT")
    width, embed = embedded.shape[1], embedded.shape[-1]
    if width > self.max_length:
      raise ConfigError(f"the encoder input has {width} positions but DePT.max_length="
                        f"{self.max_length}; give inputs of at most {self.max_length} tokens or "
                        f"a max_length >= {width}")
    prompt = common.prompt_param(self, "prompt", self.prompt_init, (self.length, embed),
                                 ("prompt", "prompt_embed"), embedding)
    valid = common.validity(tokens, valid)
    if self.rank > 0:
      offset = self._offset(name=OFFSET)(embed)
      embedded = add_offset(embedded, valid, offset)
    return placement_lib.combine(prompt, embedded, valid, self.placement)

  def fold(self, params: Any) -> dict[str, np.ndarray]:
    """The served form: {"prompt": P [m, E], "offset": (alpha / sqrt(r)) A B [s, E] or None}.

    Args:
      params: this module's parameter subtree, boxed or not.
    """
    params = nn.meta.unbox(params)
    if "prompt" not in params or (self.rank > 0 and OFFSET not in params):
      raise ConfigError(f"DePT.fold: the parameter subtree holds {sorted(params)}; pass the "
                        f"`prompt` subtree of a DePT model of rank {self.rank}")
    offset = None
    if self.rank > 0:
      embed = np.shape(params[OFFSET]["b"])[-1]
      offset = np.asarray(self._offset(parent=None).apply({"params": params[OFFSET]}, embed),
                          np.float32)
    return {"prompt": np.asarray(params["prompt"], np.float32), "offset": offset}

  def export_prompt(self, params: Any) -> np.ndarray:
    """The prompt P [m, E] float32 (the offset is exported beside it; see `export_arrays`)."""
    return common.unboxed_numpy(params)["prompt"].astype(np.float32)

  def export_arrays(self, params: Any) -> dict[str, np.ndarray]:
    """Arrays exported beside the prompt: {"offset": [s, E]} (nothing at rank 0)."""
    offset = self.fold(params)["offset"]
    return {} if offset is None else {OFFSET: offset}


def add_offset(embedded: Array, valid: Array, offset: Array) -> Array:
  """embedded [B, T, E] + offset [T', E] (T' >= T, or [B, T', E]) at real positions only.

  Rows t >= T of the offset are unused; padding positions keep their embedding. The sum is
  taken in float32 and cast back to the activation dtype.
  """
  width = embedded.shape[1]
  offset = offset[..., :width, :]
  on = valid[..., None]
  total = embedded.astype(jnp.float32) + jnp.where(on, offset, 0.0)
  return total.astype(embedded.dtype)
