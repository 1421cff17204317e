"""Residual Prompt Tuning's NumPy reference.

Shared by tests/prompts/test_residual.py, tests/prompts/test_residual_smop.py.
"""
from __future__ import annotations

import numpy as np

NP_ACT = {"relu": lambda x: np.maximum(x, 0), "tanh": np.tanh,
          "sigmoid": lambda x: 1 / (1 + np.exp(-x))}


def random_mlp(rs: np.random.RandomState, lead: tuple, embed: int, width: int) -> dict:
  """Trained-looking residual MLP parameters with leading axes `lead` (one MLP per prompt or
  token), the LayerNorm away from (1, 0)."""
  f = lambda *shape: rs.normal(0, 0.5, lead + shape).astype(np.float32)
  return {"down_kernel": f(embed, width), "down_bias": f(width), "up_kernel": f(width, embed),
          "up_bias": f(embed), "layer_norm_scale": 1.0 + f(embed), "layer_norm_bias": f(embed)}


def _reference(params: dict, shared: bool, skip: bool, activation: str, eps: float = 1e-5):
  """P' = LayerNorm(W_up act(W_down P + b_down) + b_up) + P, in float64."""
  p = params["prompt"].astype(np.float64)
  m = {k: v.astype(np.float64) for k, v in params["mlp"].items()}
  act = NP_ACT[activation]
  if shared:
    y = act(p @ m["down_kernel"] + m["down_bias"]) @ m["up_kernel"] + m["up_bias"]
  else:
    h = act(np.einsum("le,lem->lm", p, m["down_kernel"]) + m["down_bias"])
    y = np.einsum("lm,lme->le", h, m["up_kernel"]) + m["up_bias"]
  y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + eps)
  y = y * m["layer_norm_scale"] + m["layer_norm_bias"]
  return y + p if skip else y
