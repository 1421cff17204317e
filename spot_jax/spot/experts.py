"""Source prompts compressed into SMoP experts (retrieved SMoP).

SMoP trains k short prompts of l tokens; retrieved SMoP starts expert r from the r-th retrieved
source prompt rho_r [L, E], compressed to l tokens:

  "first":     rho_r[:l], the first l tokens;
  "mean_pool": l contiguous segments of (almost) equal size, each replaced by its mean (segment
               s covers tokens floor(s L / l) .. floor((s + 1) L / l) - 1).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError

COMPRESSIONS = ("first", "mean_pool")


def compress(prompt: np.ndarray, length: int, method: str) -> np.ndarray:
  """[L, E] -> [length, E] float32 (length <= L)."""
  prompt = np.asarray(prompt, np.float32)
  validate.one_of(method, "compression", COMPRESSIONS)
  if prompt.ndim != 2 or not 1 <= length <= prompt.shape[0]:
    raise ConfigError(f"cannot compress a prompt of shape {prompt.shape} to {length} tokens; "
                      f"give 1 <= expert length <= {prompt.shape[0] if prompt.ndim == 2 else '?'}")
  if method == "first":
    return prompt[:length].copy()
  bounds = (np.arange(length + 1) * prompt.shape[0]) // length
  return np.stack([prompt[a:b].mean(axis=0) for a, b in zip(bounds[:-1], bounds[1:])])


def expert_prompts(prompts: Sequence[np.ndarray], length: int, method: str) -> np.ndarray:
  """The [k, length, E] initial SMoP prompts from k source prompts."""
  if not prompts:
    raise ConfigError("retrieved SMoP needs at least one source prompt")
  return np.stack([compress(p, length, method) for p in prompts])
