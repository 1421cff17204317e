"""Mixed-prompt batches on a frozen decoder-only backbone (Llama, Gemma): `mixed`'s counterpart.

The frozen model is a prompt-less `DecoderLM`. A row b reads what the trainer's decoder-only
batches give the model (`spot_jax.models.decoder_only`): [BOS, inputs] to decode after, or
[BOS, inputs, targets[:-1]] to score targets. Its entry's prompt is gathered and placed by
`gather.prompted_input` on the embedded row ("prefix": before BOS, "after_bos"), its valid
positions first, and the network runs on that (`DecoderLM.stack`) with per-row indices:

  a deep prompt's p_b prefixes (the table's "decoder" prefixes, right-aligned along P, the
  P - p_b in front invisible) have indices 0..p_b-1; the row's u-th valid position has index and
  RoPE position p_b + u; a generated token s has p_b + n_b + s (n_b the row's valid positions)

which is what `DecoderLM` gives the row alone with its own prompt module, so every row scores
and decodes as it would alone. Decoding rolls each row so that its last position ends the
prefill; then one token per step for the whole batch against a key/value cache of P + M + N
entries (prefixes, prefill, new tokens). Class labels are scored as continuations of the
inputs from one cache of [BOS, inputs] per row, as `DecoderOnlyModel.classify_batch` does.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.backbones.decoder import decoding
from spot_jax.backbones.decoder.network import DecoderLM
from spot_jax.models import decoder_only
from spot_jax.serve.model.gather import jit_generate, prompted_input, row_kv
from spot_jax.serve.catalog.table import TableArrays

Array = jax.Array
PyTree = Any

METHODS = ("greedy", "sample")
PLACEMENTS = decoder_only.INPUT_HOOK_PLACEMENTS


def search_settings(model: DecoderLM, *, max_decode_length: int, method: str = "greedy",
                    num_beams: int = 4, alpha: float = 0.6, temperature: float = 1.0,
                    top_k: int = 0, rng: Optional[Array] = None, eos_id: int = 1,
                    return_all_beams: bool = False) -> tuple[tuple, dict[str, Any]]:
  """`generation.search_settings`' counterpart: ((rng, alpha, temperature), static settings).

  Raises:
    ConfigError: beam search (the decoder decodes greedily or samples), or a bad setting.
  """
  del num_beams, alpha, return_all_beams  # beam search only
  if method not in METHODS:
    raise ConfigError(f"--method={method} is not available on a decoder-only backbone; valid: "
                      f"{', '.join(METHODS)}")
  validate.positive_int(max_decode_length, "max_decode_length")
  if not isinstance(eos_id, int) or not 0 < eos_id < model.config.vocab_size:
    raise ConfigError(f"eos_id must be an integer in [1, vocab_size={model.config.vocab_size}), "
                      f"got {eos_id!r}")
  if method == "sample":
    if rng is None:
      raise ConfigError("method='sample' needs rng=jax.random.PRNGKey(...)")
    validate.non_negative(temperature, "--temperature")
    validate.positive_int(top_k, "--top_k", minimum=0)
  else:
    rng, temperature, top_k = None, 0.0, 0
  dynamic = (rng, np.asarray(0.0, np.float32), np.asarray(temperature, np.float32))
  return dynamic, {"max_decode_length": max_decode_length, "method": method, "num_beams": 1,
                   "top_k": top_k, "eos_id": eos_id, "return_all_beams": False}


def check_placement(placement: str) -> None:
  """Refuses a placement no decoder-only row can use, in one line."""
  if placement not in PLACEMENTS:
    raise ConfigError(f"--placement={placement} puts the prompt after the targets of a "
                      f"decoder-only model, where no target sees it; valid: "
                      f"{', '.join(PLACEMENTS)}")


def _prompted(model: DecoderLM, params: PyTree, table: TableArrays, index: Array, tokens: Array,
              valid: Array, placement: str, reads: Optional[Array] = None
              ) -> tuple[Array, Array]:
  """Model input tokens [B, T] (BOS first) -> (x [B, M, E], valid [B, M], valid first);
  `reads`: the positions the prompts read (the inputs; None: all)."""
  tokens = jnp.where(valid, tokens, 0)  # padding ids are never read, whatever they are
  embedded = model.apply({"params": params}, tokens, method=DecoderLM.embed)
  return prompted_input(table, index, embedded, tokens, placement, reads, valid)


def _prefixes(table: TableArrays, index: Array) -> tuple[Optional[tuple], Array, Array]:
  """(per layer (key, value) [B, P, K, D] or None, visible [B, P], p_b [B])."""
  if "decoder" not in table.deep:
    return None, jnp.zeros((index.shape[0], 0), bool), jnp.zeros(index.shape, jnp.int32)
  kv, visible = row_kv(table.deep["decoder"], index)  # [B, layers, 2, P, K, D], [B, P]
  pairs = tuple((kv[:, i, 0], kv[:, i, 1]) for i in range(kv.shape[1]))
  return pairs, visible, table.deep["decoder"].lengths[index]


def _forward(model: DecoderLM, params: PyTree, table: TableArrays, index: Array, x: Array,
             valid: Array, keep: Optional[Array] = None) -> Array:
  """Teacher-forced logits [B, M, V] of compacted rows (valid first), with per-row prefixes;
  with `keep` [B, K] (compacted slots), of those slots only ([B, K, V])."""
  past, visible, num = _prefixes(table, index)
  big_p = visible.shape[1]
  batch, length = valid.shape
  slots = jnp.arange(length, dtype=jnp.int32)[None]
  q_index = num[:, None] + slots
  k_index = jnp.concatenate([jnp.arange(big_p, dtype=jnp.int32)[None] - big_p + num[:, None],
                             q_index], axis=1)
  logits, _ = model.apply({"params": params}, x, positions=q_index, q_index=q_index,
                          k_index=k_index, k_valid=jnp.concatenate([visible, valid], axis=1),
                          past=past, keep=keep, method=DecoderLM.stack)
  return logits


def _token_slots(table: TableArrays, index: Array, length: int, placement: str) -> Array:
  """[B, T] the compacted slot of each model input position t (after the row's prompt)."""
  t = jnp.arange(length, dtype=jnp.int32)[None]
  shifted = t + table.lengths[index][:, None]
  return jnp.where(t == 0, 0, shifted) if placement == "after_bos" else shifted


def _scores(model: DecoderLM, params: PyTree, table: TableArrays, index: Array, inputs: Array,
            targets: Array, placement: str, valid: Optional[Array] = None,
            target_valid: Optional[Array] = None) -> Array:
  """Sum of the targets' log-probabilities [B] after inputs [B, T] (the trainer's layout);
  validity [B, T] / [B, S] bool (None: ids > 0).

  The output layer runs on each row's S = targets.shape[1] target slots only."""
  sequence, weights = decoder_only.concatenate(inputs, targets, valid, target_valid)
  tokens = decoder_only.shift_right(sequence, model.config.bos_id)
  real = decoder_only.sequence_valid(inputs, weights, valid) > 0
  x, valid = _prompted(model, params, table, index, tokens, real, placement,
                       decoder_only.input_positions(weights))
  order = jnp.argsort((weights <= 0).astype(jnp.int32), axis=1, stable=True)[:, :targets.shape[1]]
  sequence, weights = (jnp.take_along_axis(a, order, axis=1) for a in (sequence, weights))
  slots = _token_slots(table, index, tokens.shape[1], placement)
  keep = jnp.take_along_axis(slots, order, axis=1)
  logits = _forward(model, params, table, index, x, valid, keep)  # [B, S, V]
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  picked = jnp.take_along_axis(log_probs, sequence[..., None], axis=-1)[..., 0]
  return jnp.sum(picked * weights, axis=1)


@functools.partial(jax.jit, static_argnames=("model", "placement"))
def score_mixed(model: DecoderLM, params: PyTree, table: TableArrays, index: Array,
                tokens: Array, targets: Array, *, placement: str,
                valid: Optional[Array] = None, target_valid: Optional[Array] = None) -> Array:
  """Sum of target log-probabilities [B] of targets [B, S] under row prompts; `valid` /
  `target_valid` [B, T] / [B, S] bool mark the tokens (None: ids > 0, 0 = padding)."""
  return _scores(model, params, table, index, tokens, targets, placement, valid, target_valid)


def _prefill(model: DecoderLM, params: PyTree, table: TableArrays, index: Array, tokens: Array,
             placement: str, extra: int, valid: Optional[Array] = None
             ) -> tuple[Array, tuple, Array, Array, int]:
  """Runs [BOS, inputs] of each row with its prompt into a key/value cache of P + M + `extra`
  slots, rows rolled so that their last real position ends the prefill.

  Returns:
    (the last position's logits [B, 1, V], the cache, key indices [B, P + M + extra], key
    validity [B, P + M + extra] with the `extra` slots still invalid, P + M: the first of them).
  """
  batch = tokens.shape[0]
  bos = jnp.full((batch, 1), model.config.bos_id, jnp.int32)
  sequence = jnp.concatenate([bos, tokens.astype(jnp.int32)], axis=1)
  real = jnp.concatenate([jnp.ones_like(bos, bool), decoder_only.validity(tokens, valid)], 1)
  x, valid = _prompted(model, params, table, index, sequence, real, placement)
  x, valid = _roll_to_end(x, valid)
  past, visible, num = _prefixes(table, index)
  big_p, big_m = visible.shape[1], valid.shape[1]
  count = jnp.sum(valid, axis=1, dtype=jnp.int32)  # n_b
  size = big_p + big_m + extra
  slots = jnp.arange(size, dtype=jnp.int32)[None]
  k_index = jnp.where(slots < big_p, slots - big_p + num[:, None],
                      slots - big_p - big_m + count[:, None] + num[:, None])
  k_valid = jnp.concatenate([visible, valid, jnp.zeros((batch, extra), bool)], axis=1)
  q_index = k_index[:, big_p:big_p + big_m]
  logits, cache = model.apply({"params": params}, x, positions=q_index, q_index=q_index,
                              k_index=k_index, k_valid=k_valid,
                              past=decoding.empty_cache(model.config, past, batch, size),
                              write_index=jnp.int32(big_p), last_only=True,
                              method=DecoderLM.stack)
  return logits, cache, k_index, k_valid, big_p + big_m


@functools.partial(jax.jit, static_argnames=("model", "placement"))
def classify_mixed(model: DecoderLM, params: PyTree, table: TableArrays, index: Array,
                   tokens: Array, labels: Array, *, placement: str,
                   valid: Optional[Array] = None, label_valid: Optional[Array] = None) -> Array:
  """Log-likelihoods [B, C] of every label row labels [C, S] after every input row [B, T]
  (validity `valid` [B, T], `label_valid` [C, S]; None: ids > 0).

  [BOS, inputs] and each row's prompt run once, into a key/value cache (rows rolled so that
  their last real position ends the prefix, as `generate_mixed` does); each label then reads
  that cache: C passes of S positions instead of B * C sequences of T + S. The prompts read
  the inputs alone either way (`_scores`' `reads`), so routers, ATTEMPT and DePT score alike."""
  batch, big_s = tokens.shape[0], labels.shape[1]
  logits, cache, k_index, k_valid, start = _prefill(model, params, table, index, tokens,
                                                    placement, big_s, valid)
  k_valid = k_valid.at[:, start:].set(True)
  stack = functools.partial(model.apply, {"params": params}, method=DecoderLM.stack)
  at = k_index[:, start:]

  def one(row: tuple[Array, Array]) -> Array:
    """[S] -> [B]: the label's log-likelihood after each row's prefix."""
    label, real = row
    rows = jnp.broadcast_to(label.astype(jnp.int32), (batch, big_s))
    scored = logits
    if big_s > 1:  # token j of the label is predicted at its position j - 1
      embedded = model.apply({"params": params}, rows[:, :-1], method=DecoderLM.embed)
      following, _ = stack(embedded, positions=at[:, :-1], q_index=at[:, :-1],
                           k_index=k_index, k_valid=k_valid, past=cache,
                           write_index=jnp.int32(start))
      scored = jnp.concatenate([logits, following], axis=1)
    log_probs = jax.nn.log_softmax(scored.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, rows[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(real[None], picked, 0.0), axis=1)

  return jax.lax.map(one, (labels, decoder_only.validity(labels, label_valid))).T


def _roll_to_end(x: Array, valid: Array) -> tuple[Array, Array]:
  """Rows whose valid positions come first, rolled so that the last one ends the row."""
  length = valid.shape[1]
  shift = length - jnp.sum(valid, axis=1, dtype=jnp.int32)
  source = (jnp.arange(length)[None] - shift[:, None]) % length
  x = jnp.take_along_axis(x, source[..., None], axis=1)
  return x, jnp.take_along_axis(valid, source, axis=1)


def _choose(logits: Array, rng: Optional[Array], step: int | Array, temperature: Array,
            top_k: int) -> tuple[Array, Array]:
  """[B, V] -> (token [B] int32: argmax, or a (top-k) sample; its log-probability [B])."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  if rng is None:
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  else:
    token = decoding.choose(logits, jax.random.fold_in(rng, step), temperature, top_k or None)
  return token, jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]


@jit_generate
def generate_mixed(model: DecoderLM, params: PyTree, table: TableArrays, index: Array,
                   tokens: Array, rng: Optional[Array], alpha: Array, temperature: Array, *,
                   placement: str, max_decode_length: int, method: str, num_beams: int,
                   top_k: int, eos_id: int, return_all_beams: bool,
                   valid: Optional[Array] = None) -> tuple[Array, Array]:
  """Decodes a mixed batch after [BOS, inputs]: (tokens [B, N] int32, 0 after EOS; scores [B],
  the sum of the chosen tokens' log-probabilities, EOS included).

  Args:
    model: a prompt-less `DecoderLM`; params: its (frozen) parameters.
    table: the prompt table's arrays; index: [B] int32 table rows; tokens: [B, T] input ids
      (EOS included, right-padded); valid: [B, T] bool, the tokens (None: ids > 0).
    rng, alpha, temperature and the keyword settings: from `search_settings` (alpha, num_beams
      and return_all_beams are beam search's, unused here).
  """
  del alpha, method, num_beams, return_all_beams
  batch, big_n = tokens.shape[0], max_decode_length
  logits, cache, k_index, k_valid, start = _prefill(model, params, table, index, tokens,
                                                    placement, big_n, valid)
  stack = functools.partial(model.apply, {"params": params}, method=DecoderLM.stack,
                            last_only=True)
  first, first_lp = _choose(logits[:, -1], rng, 0, temperature, top_k)
  out = jnp.zeros((batch, big_n), jnp.int32).at[:, 0].set(first)

  def step(state):
    """Feeds token s - 1 at slot P + M + s - 1 and chooses token s."""
    s, token, cache, k_valid, done, out, scores = state
    slot = start + s - 1
    k_valid = jax.lax.dynamic_update_slice(k_valid, jnp.ones((batch, 1), bool), (0, slot))
    embedded = model.apply({"params": params}, token[:, None], method=DecoderLM.embed)
    at = jax.lax.dynamic_slice_in_dim(k_index, slot, 1, axis=1)
    logits, cache = stack(embedded, positions=at, q_index=at, k_index=k_index, k_valid=k_valid,
                          past=cache, write_index=slot)
    token, lp = _choose(logits[:, -1], rng, s, temperature, top_k)
    scores = scores + jnp.where(done, 0.0, lp)
    token = jnp.where(done, 0, token)
    out = jax.lax.dynamic_update_slice(out, token[:, None], (0, s))
    return s + 1, token, cache, k_valid, done | (token == eos_id), out, scores

  def more(state):
    return (state[0] < big_n) & ~jnp.all(state[4])

  state = (jnp.int32(1), first, cache, k_valid, first == eos_id, out, first_lp)
  _, _, _, _, _, out, scores = jax.lax.while_loop(more, step, state)
  return out, scores
