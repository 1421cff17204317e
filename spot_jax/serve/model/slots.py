"""Per-slot key/value caches of a decoder-only backbone: prefill requests, insert their rows into
slots, then decode every slot one token per compiled step, each with its own prompt and sampling
settings.

The engine holds S slots; slot s owns row s of every array of a `SlotState`:

  cache    per layer (key, value) [S, K, C, D]    C = H + W + N key positions (heads-major)
  k_index  [S, C] int32      each key position's index (RoPE position), see below
  k_valid  [S, C] bool       which key positions hold a real key
  write    [S] int32         the cache position the next token's key goes to
  next     [S] int32         the index of that token
  token    [S] int32         the token the next step feeds

A slot's row is [head (H = P + L + 1) | body (W = L + 1 + T_max) | generated (N)]. The head
starts each request: the prompt's deep prefixes (right-aligned along P, indices p - P .. -1 + p
for a prompt of p), followed, when the prompt does not read its input (a `prefix_cache`
entry), by the key/values of its l fixed input-hook positions and BOS, computed once per prompt.
The body is the rest of the prompted row [prompt, BOS, inputs] with the valid positions first
(`gather.prompted_input`), so the u-th valid position of a row has index p + u, and generated
token j has p + n + j (n: the row's valid positions): the indices `mixed_decoder` gives a row
decoded alone, so every slot decodes as its request would alone.

Sampling is per slot: temperature (0: greedy), top_k (0: off), top_p (1: off), and a key
fold_in(fold_in(PRNGKey(seed), choice), j) for generated token j, so a seeded request's tokens
do not depend on the other slots. Every step also returns the top `TOP_LOGPROBS` log-
probabilities of each slot (of the model's distribution, before temperature and truncation).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from spot_jax.backbones.decoder import decoding
from spot_jax.backbones.decoder.network import DecoderLM
from spot_jax.serve.model.gather import prompted_input, row_kv
from spot_jax.serve.catalog.table import TableArrays

Array = jax.Array
PyTree = Any
TOP_LOGPROBS = 20  # the most top_logprobs a request may ask for (OpenAI's chat limit)


class SlotState(NamedTuple):
  """The slots' caches and positions (see the module docstring for shapes)."""
  cache: tuple
  k_index: Array
  k_valid: Array
  write: Array
  next: Array
  token: Array


class Sampling(NamedTuple):
  """Per-slot sampling settings, each [S] (or [1] for one prefill).

  Attributes:
    temperature: float32, 0 = greedy; top_k: int32, 0 = all; top_p: float32 in (0, 1].
    seed: uint32; choice: int32 (a request's n choices sample apart); count: int32, tokens
      generated so far (the fold_in position of the next one).
  """
  temperature: Array
  top_k: Array
  top_p: Array
  seed: Array
  choice: Array
  count: Array


class Head(NamedTuple):
  """The start of a slot's row for one prompt: per layer (key, value) [1, H, K, D], k_index and
  k_valid [1, H], and `skip` [1] int32: the prompted row's leading positions it already holds
  (l + 1 for a cached prompt, 0 otherwise)."""
  cache: tuple
  k_index: Array
  k_valid: Array
  skip: Array


class Chosen(NamedTuple):
  """Each slot's chosen token [S] int32, its log-probability [S], and the top log-probabilities:
  ids [S, TOP_LOGPROBS] int32 and values [S, TOP_LOGPROBS] float32."""
  token: Array
  logprob: Array
  top_ids: Array
  top_logprobs: Array


def sizes(table: TableArrays) -> tuple[int, int]:
  """(P, L): the table's deep prefix and input-prompt widths."""
  deep = table.deep.get("decoder")
  return (0 if deep is None else int(deep.kv.shape[3])), int(table.prompts.shape[2])


def head_width(table: TableArrays) -> int:
  """H = P + L + 1."""
  big_p, big_l = sizes(table)
  return big_p + big_l + 1


def home_device(params: Any) -> Optional[jax.Device]:
  """The device `params` live on (the first of them when they are replicated); None when they
  are split over devices."""
  leaves = [leaf for leaf in jax.tree_util.tree_leaves(params) if isinstance(leaf, jax.Array)]
  devices = sorted({d for leaf in leaves for d in leaf.devices()}, key=lambda d: d.id)
  if len(devices) > 1 and not all(leaf.is_fully_replicated for leaf in leaves):
    return None
  return devices[0] if devices else jax.devices()[0]


