"""Search algorithms over an incremental decoder: temperature sampling (greedy) and beam search.

Both run a `lax.while_loop` that stops as soon as every sequence has ended, and both are pure
functions of a step function

  tokens_to_logits(tokens [N, 1] int32, cache) -> (logits [N, V] float32, cache)

that feeds one decoder position per call and returns the next-token logits together with the
updated cache (any pytree; array leaves carry the flat batch on their leading axis, scalar
leaves such as a cache index are shared). Sequences start from `start_id` (T5's padding id 0);
the returned tokens exclude that start token and are 0 after the end-of-sequence id.
"""
from __future__ import annotations

from typing import Any, Callable, Union

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array
PyTree = Any
TokensToLogits = Callable[[Array, PyTree], tuple[Array, PyTree]]

# Temperatures at or below this are treated as 0 (argmax): dividing by them would overflow.
MIN_TEMPERATURE = 1e-4


def brevity_penalty(alpha: Union[float, Array], length: Union[int, Array]) -> Array:
  """GNMT length penalty ((5 + length) / 6) ** alpha; beam scores are log-prob / penalty."""
  return jnp.power((5.0 + jnp.asarray(length, jnp.float32)) / 6.0, alpha)


def expand_beams(x: Array, num_beams: int) -> Array:
  """Repeats each batch row `num_beams` times: [B, ...] -> [B * num_beams, ...] (row-major)."""
  return jnp.repeat(x, num_beams, axis=0)


def _map_batched(fn: Callable[[Array], Array], cache: PyTree) -> PyTree:
  """Applies `fn` to the batched leaves of a cache; scalar leaves (cache indices) are shared."""
  return jax.tree_util.tree_map(lambda x: x if jnp.ndim(x) == 0 else fn(x), cache)


def _gather(x: Array, indices: Array) -> Array:
  """x [B, N, ...], indices [B, M] -> [B, M, ...] (per-row gather along axis 1)."""
  return jax.vmap(lambda row, idx: row[idx])(x, indices)


def _gather_cache(cache: PyTree, beam_indices: Array) -> PyTree:
  """Reorders a flat [B * K, ...] cache so that beam k of row b copies beam beam_indices[b, k]."""
  batch, beams = beam_indices.shape

  def gather_leaf(x: Array) -> Array:
    if x.shape[0] != batch * beams:
      raise ValueError(f"cache leaf of shape {x.shape} does not lead with the flat batch "
                       f"{batch} * {beams} beams = {batch * beams}")
    rows = x.reshape((batch, beams) + x.shape[1:])
    return _gather(rows, beam_indices).reshape(x.shape)

  return _map_batched(gather_leaf, cache)


def temperature_sample(tokens_to_logits: TokensToLogits, cache: PyTree, *, batch_size: int,
                       max_decode_length: int, rng: Array | None = None,
                       temperature: Union[float, Array] = 1.0, top_k: int = 0, eos_id: int = 1,
                       start_id: int = 0) -> tuple[Array, Array]:
  """Samples one continuation per row; temperature 0 is greedy (argmax) decoding.

  Args:
    tokens_to_logits: the step function (see module docstring), batch N = `batch_size`.
    cache: its initial cache.
    batch_size: B.
    max_decode_length: L, the most tokens generated per row (including the EOS).
    rng: PRNG key; step i samples with `fold_in(rng, i)`. Unused when temperature is a Python 0.
    temperature: softmax temperature; a value <= MIN_TEMPERATURE picks the argmax. May be traced.
    top_k: if > 0, sample only among the k most likely tokens (static).
    eos_id: the end-of-sequence id.
    start_id: the token fed at the first step (T5's decoder start, the padding id 0).

  Returns:
    tokens [B, L] int32 (0 after EOS) and scores [B]: the sum of the model's log-probabilities
    (temperature 1, before top-k) of the emitted tokens up to and including EOS.
  """
  greedy = isinstance(temperature, (int, float)) and temperature <= MIN_TEMPERATURE
  if rng is None and not greedy:
    raise ValueError("temperature sampling needs an rng key (jax.random.PRNGKey); pass rng=... or "
                     "use temperature=0 for greedy decoding")
  if rng is None:
    rng = jax.random.PRNGKey(0)  # never consumed: the argmax path draws no randomness

  def choose(logits: Array, step: Array) -> Array:
    best = jnp.argmax(logits, axis=-1)
    if greedy:
      return best
    if top_k > 0:
      kth = lax.top_k(logits, top_k)[0][:, -1:]
      logits = jnp.where(logits < kth, -jnp.inf, logits)
    scaled = logits / jnp.maximum(temperature, MIN_TEMPERATURE)
    sampled = jax.random.categorical(jax.random.fold_in(rng, step), scaled, axis=-1)
    return jnp.where(temperature > MIN_TEMPERATURE, sampled, best)

  def cond(state):
    step, _, _, ended, _, _ = state
    return (step < max_decode_length) & ~jnp.all(ended)

  def body(state):
    step, last, tokens, ended, scores, cache = state
    logits, cache = tokens_to_logits(last[:, None], cache)
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    token = choose(logits, step).astype(jnp.int32)
    token = jnp.where(ended, 0, token)
    token_log_prob = jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]
    scores = scores + jnp.where(ended, 0.0, token_log_prob)
    tokens = lax.dynamic_update_slice(tokens, token[:, None], (0, step))
    ended = ended | (token == eos_id)
    return step + 1, token, tokens, ended, scores, cache

  init = (jnp.array(0, jnp.int32), jnp.full((batch_size,), start_id, jnp.int32),
          jnp.zeros((batch_size, max_decode_length), jnp.int32), jnp.zeros((batch_size,), bool),
          jnp.zeros((batch_size,), jnp.float32), cache)
  _, _, tokens, _, scores, _ = lax.while_loop(cond, body, init)
  return tokens, scores


