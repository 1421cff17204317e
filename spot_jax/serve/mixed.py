"""Mixed-task batches: every row carries its own prompt, gathered from a `PromptTable` in jit.

The frozen backbone is a prompt-less `Transformer`; a row b with table index i_b gets

  prompt_b = sum_k w_bk * prompts[i_b, k]        [L, E], zero beyond l_{i_b}
  w_b      = routing of softmax(features_b @ router[i_b]) over the row's k_{i_b} prompts

(features: the mean embedding of the row's real tokens, as SMoP routes), placed like the
prompt modules place theirs. Padded prompt positions are masked out, and every row's valid
positions are then moved to the front in order, so each row sees exactly the positions (and
relative distances) it would see alone with its own prompt: a mixed batch decodes like the
per-example, per-prompt model. Shapes depend only on (B, T, table shape), never on the mix,
so one compiled function serves any mix.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from spot_jax.prompts import common, placement as placement_lib
from spot_jax.serve.table import ROUTING_CODES, TableArrays
from spot_jax.t5 import generation
from spot_jax.t5.network import Transformer

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


def prompted_input(table: TableArrays, index: Array, embedded: Array, tokens: Array,
                   placement: str = "prefix") -> tuple[Array, Array]:
  """embedded [B, T, E], tokens [B, T] -> (x [B, L + T, E], valid [B, L + T] bool).

  Valid positions of each row come first and in order (see the module docstring).
  """
  valid = tokens > 0
  weights = route(table, index, common.mean_embedding(embedded, valid))
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


def encode(model: Transformer, params: PyTree, table: TableArrays, index: Array, tokens: Array,
           placement: str = "prefix") -> tuple[Array, Array]:
  """Deterministic encoder pass with per-row prompts -> (encoded [B, L+T, E], valid [B, L+T])."""
  embedded = model.apply({"params": params}, tokens, method=lambda m, t: m.token_embedder(t))
  x, valid = prompted_input(table, index, embedded, tokens, placement)
  encoded = model.apply({"params": params}, x, valid,
                        method=lambda m, x, v: m.encoder(x, v, True))
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
  return generation.search(model, params, encoded, valid, rng, alpha, temperature,
                           max_decode_length=max_decode_length, method=method,
                           num_beams=num_beams, top_k=top_k, eos_id=eos_id,
                           return_all_beams=return_all_beams)


def _target_log_likelihood(model: Transformer, params: PyTree, encoded: Array, valid: Array,
                           targets: Array) -> Array:
  """Sum of log-probabilities [N] of targets [N, S] (0 = padding) given the encoder output."""
  decoder_input = jnp.concatenate([jnp.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
  logits = model.apply({"params": params}, encoded, valid, decoder_input, targets,
                       enable_dropout=False, method=Transformer.decode)
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
  token_lp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  return jnp.sum(token_lp * (targets > 0), axis=-1)


@functools.partial(jax.jit, static_argnames=("model", "placement"))
def score_mixed(model: Transformer, params: PyTree, table: TableArrays, index: Array,
                tokens: Array, targets: Array, *, placement: str) -> Array:
  """Sum of target log-probabilities [B] of targets [B, S] (0 = padding) under row prompts."""
  encoded, valid = encode(model, params, table, index, tokens, placement)
  return _target_log_likelihood(model, params, encoded, valid, targets)


@functools.partial(jax.jit, static_argnames=("model", "placement"))
def classify_mixed(model: Transformer, params: PyTree, table: TableArrays, index: Array,
                   tokens: Array, labels: Array, *, placement: str) -> Array:
  """Log-likelihoods [B, C] of every label row labels [C, S] for every input row.

  The encoder runs once per input (not once per input and label): its output is repeated for
  the C label rows the decoder scores.
  """
  encoded, valid = encode(model, params, table, index, tokens, placement)
  batch, num_labels = tokens.shape[0], labels.shape[0]
  scores = _target_log_likelihood(model, params, jnp.repeat(encoded, num_labels, axis=0),
                                  jnp.repeat(valid, num_labels, axis=0),
                                  jnp.tile(labels, (batch, 1)))
  return scores.reshape(batch, num_labels)
