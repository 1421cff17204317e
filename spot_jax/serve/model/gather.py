"""Each row's prompt gathered from a `PromptTable` inside jit, for any backbone kind.

A row b with table index i_b gets

  prompt_b = sum_k w_bk * prompts[i_b, k]        [L, E], zero beyond l_{i_b}
  w_b      = routing of softmax(features_b @ router[i_b]) over the row's k_{i_b} prompts

(features: the mean embedding of the row's real tokens, as SMoP routes; for an ATTEMPT entry,
w_b = softmax(keys[i_b] . h_b) + one_hot(target) with h_b its attention network on the max-pooled
real tokens), placed like the prompt modules place theirs, after DePT's offsets[i_b, t] are
added to the embedding of each real token at position t. Padded prompt positions are masked
out and every row's valid positions are then moved to the front in order, so each row sees the
positions and relative distances it would see alone with its own prompt (`prompted_input`).
A row's deep prompt is its entry's prefixes of one attention type, right-aligned, with the
positions its entry lacks made invisible (`row_kv`).

`mixed` (T5) and `mixed_decoder` (decoder-only) build their batches from these.
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from spot_jax.prompts import attempt, common, dept, placement as placement_lib
from spot_jax.serve.catalog.table import ROUTING_CODES, DeepArrays, TableArrays

Array = jax.Array


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
                   placement: str = "prefix", reads: Optional[Array] = None,
                   valid: Optional[Array] = None) -> tuple[Array, Array]:
  """embedded [B, T, E], tokens [B, T], valid [B, T] bool (None: tokens > 0, T5's padding)
  -> (x [B, L + T, E], valid [B, L + T] bool).

  Valid positions of each row come first and in order (see the module docstring). `reads`
  [B, T] bool: the positions routers, ATTEMPT's pooling and DePT's offsets read (a decoder-only
  row's inputs, not its teacher-forced targets); None: every real position.
  """
  valid = tokens > 0 if valid is None else valid.astype(bool)
  read = valid if reads is None else valid & reads
  if table.offsets.shape[1]:  # some entry offsets the input embeddings (DePT)
    offsets = table.offsets[index]  # [B, S, E]
    width = embedded.shape[1]
    if offsets.shape[1] < width:  # positions no entry covers: zero (longer rows are refused)
      offsets = jnp.pad(offsets, ((0, 0), (0, width - offsets.shape[1]), (0, 0)))
    embedded = dept.add_offset(embedded, read, offsets)
  weights = route(table, index, common.mean_embedding(embedded, read))
  if table.attn_down.shape[-1]:  # static: only tables holding an ATTEMPT entry pay for it
    weights = jnp.where((table.routing[index] == ROUTING_CODES["attempt"])[:, None],
                        attempt_weights(table, index, common.max_pool(embedded, read)), weights)
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


def row_kv(arrays: DeepArrays, index: Array) -> tuple[Array, Array]:
  """One attention type's per-row prefixes: (kv [B, layers, 2, P, H, D], visible [B, P] bool).

  The table right-aligns each entry's p_n prefixes along P, so a row sees the last p of them.
  """
  kv = arrays.kv[index]
  big_p = kv.shape[3]
  visible = jnp.arange(big_p)[None] >= big_p - arrays.lengths[index][:, None]
  return kv, visible


# The compiled mixed-batch decoding of either backbone kind (`mixed`, `mixed_decoder`): one
# signature, so `server.Server` calls both alike; the settings of `search_settings` are static.
jit_generate = functools.partial(jax.jit, static_argnames=(
    "model", "placement", "max_decode_length", "method", "num_beams", "top_k", "eos_id",
    "return_all_beams"))
