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
on (B, T, table shape), never on the mix, so one compiled function serves any mix.

Deep prompts: a row's per-layer prefixes are gathered from the table too (`row_prefixes`), with
the positions its entry lacks made invisible; rows without prefixes of a type see none, so
prefix-tuned, P-tuning v2 and input-prompt entries share a batch.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from spot_jax.prompts import attempt, common, dept, placement as placement_lib
from spot_jax.serve.table import ROUTING_CODES, TableArrays
from spot_jax.backbones.t5 import generation, prefixes as prefixes_lib, scoring
from spot_jax.backbones.t5.network import Transformer

Array = jax.Array
PyTree = Any


def route(table: TableArrays, index: Array, features: Array) -> Array:
  """Per-row mixture weights [B, K] over the row's prompts.

  Args:
    table: the stacked table (arrays may be traced).
    index: [B] int rows of the table.
    features: [B, E] float32 routing features (mean input embedding).
  """
  big_k = table.prompts.shape[1]
  on = jnp.arange(big_k)[None] < table.num_prompts[index][:, None]  # [B, K]
  logits = jnp.einsum("be,bek->bk", features, table.router[index])
  logits = jnp.where(on, logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  one_hot = lambda i: jax.nn.one_hot(i, big_k, dtype=jnp.float32)
  first = jnp.argmax(probs, axis=-1)
  linear = one_hot(first) * probs
  hard = one_hot(jnp.argmax(logits, axis=-1))
  mean = on.astype(jnp.float32) / jnp.sum(on, axis=-1, keepdims=True)
  if big_k >= 2:
    top_p, top_i = jax.lax.top_k(probs, 2)
    top2 = jnp.sum(one_hot(top_i) * top_p[..., None], axis=1)
  else:
    top2 = linear
  code = table.routing[index][:, None]
  weights = jnp.where(code == ROUTING_CODES["linear"], linear, mean)
  weights = jnp.where(code == ROUTING_CODES["top2"], top2, weights)
  return jnp.where(code == ROUTING_CODES["hard"], hard, weights)


def attempt_weights(table: TableArrays, index: Array, pooled: Array) -> Array:
  """ATTEMPT's per-row weights [B, K]: attention over the entry's prompts, plus 1 on its target.

  Args:
    table: the stacked table; index: [B] int rows; pooled: [B, E] max-pooled real tokens.
  """
  big_k = table.prompts.shape[1]
  on = jnp.arange(big_k)[None] < table.num_prompts[index][:, None]  # [B, K]
  h = attempt.attention_query(pooled, table.attn_down[index], table.attn_up[index],
                              table.attn_scale[index], table.attn_bias[index])  # [B, E]
  scores = jnp.einsum("bke,be->bk", table.keys[index], h, precision=jax.lax.Precision.HIGHEST)
  attention = jax.nn.softmax(jnp.where(on, scores, -jnp.inf), axis=-1)
  return attention + jax.nn.one_hot(table.target[index], big_k, dtype=jnp.float32)


def prompted_input(table: TableArrays, index: Array, embedded: Array, tokens: Array,
                   placement: str = "prefix") -> tuple[Array, Array]:
  """embedded [B, T, E], tokens [B, T] -> (x [B, L + T, E], valid [B, L + T] bool).

  Valid positions of each row come first and in order (see the module docstring).
  """
  valid = tokens > 0
  if table.offsets.shape[1]:  # some entry offsets the input embeddings (DePT)
    offsets = table.offsets[index]  # [B, S, E]
    width = embedded.shape[1]
    if offsets.shape[1] < width:  # positions no entry covers: zero (longer rows are refused)
      offsets = jnp.pad(offsets, ((0, 0), (0, width - offsets.shape[1]), (0, 0)))
    embedded = dept.add_offset(embedded, valid, offsets)
  weights = route(table, index, common.mean_embedding(embedded, valid))
  if table.attn_down.shape[-1]:  # static: only tables holding an ATTEMPT entry pay for it
    weights = jnp.where((table.routing[index] == ROUTING_CODES["attempt"])[:, None],
                        attempt_weights(table, index, common.max_pool(embedded, valid)), weights)
  prompt = jnp.einsum("bk,bkle->ble", weights, table.prompts[index])
  batch, big_l = prompt.shape[:2]
  real = jnp.arange(big_l)[None] < table.lengths[index][:, None]  # [B, L]
  x, mask = placement_lib.combine(prompt, embedded, valid, placement)
  # Which combined positions hold a padded (unused) prompt slot: place a marker the same way.
  marker = (~real).astype(embedded.dtype)[..., None]
  blank = jnp.zeros(embedded.shape[:2] + (1,), embedded.dtype)
  padded_slot, _ = placement_lib.combine(marker, blank, valid, placement)
  mask = mask & (padded_slot[..., 0] == 0)
  order = jnp.argsort(jnp.logical_not(mask).astype(jnp.int32), axis=1, stable=True)
  x = jnp.take_along_axis(x, order[..., None], axis=1)
  return x, jnp.take_along_axis(mask, order, axis=1)


def row_prefixes(table: TableArrays, index: Array) -> Optional[prefixes_lib.DeepPrompt]:
  """Per-row deep prompts [B, layers, P, H, D] of the table's entries, or None without any."""
  if not table.deep:
    return None
  out = {}
  for name, arrays in table.deep.items():
    kv = arrays.kv[index]  # [B, layers, 2, P, H, D]
    big_p = kv.shape[3]
    visible = jnp.arange(big_p)[None] >= big_p - arrays.lengths[index][:, None]  # right-aligned
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


@functools.partial(jax.jit, static_argnames=("model", "placement", "max_decode_length", "method",
                                             "num_beams", "top_k", "eos_id", "return_all_beams"))
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
