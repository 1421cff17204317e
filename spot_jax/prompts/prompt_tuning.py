"""Prompt Tuning (Lester et al. 2021): one learned prompt P [L, E] added to every input."""
from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import numpy as np

from spot_jax import validate
from spot_jax.prompts import common, initializers, placement as placement_lib

Array = jax.Array


class PromptTuning(nn.Module):
  """A soft prompt P [L, E] combined with the embedded encoder input.

  Parameters (under the backbone's `prompt/` subtree):
    prompt [L, E] float32, logical axes ("prompt", "prompt_embed").

  Attributes:
    length: L, the number of prompt tokens (>= 1).
    prompt_init: initialiser `init(rng, shape, embedding)`; see `initializers`.
    placement: "prefix", "after_bos" or "suffix" (see `placement`).
    dtype: optional activation dtype; must equal the backbone's (None follows it).
  """
  length: int
  prompt_init: initializers.Initializer = initializers.uniform()
  placement: str = "prefix"
  dtype: Optional[Any] = None

  def __post_init__(self):
    validate.positive_int(self.length, "PromptTuning.length")
    validate.one_of(self.placement, "PromptTuning.placement", placement_lib.PLACEMENTS)
    super().__post_init__()

  @nn.compact
  def __call__(self, embedded: Array, tokens: Array, *, embedding: Array, deterministic: bool,
               valid: Optional[Array] = None) -> tuple[Array, Array]:
    """embedded [B, T, E], tokens [B, T], valid [B, T] bool (None: tokens > 0)
    -> (x [B, L + T, E], valid [B, L + T])."""
    del deterministic  # Prompt Tuning has no randomness.
    common.check_dtype(self.dtype, embedded, "PromptTuning")
    prompt = common.prompt_param(self, "prompt", self.prompt_init,
                                 (self.length, embedded.shape[-1]), ("prompt", "prompt_embed"),
                                 embedding)
    return placement_lib.combine(prompt, embedded, common.validity(tokens, valid), self.placement)

  def export_prompt(self, params: Any) -> np.ndarray:
    """The prompt [L, E] float32 from this module's parameter subtree."""
    return common.unboxed_numpy(params)["prompt"].astype(np.float32)
