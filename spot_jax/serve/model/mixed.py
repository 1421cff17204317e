"""Mixed-task batches: every row carries its own prompt, gathered from a `PromptTable` in jit.

The frozen backbone is a prompt-less `Transformer`; a row b with table index i_b gets

  prompt_b = sum_k w_bk * prompts[i_b, k]        [L, E], zero beyond l_{i_b}
  w_b      = routing of softmax(features_b @ router[i_b]) over the row's k_{i_b} prompts

(features: the mean embedding of the row's real tokens, as SMoP routes; for an ATTEMPT entry,
w_b = softmax(keys[i_b] . h_b) + one_hot(target) with h_b its attention network on the max-pooled
real tokens, i.e. the target plus the attention mixture), placed like the prompt modules place
theirs. Rows whose entry has an input offset (DePT) first get offsets[i_b, t] added to the
embedding of each real token at position t, as `prompts.dept` does. Padded prompt positions
are masked out, and every row's valid positions are then moved to the front in order, so each
row sees exactly the positions (and relative distances) it would see alone with its own prompt:
a mixed batch decodes like the per-example, per-prompt model. Shapes depend only
on (B, T, table shape), never on the mix, so one compiled function serves any mix. The
gathering is `gather`'s, shared with the decoder-only kind (`mixed_decoder`).

Deep prompts: a row's per-layer prefixes are gathered from the table too (`row_prefixes`), with
the positions its entry lacks made invisible; rows without prefixes of a type see none, so
prefix-tuned, P-tuning v2 and input-prompt entries share a batch.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import jax

from spot_jax.serve.model.gather import jit_generate, prompted_input, row_kv
from spot_jax.serve.model.gather import attempt_weights, route  # noqa: F401  (mixed.route, ...)
from spot_jax.serve.catalog.table import TableArrays
from spot_jax.backbones.t5 import generation, prefixes as prefixes_lib, scoring
from spot_jax.backbones.t5.network import Transformer

Array = jax.Array
PyTree = Any


def row_prefixes(table: TableArrays, index: Array) -> Optional[prefixes_lib.DeepPrompt]:
  """Per-row deep prompts [B, layers, P, H, D] of the table's entries, or None without any."""
  if not table.deep:
    return None
  out = {}
  for name, arrays in table.deep.items():
    kv, visible = row_kv(arrays, index)  # [B, layers, 2, P, H, D], [B, P]
    out[name] = prefixes_lib.Prefix(key=kv[:, :, 0], value=kv[:, :, 1], visible=visible)
  return prefixes_lib.DeepPrompt(**out)


def encode(model: Transformer, params: PyTree, table: TableArrays, index: Array, tokens: Array,
           placement: str = "prefix") -> tuple[Array, Array]:
  """Deterministic encoder pass with per-row prompts -> (encoded [B, L+T, E], valid [B, L+T])."""
  embedded = model.apply({"params": params}, tokens, method=lambda m, t: m.token_embedder(t))
  x, valid = prompted_input(table, index, embedded, tokens, placement)
  deep = row_prefixes(table, index)
  if deep is None or deep.encoder is None:
    encoded = model.apply({"params": params}, x, valid,
                          method=lambda m, x, v: m.encoder(x, v, True))
  else:
    encoded = model.apply({"params": params}, x, valid, deep.encoder,
                          method=lambda m, x, v, p: m.encoder(x, v, True, p))
  return encoded, valid


@jit_generate
def generate_mixed(model: Transformer, params: PyTree, table: TableArrays, index: Array,
                   tokens: Array, rng: Optional[Array], alpha: Array, temperature: Array, *,
                   placement: str, max_decode_length: int, method: str, num_beams: int,
                   top_k: int, eos_id: int, return_all_beams: bool) -> tuple[Array, Array]:
  """Decodes a mixed batch: (tokens [B, S] int32, scores [B]) as `t5.generate` returns them.

  Args:
    model: a prompt-less `Transformer`; params: its (frozen) parameters.
    table: the prompt table's arrays; index: [B] int32 table rows; tokens: [B, T] ids.
    rng, alpha, temperature, and the keyword settings: from `generation.search_settings`.
  """
  encoded, valid = encode(model, params, table, index, tokens, placement)
  deep = {} if not table.deep else {"prefixes": row_prefixes(table, index)}
  return generation.search(model, params, encoded, valid, rng, alpha, temperature,
                           max_decode_length=max_decode_length, method=method,
                           num_beams=num_beams, top_k=top_k, eos_id=eos_id,
                           return_all_beams=return_all_beams, **deep)


@functools.partial(jax.jit, static_argnames=("model", "placement"))
def score_mixed(model: Transformer, params: PyTree, table: TableArrays, index: Array,
                tokens: Array, targets: Array, *, placement: str) -> Array:
  """Sum of target log-probabilities [B] of targets [B, S] (0 = padding) under row prompts."""
  encoded, valid = encode(model, params, table, index, tokens, placement)
  return scoring.target_log_likelihood(model, params, encoded, valid, targets,
                                       row_prefixes(table, index))


@functools.partial(jax.jit, static_argnames=("model", "placement"))
def classify_mixed(model: Transformer, params: PyTree, table: TableArrays, index: Array,
                   tokens: Array, labels: Array, *, placement: str) -> Array:
  """Log-likelihoods [B, C] of every label row labels [C, S] for every input row.

  The encoder runs once per input (not once per input and label): its output is repeated for
  the C label rows the decoder scores.
  """
  encoded, valid = encode(model, params, table, index, tokens, placement)
  return scoring.label_log_likelihoods(model, params, encoded, valid, labels,
                                       row_prefixes(table, index))