def beam_search(tokens_to_logits: TokensToLogits, cache: PyTree, *, batch_size: int,
                num_beams: int, max_decode_length: int, alpha: Union[float, Array] = 0.6,
                eos_id: int = 1, start_id: int = 0) -> tuple[Array, Array]:
  """Beam search with t5x's alive/finished bookkeeping and GNMT length penalty.

  Each step extends the K alive beams by every token and keeps the 2K best candidates by
  log-prob (at most K of them end with EOS, so K alive ones always remain). Candidates ending
  with EOS that rank among the best K enter the finished set with score
  log-prob / brevity_penalty(alpha, length); the best K candidates not ending there stay alive,
  and the cache is gathered by their parent beams. Two choices differ from t5x: an EOS
  candidate ranked K+1..2K is dropped rather than finished (as Hugging Face does), so one beam
  with alpha=0 is exactly greedy decoding; and beams still alive at `max_decode_length` are
  scored as finished (length L) rather than only used as a fallback, so the search ranks every
  sequence that ends at EOS or at the length limit. The loop stops early once no alive beam can
  beat the K-th finished one (log-probs only fall, and the penalty is monotone in length).

  Args:
    tokens_to_logits: the step function, batch N = `batch_size * num_beams` (beam-major within
      each row: flat index b * K + k), e.g. over encoder outputs passed through `expand_beams`.
    cache: its initial cache for batch `batch_size`; it is expanded to the beams here.
    batch_size: B.
    num_beams: K.
    max_decode_length: L.
    alpha: length-penalty exponent (0 ranks by plain log-prob). May be traced.
    eos_id: the end-of-sequence id.
    start_id: the token fed at the first step.

  Returns:
    sequences [B, K, L] int32 sorted best first (0 after EOS) and their scores [B, K]; a score
    is -inf only when fewer than K distinct sequences exist.
  """
  k, length = num_beams, max_decode_length
  cache = _map_batched(lambda x: expand_beams(x, k), cache)
  neg_inf = jnp.array(-jnp.inf, jnp.float32)
  max_penalty = jnp.maximum(brevity_penalty(alpha, 1), brevity_penalty(alpha, length))

  def cond(state):
    step, live_logp, _, _, finished_scores, _ = state
    # The best an alive beam can still reach, against the worst of the K finished beams.
    best_alive = live_logp[:, 0] / max_penalty
    worst_finished = finished_scores[:, -1]
    return (step < length) & ~jnp.all(worst_finished > best_alive)

  def body(state):
    step, live_logp, live_seqs, finished_seqs, finished_scores, cache = state
    last = jnp.where(step == 0, start_id,
                     lax.dynamic_index_in_dim(live_seqs, jnp.maximum(step - 1, 0), 2, False))
    logits, cache = tokens_to_logits(last.reshape(batch_size * k, 1), cache)
    vocab = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32),
                                   axis=-1).reshape(batch_size, k, vocab)
    candidates = (live_logp[:, :, None] + log_probs).reshape(batch_size, k * vocab)
    top_logp, top_flat = lax.top_k(candidates, 2 * k)  # [B, 2K]
    top_parent, top_token = top_flat // vocab, (top_flat % vocab).astype(jnp.int32)
    top_seqs = _gather(live_seqs, top_parent)
    top_seqs = lax.dynamic_update_slice(top_seqs, top_token[:, :, None], (0, 0, step))
    done = (top_token == eos_id) | (step == length - 1)
    finishes = done & (jnp.arange(2 * k) < k)[None, :]  # top_k output is sorted best first

    alive_logp, alive_pick = lax.top_k(jnp.where(done, neg_inf, top_logp), k)
    live_seqs = _gather(top_seqs, alive_pick)
    cache = _gather_cache(cache, _gather(top_parent, alive_pick))

    new_scores = jnp.where(finishes, top_logp / brevity_penalty(alpha, step + 1), neg_inf)
    all_scores = jnp.concatenate([finished_scores, new_scores], axis=1)
    all_seqs = jnp.concatenate([finished_seqs, top_seqs], axis=1)
    finished_scores, keep = lax.top_k(all_scores, k)
    finished_seqs = _gather(all_seqs, keep)
    return step + 1, alive_logp, live_seqs, finished_seqs, finished_scores, cache

  # Only beam 0 starts alive: the K copies are identical and must not yield K equal beams.
  live_logp = jnp.tile(jnp.concatenate([jnp.zeros((1,)), jnp.full((k - 1,), -jnp.inf)]),
                       (batch_size, 1)).astype(jnp.float32)
  seqs = jnp.zeros((batch_size, k, length), jnp.int32)
  init = (jnp.array(0, jnp.int32), live_logp, seqs, seqs,
          jnp.full((batch_size, k), -jnp.inf, jnp.float32), cache)
  _, _, _, finished_seqs, finished_scores, _ = lax.while_loop(cond, body, init)
  return finished_seqs, finished_scores
