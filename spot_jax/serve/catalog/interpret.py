"""What a prompt "says": the vocabulary tokens nearest to every prompt token (Lester et al. §7).

Similarity is the cosine between a prompt vector and each row of the frozen [V, E] embedding
table; ties rank the lower token id first. SMoP entries are read prompt by prompt, Residual
prompts in their folded (served) form.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from spot_jax.errors import ConfigError
from spot_jax.serve.catalog.table import ServedPrompt


def nearest_tokens(prompt: np.ndarray, embedding: np.ndarray, k: int = 5
                   ) -> tuple[np.ndarray, np.ndarray]:
  """prompt [L, E], embedding [V, E] -> (ids [L, k] int, cosine similarities [L, k]), best first.

  Zero vectors have similarity 0 to everything.
  """
  prompt, embedding = np.asarray(prompt, np.float64), np.asarray(embedding, np.float64)
  if prompt.ndim != 2 or embedding.ndim != 2 or prompt.shape[1] != embedding.shape[1]:
    raise ConfigError(f"prompt {prompt.shape} and embedding table {embedding.shape} do not fit: "
                      f"expected [L, E] and [V, E] with the same E")
  if not 1 <= k <= embedding.shape[0]:
    raise ConfigError(f"--top_tokens must be in [1, {embedding.shape[0]}], got {k}")
  unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-30)
  sims = unit(prompt) @ unit(embedding).T  # [L, V]
  # Stable sort of -sim: equal similarities keep ascending ids.
  ids = np.argsort(-sims, axis=-1, kind="stable")[:, :k]
  return ids, np.take_along_axis(sims, ids, axis=-1)


def interpret(entry: ServedPrompt, embedding: np.ndarray, k: int = 5,
              vocab: Optional[Any] = None) -> list[dict]:
  """One record per prompt token: {"prompt", "sub_prompt", "position", "neighbours": [...]}.

  Args:
    entry: the served prompt (k sub-prompts for SMoP, one otherwise).
    embedding: the frozen [V, E] table.
    k: neighbours per token.
    vocab: optional seqio vocabulary to show each id as text.
  """
  records = []
  for s, sub in enumerate(entry.prompts):
    ids, sims = nearest_tokens(sub, embedding, k)
    for pos in range(sub.shape[0]):
      records.append({
          "prompt": entry.name, "sub_prompt": s, "position": pos,
          "neighbours": [{"id": int(i), "token": token_text(vocab, int(i)),
                          "similarity": round(float(c), 6)} for i, c in zip(ids[pos], sims[pos])]})
  return records


def token_text(vocab: Optional[Any], token_id: int) -> str:
  """The id's text under `vocab` (a seqio vocabulary), or "<id>" without one / out of range."""
  if vocab is None or token_id >= getattr(vocab, "vocab_size", 0):
    return f"<{token_id}>"
  try:
    text = vocab.decode([token_id])
  except Exception:  # pylint: disable=broad-except
    return f"<{token_id}>"
  return text if text.strip() else f"<{token_id}:{text!r}>"


def format_table(records: Sequence[dict]) -> str:
  """A plain-text table: prompt, sub-prompt, position, then "token (similarity)" columns."""
  lines = ["prompt\tsub\tpos\tnearest tokens (cosine)"]
  for r in records:
    cells = "  ".join(f"{n['token']} ({n['similarity']:.3f})" for n in r["neighbours"])
    lines.append(f"{r['prompt']}\t{r['sub_prompt']}\t{r['position']}\t{cells}")
  return "\n".join(lines)