def one_device(params: Any) -> tuple[Any, Any]:
  """(`params`, their device) on their `home_device` (a mesh of 1): the slots' state then keeps
  one sharding from call to call, so nothing recompiles after warm-up; (`params`, None) when
  they are split over devices."""
  device = home_device(params)
  return (params, None) if device is None else (jax.device_put(params, device), device)


def second_device(params: Any) -> Optional[jax.Device]:
  """A device to prefill on beside the decode calls: the local device of the same kind next
  after `params`' home (on CPU, `JAX_NUM_CPU_DEVICES=2` makes two); None when there is none or
  they are split over devices."""
  home = home_device(params)
  others = sorted((d for d in jax.local_devices() if home is not None and d != home
                   and d.platform == home.platform), key=lambda d: (d.id < home.id, d.id))
  return others[0] if others else None


def empty_state(model: DecoderLM, slots: int, length: int, device: Any = None) -> SlotState:
  """S free slots of C = `length` key positions (on `device`, default the default device)."""
  cfg = model.config
  shape = (slots, cfg.num_kv_heads, length, cfg.head_dim)
  fresh = lambda shape, dtype: jax.device_put(np.zeros(shape, dtype), device)  # donated apart
  cache = tuple((fresh(shape, cfg.activation_dtype), fresh(shape, cfg.activation_dtype))
                for _ in range(cfg.num_layers))
  return SlotState(cache, fresh((slots, length), np.int32), fresh((slots, length), bool),
                   *(fresh((slots,), np.int32) for _ in range(3)))


def _deep(table: TableArrays, index: Array, batch: int) -> tuple[Optional[tuple], Array, Array]:
  """(per layer (key, value) [B, P, K, D] or None, visible [B, P], p [B])."""
  if "decoder" not in table.deep:
    return None, jnp.zeros((batch, 0), bool), jnp.zeros((batch,), jnp.int32)
  kv, visible = row_kv(table.deep["decoder"], index)
  pairs = tuple((kv[:, i, 0], kv[:, i, 1]) for i in range(kv.shape[1]))
  return pairs, visible, table.deep["decoder"].lengths[index]


def _prompted(model: DecoderLM, params: PyTree, table: TableArrays, index: Array, tokens: Array,
              valid: Array, placement: str) -> tuple[Array, Array]:
  """[BOS, tokens] with the row's prompt: (x [B, L + 1 + T, E], valid), valid positions first."""
  batch = tokens.shape[0]
  sequence = jnp.concatenate([jnp.full((batch, 1), model.config.bos_id, jnp.int32),
                              jnp.where(valid, tokens, 0).astype(jnp.int32)], axis=1)
  real = jnp.concatenate([jnp.ones((batch, 1), bool), valid], axis=1)
  embedded = model.apply({"params": params}, jnp.where(real, sequence, 0),
                         method=DecoderLM.embed)
  return prompted_input(table, index, embedded, jnp.where(real, sequence, 0), placement,
                        valid=real)


def _stack_heads(heads: tuple) -> Head:
  """B heads [1, ...] -> one head [B, ...]."""
  if len(heads) == 1:
    return heads[0]
  return jax.tree.map(lambda *rows: jnp.concatenate(rows, axis=0), *heads)


