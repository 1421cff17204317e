"""Task-embedding similarities (Vu et al. 2022, section 4), vectorised over a whole library.

A task embedding is a prompt e [L, E] taken at an early training step. For prompts e1 [L1, E]
and e2 [L2, E] (lengths may differ):

  cosine of average tokens ("average"):   cos(mean_i e1_i, mean_j e2_j)
  per-token average cosine ("per_token"): mean over the L1 x L2 pairs of cos(e1_i, e2_j)

The per-token form equals (mean_i u1_i) . (mean_j u2_j) with u the unit-normalised tokens, so
both are one matrix product over the library. A zero vector has cosine 0 with everything.
Computed in float64 NumPy (libraries are small; no compilation).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError

METRICS = ("average", "per_token")
_EPS = 1e-30


def _unit(x: np.ndarray) -> np.ndarray:
  """Rows scaled to unit norm; zero rows stay zero. x [..., E]."""
  norm = np.linalg.norm(x, axis=-1, keepdims=True)
  return np.where(norm > _EPS, x / np.maximum(norm, _EPS), 0.0)


def _check(prompts: Sequence[np.ndarray]) -> list[np.ndarray]:
  out = [np.asarray(p, np.float64) for p in prompts]
  for i, p in enumerate(out):
    if p.ndim != 2 or p.shape[0] == 0:
      raise ConfigError(f"prompt {i} has shape {p.shape}; task embeddings are [length, embed] "
                        f"with length >= 1")
  widths = {p.shape[1] for p in out}
  if len(widths) > 1:
    raise ConfigError(f"prompts of different embedding sizes {sorted(widths)} cannot be compared")
  return out


def summaries(prompts: Sequence[np.ndarray], metric: str) -> np.ndarray:
  """One vector per prompt whose dot products give `metric`: [N, E] float64.

  "average": the unit-normalised mean token; "per_token": the mean of the unit tokens
  (not renormalised: its dot products are the mean pairwise cosines).
  """
  validate.one_of(metric, "similarity metric", METRICS)
  out = _check(prompts)
  if not out:
    return np.zeros((0, 0))
  lengths = np.array([p.shape[0] for p in out])
  padded = np.zeros((len(out), lengths.max(), out[0].shape[1]))
  for i, p in enumerate(out):
    padded[i, :len(p)] = p
  if metric == "average":
    return _unit(padded.sum(axis=1) / lengths[:, None])
  return _unit(padded).sum(axis=1) / lengths[:, None]  # padding rows are zero after _unit


def similarities(target: np.ndarray, library: Sequence[np.ndarray], metric: str) -> np.ndarray:
  """Similarity of `target` [L, E] to each library prompt [L_n, E]: [N] float64."""
  vectors = summaries([target, *library], metric)
  return vectors[1:] @ vectors[0]


def pairwise(prompts: Sequence[np.ndarray], metric: str) -> np.ndarray:
  """Similarities between all prompts: [N, N] float64 (symmetric)."""
  vectors = summaries(prompts, metric)
  return vectors @ vectors.T


def rank(scores: np.ndarray) -> np.ndarray:
  """Indices by decreasing similarity (stable: ties keep library order)."""
  return np.argsort(-np.asarray(scores), kind="stable")


def weighted_average(prompts: Sequence[np.ndarray], sims: np.ndarray) -> np.ndarray:
  """SPoT's top-k weighted average: sum_r alpha_r rho_r, alpha_r = sim_r / sum_l sim_l.

  Args:
    prompts: the k source prompts rho_r, all of one shape [L, E].
    sims: their similarities to the target [k]; their sum must be positive.
  """
  stack = np.stack([np.asarray(p, np.float64) for p in prompts]) if prompts else None
  sims = np.asarray(sims, np.float64)
  if stack is None or stack.shape[0] != sims.shape[0]:
    raise ValueError(f"weighted_average: {0 if stack is None else stack.shape[0]} prompts but "
                     f"{sims.shape[0]} similarities")
  total = sims.sum()
  if not total > 0:
    raise ValueError(f"weighted_average: the similarities {sims.tolist()} do not sum to a "
                     f"positive number; use best_of_top_k")
  alpha = sims / total
  return np.tensordot(alpha, stack, axes=1).astype(np.float32)
