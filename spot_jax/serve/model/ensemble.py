"""Prompt ensembles: N prompts of one task, every input replicated across them in one pass.

Row layout: input b with prompt n is row b * N + n of the batched call. Predictions combine
by majority vote (ties: the higher mean score among the tied answers, then the earliest
prompt) or, with class labels, by the label of highest mean log-likelihood.
"""
from __future__ import annotations

import collections
from typing import Optional, Sequence

import numpy as np

from spot_jax.errors import ConfigError
from spot_jax.serve.model import inputs
from spot_jax.serve.model.server import Server


def replicate(tokens: np.ndarray, prompt_names: Sequence[str]) -> tuple[list[str], np.ndarray]:
  """([B * N] names, [B * N, T] tokens): each input once per prompt."""
  n = len(prompt_names)
  if n < 1:
    raise ConfigError("an ensemble needs at least one prompt")
  return list(prompt_names) * tokens.shape[0], np.repeat(np.asarray(tokens), n, axis=0)


def majority_vote(predictions: Sequence[str], scores: Optional[Sequence[float]] = None) -> str:
  """The most frequent prediction of one input's N prompts (see the module docstring for ties)."""
  if not predictions:
    raise ConfigError("majority_vote needs at least one prediction")
  counts = collections.Counter(predictions)
  top = max(counts.values())
  tied = [p for p in dict.fromkeys(predictions) if counts[p] == top]  # first-seen order
  if len(tied) == 1 or scores is None:
    return tied[0]
  mean = {p: np.mean([s for q, s in zip(predictions, scores) if q == p]) for p in tied}
  return max(tied, key=lambda p: mean[p])  # max keeps the first of equal means


def mean_logprob_choice(log_likelihoods: np.ndarray) -> np.ndarray:
  """[B, N, C] per-prompt log-likelihoods of C candidates -> [B] index of the best mean."""
  return np.argmax(np.mean(np.asarray(log_likelihoods), axis=1), axis=-1)


def _repeat(valid: Optional[np.ndarray], n: int) -> Optional[np.ndarray]:
  return None if valid is None else np.repeat(np.asarray(valid), n, axis=0)


def generate(server: Server, prompt_names: Sequence[str], tokens: np.ndarray,
             batch_index: int = 0, valid: Optional[np.ndarray] = None
             ) -> tuple[np.ndarray, np.ndarray]:
  """One batched decoding pass: (tokens [B, N, S], scores [B, N]); `valid` [B, T] marks the
  tokens (see `Server.generate`)."""
  names, rows = replicate(tokens, prompt_names)
  out, scores = server.generate(names, rows, batch_index, valid=_repeat(valid, len(prompt_names)))
  b, n = tokens.shape[0], len(prompt_names)
  return out.reshape(b, n, -1), scores.reshape(b, n)


def classify(server: Server, prompt_names: Sequence[str], tokens: np.ndarray,
             labels: np.ndarray, valid: Optional[np.ndarray] = None,
             label_valid: Optional[np.ndarray] = None) -> np.ndarray:
  """One batched scoring pass: log-likelihoods [B, N, C] of C label rows [C, S]."""
  names, rows = replicate(tokens, prompt_names)
  scores = server.classify(names, rows, labels, valid=_repeat(valid, len(prompt_names)),
                           label_valid=label_valid)
  return scores.reshape(tokens.shape[0], len(prompt_names), -1)


def rescore(server: Server, prompt_names: Sequence[str], tokens: np.ndarray,
            candidates: np.ndarray, valid: Optional[np.ndarray] = None) -> np.ndarray:
  """Mean-log-prob combination of generated answers: [B, N, C] log-likelihoods of each
  input's C candidates (candidates [B, C, S], each up to its first EOS) under each prompt, in
  one pass."""
  b, c = candidates.shape[:2]
  n = len(prompt_names)
  names = [name for _ in range(b) for name in prompt_names for _ in range(c)]
  rows = np.repeat(np.asarray(tokens), n * c, axis=0)
  targets = np.repeat(candidates[:, None], n, axis=1).reshape(b * n * c, -1)
  return server.score(names, rows, targets, valid=_repeat(valid, n * c),
                      target_valid=inputs.valid_to_eos(targets, server.settings.eos_id)
                      ).reshape(b, n, c)


def report(prompt_names: Sequence[str], per_prompt: Sequence[Sequence[str]],
           combined: Sequence[str], targets: Sequence[Optional[str]]) -> dict:
  """Exact-match accuracy of the ensemble, the mean over prompts and the best single prompt.

  Args:
    prompt_names: N names.
    per_prompt: [B][N] predictions.
    combined: [B] ensemble predictions.
    targets: [B] gold answers (None where unknown; those inputs are not counted).
  """
  known = [i for i, t in enumerate(targets) if t is not None]
  out = {"num_prompts": len(prompt_names), "num_examples": len(combined), "num_scored": len(known)}
  if not known:
    return out
  acc = lambda preds: float(np.mean([preds[i] == targets[i] for i in known]))
  single = {name: acc([row[n] for row in per_prompt]) for n, name in enumerate(prompt_names)}
  best = max(single, key=lambda k: single[k])
  out.update({"ensemble_accuracy": acc(list(combined)),
              "mean_accuracy": float(np.mean(list(single.values()))),
              "best_single": {"prompt": best, "accuracy": single[best]},
              "per_prompt_accuracy": single})
  return out