@functools.partial(jax.jit, static_argnames=("model", "placement", "cached"))
def compute_head(model: DecoderLM, params: PyTree, table: TableArrays, index: Array, *,
                 placement: str, cached: bool) -> Head:
  """Table row `index` [1]'s head: its deep prefixes, and with `cached` the key/values of its
  input-hook prompt and BOS (valid for a prompt that does not read its input: the positions
  before the input see no input, so any input gives them)."""
  big_p, big_l = sizes(table)
  big_h = big_p + big_l + 1
  past, visible, num = _deep(table, index, 1)
  tokens, valid = jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), bool)
  x, xvalid = _prompted(model, params, table, index, tokens, valid, placement)  # width L + 2
  width = x.shape[1]
  deep_index = jnp.arange(big_p, dtype=jnp.int32)[None] - big_p + num[:, None]
  body_index = num[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
  k_index = jnp.concatenate([deep_index, body_index], axis=1)
  k_valid = jnp.concatenate([visible, xvalid], axis=1)
  cache = decoding.empty_cache(model.config, past, 1, big_p + width)
  _, cache = model.apply({"params": params}, x, positions=body_index, q_index=body_index,
                         k_index=k_index, k_valid=k_valid, past=cache,
                         write_index=jnp.int32(big_p), last_only=True, method=DecoderLM.stack)
  skip = (table.lengths[index] + 1) if cached else jnp.zeros((1,), jnp.int32)
  keep = jnp.arange(big_h, dtype=jnp.int32)[None]
  k_valid = k_valid[:, :big_h] & ((keep < big_p) | (keep - big_p < skip[:, None]))
  front = lambda a: jnp.swapaxes(a[:, :, :big_h], 1, 2)  # noqa: E731  (as deep prefixes)
  return Head(tuple((front(k), front(v)) for k, v in cache), k_index[:, :big_h],
              k_valid, skip.astype(jnp.int32))


def _truncate(scaled: Array, sampling: Sampling) -> Array:
  """[S, V] scaled logits with the tokens outside each slot's top_k and top_p at -inf (a slot
  with top_k = 0 and top_p = 1 keeps every token, whatever the others ask)."""
  vocab = scaled.shape[-1]
  ordered = -jnp.sort(-scaled, axis=-1)  # descending
  kth = jnp.take_along_axis(ordered, jnp.clip(sampling.top_k - 1, 0, vocab - 1)[:, None], 1)
  kth = jnp.where(sampling.top_k[:, None] > 0, kth, -jnp.inf)
  ordered = jnp.where(ordered < kth, -jnp.inf, ordered)
  probs = jax.nn.softmax(ordered, axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs  # the mass above each token
  kept = jnp.sum(before < sampling.top_p[:, None], axis=-1)  # >= 1
  floor = jnp.take_along_axis(ordered, jnp.maximum(kept - 1, 0)[:, None], axis=1)
  floor = jnp.where(sampling.top_p[:, None] < 1, floor, -jnp.inf)
  return jnp.where(scaled < jnp.maximum(kth, floor), -jnp.inf, scaled)


def _choose(logits: Array, sampling: Sampling) -> Chosen:
  """[S, V] logits -> each slot's token under its own settings (see the module docstring)."""
  logits = logits.astype(jnp.float32)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  sampled = sampling.temperature > 0

  def sample(_):
    scaled = logits / jnp.maximum(sampling.temperature, 1e-6)[:, None]
    trims = jnp.any(sampled & ((sampling.top_k > 0) | (sampling.top_p < 1)))
    # Sorting a large vocabulary every step costs; only when some slot truncates.
    masked = jax.lax.cond(trims, lambda x: _truncate(x, sampling), lambda x: x, scaled)

    def one(seed, choice, count, row):
      key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), choice), count)
      return jax.random.categorical(key, row)

    drawn = jax.vmap(one)(sampling.seed, sampling.choice, sampling.count, masked)
    return jnp.where(sampled, drawn.astype(jnp.int32), greedy)

  token = jax.lax.cond(jnp.any(sampled), sample, lambda _: greedy, None)
  top_logprobs, top_ids = jax.lax.top_k(log_probs, min(TOP_LOGPROBS, logits.shape[-1]))
  return Chosen(token, jnp.take_along_axis(log_probs, token[:, None], axis=1)[:, 0],
                top_ids.astype(jnp.int32), top_logprobs)


