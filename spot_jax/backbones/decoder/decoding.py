"""KV-cache generation for `DecoderLM`: a prefill, then one token per step, in one jitted call.

The rows of a batch may have different lengths (any padding, marked by `valid`). Each row is
first rolled to start at index 0 (the layout the input hook's placements are made for: a soft
prompt then sits next to its row's tokens whatever the caller's padding), and after the input
hook rolled right so that every row ends at the same index: its padding moves to the front,
where it is masked. Every step then writes the cache at one index for the whole batch.

The cache holds, per layer, keys and values [B, K, S, D] (heads-major) with S = P + T' +
max_new_tokens (P deep-prefix entries first, written once), plus per entry its validity and its
index in the row as given (its index before rolling). Masks use those indices, so causality and
the sliding window (i - W < j <= i) are those of the unrolled row, and the result equals the
uncached forward over the growing sequence. RoPE positions are P + (number of valid entries
before).

`generate` is jitted with the module, `max_new_tokens`, `top_k` and `eos_id` static; the
temperature and the rng are traced, so greedy decoding and sampling at any temperature share
one compiled program per input shape.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp

from spot_jax import validate
from spot_jax.backbones.decoder.config import DecoderConfig
from spot_jax.backbones.decoder.network import DecoderLM, Prefixes

Array = jax.Array


def generate(module: DecoderLM, params: Any, tokens: Array, valid: Optional[Array], *,
             max_new_tokens: int, rng: Optional[Array] = None, temperature: float = 0.0,
             top_k: Optional[int] = None, eos_id: int, prefixes: Optional[Prefixes] = None,
             task_index: Optional[Array] = None) -> Array:
  """Generates up to `max_new_tokens` tokens after each row of `tokens`.

  Args:
    module: the network (its prompt module, if any, applies as in training).
    params: its parameters (the prompt's under "prompt"), boxed or plain.
    tokens: [B, T] int32 ids.
    valid: [B, T] bool, True at real tokens (left, right or no padding); None: all real.
    max_new_tokens: N, tokens generated per row, EOS included (static).
    rng: PRNG key for sampling (default PRNGKey(0)); step s uses fold_in(rng, s).
    temperature: 0 for greedy (argmax), else sampling from softmax(logits / temperature).
    top_k: sample among the k likeliest tokens only (static); None: all.
    eos_id: end of sequence (static): a row stops after it.
    prefixes: per layer (key, value) [B or 1, P, K, D]; None: the deep prompt's, if any.
    task_index: [B] int, each row's task (multi-task prompt modules).

  Returns:
    [B, N] int32: each row's tokens, its EOS, then 0.

  Raises:
    ConfigError: a non-positive max_new_tokens or top_k, or a negative temperature.
  """
  max_new_tokens = validate.positive_int(max_new_tokens, "max_new_tokens", example=32)
  validate.positive_int(top_k, "top_k", optional=True, example=40)
  if not isinstance(temperature, jax.Array):
    validate.non_negative(temperature, "temperature", example=0.7)
  rng = jax.random.PRNGKey(0) if rng is None else rng
  tokens = jnp.asarray(tokens, jnp.int32)
  valid = jnp.ones(tokens.shape, bool) if valid is None else jnp.asarray(valid, bool)
  return _generate(module, params, tokens, valid, rng, jnp.asarray(temperature, jnp.float32),
                   prefixes, task_index, max_new_tokens=max_new_tokens, top_k=top_k,
                   eos_id=int(eos_id))


def choose(logits: Array, rng: Array, temperature: Array, top_k: Optional[int]) -> Array:
  """[B, V] logits -> [B] int32: argmax at temperature 0, else a (top-k) sample drawn with
  `rng` from softmax(logits / temperature)."""
  greedy = jnp.argmax(logits, axis=-1)
  if top_k is not None:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  sampled = jax.random.categorical(rng, logits / jnp.maximum(temperature, 1e-6), axis=-1)
  return jnp.where(temperature > 0, sampled, greedy).astype(jnp.int32)


def _roll(x: Array, valid: Array, to_end: bool) -> tuple[Array, Array, Array]:
  """Rows rolled so that each one's first valid entry is at index 0 (`to_end` False) or its
  last valid entry at the end (`to_end` True); the padding that moves wraps around.

  Returns:
    (x [B, T, ...], valid [B, T], shift [B]: how far right each row moved).
  """
  length = valid.shape[1]
  if to_end:  # one past the last valid entry
    shift = length - jnp.max(jnp.where(valid, jnp.arange(1, length + 1), 0), axis=1)
  else:  # minus the first valid entry (0 for a row without any)
    shift = -jnp.min(jnp.where(valid, jnp.arange(length), length), axis=1) % length
  shift = shift.astype(jnp.int32)
  source = (jnp.arange(length)[None] - shift[:, None]) % length
  rolled = jnp.take_along_axis(x, source.reshape(source.shape + (1,) * (x.ndim - 2)), axis=1)
  return rolled, jnp.take_along_axis(valid, source, axis=1), shift


def empty_cache(config: DecoderConfig, prefixes: Optional[Prefixes], batch: int, size: int
                ) -> tuple:
  """Per layer (key, value) [B, K, size, D] zeros (heads-major, see `layers.Attention`), the
  deep prefixes (per layer (key, value) [B or 1, P, K, D], or None) written at the front."""
  cfg = config
  shape = (batch, cfg.num_kv_heads, size, cfg.head_dim)
  cache = []
  for i in range(cfg.num_layers):
    pair = []
    for part in range(2):
      entry = jnp.zeros(shape, cfg.activation_dtype)
      if prefixes is not None:
        front = jnp.swapaxes(prefixes[i][part], 1, 2).astype(cfg.activation_dtype)
        front = jnp.broadcast_to(front, (batch,) + front.shape[1:])
        entry = jax.lax.dynamic_update_slice(entry, front, (0, 0, 0, 0))
      pair.append(entry)
    cache.append(tuple(pair))
  return tuple(cache)


@functools.partial(jax.jit, static_argnames=("module", "max_new_tokens", "top_k", "eos_id"))
def _generate(module: DecoderLM, params: Any, tokens: Array, valid: Array, rng: Array,
              temperature: Array, prefixes: Optional[Prefixes], task_index: Optional[Array], *,
              max_new_tokens: int, top_k: Optional[int], eos_id: int) -> Array:
  """`generate` after its checks (see there); everything here is one program."""
  variables = {"params": params}
  # The input hook's placements are for rows that start at index 0 (right padding).
  tokens, valid, _ = _roll(tokens, valid, to_end=False)
  x, valid = module.apply(variables, tokens, valid=valid, task_index=task_index,
                          method=DecoderLM.inputs)
  if prefixes is None:
    prefixes = module.apply(variables, method=DecoderLM.deep_prefixes)
  batch, length = valid.shape
  num = 0 if prefixes is None else prefixes[0][0].shape[1]
  x, valid, shift = _roll(x, valid, to_end=True)

  # Every cache entry's index in its row as given: prefixes 0..P-1, the rest moved by shift.
  size = num + length + max_new_tokens
  slots = jnp.arange(size, dtype=jnp.int32)[None]
  k_index = jnp.where(slots < num, slots, slots - shift[:, None])
  k_valid = jnp.zeros((batch, size), bool).at[:, :num].set(True)
  k_valid = k_valid.at[:, num:num + length].set(valid)
  count = num + jnp.sum(valid, axis=1, dtype=jnp.int32)  # the next position of each row
  stack = functools.partial(module.apply, variables, method=DecoderLM.stack, last_only=True)

  logits, cache = stack(
      x, positions=num + jnp.maximum(jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1, 0),
      q_index=k_index[:, num:num + length], k_index=k_index, k_valid=k_valid,
      past=empty_cache(module.config, prefixes, batch, size), write_index=jnp.int32(num))
  first = choose(logits[:, -1], jax.random.fold_in(rng, 0), temperature, top_k)
  out = jnp.zeros((batch, max_new_tokens), jnp.int32).at[:, 0].set(first)

  def step(state):
    """Feeds generated token s - 1 at slot num + length + s - 1 and chooses token s."""
    s, token, cache, k_valid, done, out = state
    slot = num + length + s - 1
    k_valid = jax.lax.dynamic_update_slice(k_valid, jnp.ones((batch, 1), bool), (0, slot))
    embedded = module.apply(variables, token[:, None], method=DecoderLM.embed)
    logits, cache = stack(embedded, positions=(count + s - 1)[:, None],
                          q_index=jax.lax.dynamic_slice_in_dim(k_index, slot, 1, axis=1),
                          k_index=k_index, k_valid=k_valid, past=cache, write_index=slot)
    token = choose(logits[:, -1], jax.random.fold_in(rng, s), temperature, top_k)
    token = jnp.where(done, 0, token)
    out = jax.lax.dynamic_update_slice(out, token[:, None], (0, s))
    return s + 1, token, cache, k_valid, done | (token == eos_id), out

  def more(state):
    return (state[0] < max_new_tokens) & ~jnp.all(state[4])

  state = (jnp.int32(1), first, cache, k_valid, first == eos_id, out)
  return jax.lax.while_loop(more, step, state)[-1]