@functools.partial(jax.jit, static_argnames=("model", "length", "placement", "cached"))
def prefill(model: DecoderLM, params: PyTree, table: TableArrays, index: Array, tokens: Array,
            valid: Array, head: Head | tuple, sampling: Sampling, *, length: int, placement: str,
            cached: bool) -> tuple[SlotState, Chosen]:
  """Runs B requests in one call and chooses each one's first token; `insert` then puts their
  rows into slots (on any device: the prefill needs no slot state, so it may run beside a
  decode call).

  Args:
    index: [B] the prompts' table rows; tokens, valid: [B, T] input ids (EOS included) and their
      validity (T a length bucket); head: B prompts' `Head`s [1, ...] (a tuple; one `Head` for
      B = 1); sampling: [B] settings; length: C, the slots' key positions.
    cached: every head holds its prompt and BOS: the layers then run on the T input positions
      only (the prompt's share of the prefill is saved), else on all L + 1 + T.

  Returns:
    (the B rows, a `SlotState` [B, ...], the first tokens' `Chosen` [B]).
  """
  head = _stack_heads((head,) if isinstance(head, Head) else tuple(head))
  batch = tokens.shape[0]
  big_h = head.k_index.shape[1]
  _, _, num = _deep(table, index, batch)
  x, xvalid = _prompted(model, params, table, index, tokens, valid, placement)
  width = x.shape[1]
  count = jnp.sum(xvalid, axis=1, dtype=jnp.int32) - head.skip  # the body's valid positions
  shift = (jnp.arange(width, dtype=jnp.int32)[None] + head.skip[:, None]) % width
  x = jnp.take_along_axis(x, shift[..., None], axis=1)
  if cached:  # what is left after the prompt and BOS: at most the T inputs
    width = tokens.shape[1]
    x = x[:, :width]
  u = jnp.arange(width, dtype=jnp.int32)[None]
  xvalid = u < count[:, None]
  q_index = num[:, None] + head.skip[:, None] + u
  rest = length - big_h - width
  gen_index = (num + head.skip + count)[:, None] + jnp.arange(rest, dtype=jnp.int32)[None]
  k_index = jnp.concatenate([head.k_index, q_index, gen_index], axis=1)
  k_valid = jnp.concatenate([head.k_valid, xvalid, jnp.zeros((batch, rest), bool)], axis=1)
  past = decoding.empty_cache(model.config, head.cache, batch, length)
  logits, cache = model.apply({"params": params}, x, positions=q_index, q_index=q_index,
                              k_index=k_index, k_valid=k_valid, past=past,
                              write_index=jnp.int32(big_h), keep=(count - 1)[:, None],
                              method=DecoderLM.stack)
  chosen = _choose(logits[:, 0], sampling)
  rows = SlotState(cache, k_index, k_valid, jnp.full((batch,), big_h + width, jnp.int32),
                   num + head.skip + count, chosen.token)
  return rows, chosen


@functools.partial(jax.jit, donate_argnums=(0,))
def insert(state: SlotState, slot: Array, rows: SlotState) -> SlotState:
  """`state` with row b of `rows` in slot `slot[b]` ([B] int32); a row whose slot is S or more
  is padding and is written nowhere."""
  put = lambda whole, row: whole.at[slot].set(row.astype(whole.dtype), mode="drop")
  return jax.tree.map(put, state, rows)


@functools.partial(jax.jit, static_argnames=("model", "steps"), donate_argnums=(2,))
def decode_steps(model: DecoderLM, params: PyTree, state: SlotState, sampling: Sampling, *,
                 steps: int) -> tuple[SlotState, Chosen]:
  """`steps` decode steps of every slot in one call (a free slot runs too; its result is
  ignored): step j feeds every slot's `token` and chooses its next one, sampling at count + j,
  so outputs do not depend on how steps are grouped into calls. A slot whose sequence ends
  inside the call decodes on, into its own row only (its write position stops at the row's
  last key position); its extra tokens are the caller's to drop. Returns the state and each
  step's `Chosen`, stacked [steps, S, ...]."""

  def one(carry, j):
    state, count = carry
    state, chosen = _decode(model, params, state, sampling._replace(count=count + j))
    return (state, count), chosen

  (state, _), chosen = jax.lax.scan(one, (state, sampling.count),
                                    jnp.arange(steps, dtype=jnp.int32))
  return state, chosen


def _decode(model: DecoderLM, params: PyTree, state: SlotState, sampling: Sampling
            ) -> tuple[SlotState, Chosen]:
  """One decode step of every slot (see `decode_steps`): one batched pass, each slot's key and
  value written at its own position."""
  length = state.k_index.shape[1]
  write = jnp.minimum(state.write, length - 1)
  rows = jnp.arange(write.shape[0])
  embedded = model.apply({"params": params}, state.token[:, None], method=DecoderLM.embed)
  where = state.next[:, None]
  k_index = state.k_index.at[rows, write].set(state.next)
  k_valid = state.k_valid.at[rows, write].set(True)
  logits, cache = model.apply({"params": params}, embedded, positions=where, q_index=where,
                              k_index=k_index, k_valid=k_valid, past=state.cache,
                              write_index=write, method=DecoderLM.stack)
  chosen = _choose(logits[:, -1], sampling)
  return SlotState(cache, k_index, k_valid, state.write + 1, state.next + 1,
                   chosen.token), chosen
