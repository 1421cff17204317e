"""T5 building blocks in Flax linen, with t5x's parameter names and logical axes.

Every parameter is created float32 with logical axis names (`nn.with_logical_partitioning`);
a frozen tree may hold it in bfloat16 (`T5Config.param_dtype`), so every use casts it;
activations are cast to `dtype`. Parameter shapes match t5x checkpoints exactly: attention
kernels are stored 2-D ([embed, joined_kv] and [joined_kv, embed]) and reshaped at use.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax.backbones.t5 import prefixes

Array = jax.Array
Initializer = Callable[..., Array]

NEG_INF = -1e10
# The variable collection of keys/values projected once per decoded sequence (cross-attention).
FIXED_KV = "fixed_kv"


def _param(module: nn.Module, name: str, init: Initializer, shape: Sequence[int],
           axes: tuple[Optional[str], ...]) -> Array:
  """A float32 parameter carrying logical axis names."""
  return module.param(name, nn.with_logical_partitioning(init, axes), tuple(shape), jnp.float32)


def constrain(x: Array, axes: tuple[Optional[str], ...]) -> Array:
  """Logical sharding constraint on a large activation (a no-op outside a mesh/rules context)."""
  return nn.with_logical_constraint(x, axes)


class RMSNorm(nn.Module):
  """T5's layer norm: no mean subtraction, no bias, computed in float32.

  Attributes:
    epsilon: added to the mean square.
    dtype: output dtype.
  """
  epsilon: float = 1e-6
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """[..., E] -> [..., E]."""
    x = x.astype(jnp.float32)
    scale = _param(self, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",))
    var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    y = x * jax.lax.rsqrt(var + self.epsilon)
    return (y * scale.astype(jnp.float32)).astype(self.dtype)


class Embed(nn.Module):
  """Token embedding table [V, E], also usable as a tied output projection.

  Attributes:
    num_embeddings: V.
    features: E.
    dtype: activation dtype.
  """
  num_embeddings: int
  features: int
  dtype: jnp.dtype = jnp.float32

  def setup(self):
    self.embedding = _param(self, "embedding", nn.initializers.normal(stddev=1.0),
                            (self.num_embeddings, self.features), ("vocab", "embed"))

  def __call__(self, tokens: Array) -> Array:
    """[B, T] int -> [B, T, E]."""
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"token ids must be integers, got dtype {tokens.dtype}")
    out = jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)
    return constrain(out, ("batch", "length", "embed"))

  def attend(self, query: Array) -> Array:
    """[B, T, E] -> [B, T, V] logits against the table."""
    return jnp.einsum("bte,ve->btv", query, jnp.asarray(self.embedding, self.dtype))

  def table(self) -> Array:
    """The raw [V, E] float32 table (for prompt initialisers)."""
    return self.embedding


class Dense(nn.Module):
  """A bias-free projection whose kernel is stored 2-D, as in t5x checkpoints.

  Attributes:
    features: output shape after the last input axis (e.g. (H, D) for attention).
    kernel_axes: logical names of the stored 2-D kernel [in, prod(features)].
    kernel_init: initialiser of the stored kernel.
    dtype: activation dtype.
  """
  features: tuple[int, ...]
  kernel_axes: tuple[str, str]
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
  dtype: jnp.dtype = jnp.float32
  in_axes: int = 1

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """[..., *in] -> [..., *features] where `in` spans the last `in_axes` axes."""
    in_shape = x.shape[-self.in_axes:]
    n_in, n_out = int(np.prod(in_shape)), int(np.prod(self.features))
    kernel = _param(self, "kernel", self.kernel_init, (n_in, n_out), self.kernel_axes)
    kernel = jnp.asarray(kernel, self.dtype)
    x = jnp.asarray(x, self.dtype).reshape(x.shape[:-self.in_axes] + (n_in,))
    y = jnp.dot(x, kernel)
    return y.reshape(x.shape[:-1] + tuple(self.features))


_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": functools.partial(nn.gelu, approximate=True),
    "gelu_exact": functools.partial(nn.gelu, approximate=False),
    "relu": nn.relu,
    "silu": nn.silu,
    "linear": lambda x: x,
}


def Dropout(rate: float, broadcast_dims: Sequence[int] = (-2,)) -> nn.Dropout:  # pylint: disable=invalid-name
  """t5x's dropout: one mask per example (and head) shared along the second-to-last axis.

  t5x/flaxformer draw every dropout mask with the length (query) axis of size 1 and broadcast it:
  the residual and MLP-hidden masks are [B, 1, E] / [B, 1, F], the attention-weight mask
  [B, H, 1, K]. Keeping that layout keeps t5x's training semantics and draws T times fewer
  random bits than an independent mask per position (the bulk of the dropout cost on CPU).
  The attention layer applies its [B, H, 1, K] mask to the values instead (`broadcast_dims`
  (-1,) on [B, H, K, D]: the same random bits, in the same order; see there).
  """
  return nn.Dropout(rate=rate, broadcast_dims=tuple(broadcast_dims))


class MlpBlock(nn.Module):
  """Feed-forward block: product of activated input projections, then `wo`.

  Attributes:
    mlp_dim: hidden width.
    activations: one name per input projection; one projection is named `wi`, several
      `wi_0`, `wi_1`, ... (t5x's convention).
    dropout_rate: dropout on the hidden activations (mask shared along the length axis).
    dtype: activation dtype.
  """
  mlp_dim: int
  activations: tuple[str, ...] = ("relu",)
  dropout_rate: float = 0.1
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    """[B, T, E] -> [B, T, E]."""
    init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
    hidden = None
    for i, act in enumerate(self.activations):
      name = "wi" if len(self.activations) == 1 else f"wi_{i}"
      h = _ACTIVATIONS[act](Dense((self.mlp_dim,), ("embed", "mlp"), init, self.dtype,
                                  name=name)(x))
      hidden = h if hidden is None else hidden * h
    hidden = constrain(hidden, ("batch", "length", "mlp"))
    hidden = Dropout(self.dropout_rate)(hidden, deterministic=deterministic)
    out = Dense((x.shape[-1],), ("mlp", "embed"), init, self.dtype, name="wo")(hidden)
    return constrain(out, ("batch", "length", "embed"))


def relative_position_bucket(relative_position: np.ndarray, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> np.ndarray:
  """T5's bucketing of (memory - query) positions; static, computed with numpy."""
  ret = np.zeros_like(relative_position, dtype=np.int32)
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int32) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  safe_n = np.maximum(n, 1).astype(np.float32)
  large = max_exact + (np.log(safe_n / max_exact + np.finfo(np.float32).eps)
                       / np.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).astype(np.int32)
  large = np.minimum(large, num_buckets - 1)
  return ret + np.where(is_small, n, large).astype(np.int32)


class RelativePositionBiases(nn.Module):
  """Learned per-head biases of bucketed relative positions, shared by a stack's layers.

  Attributes:
    num_buckets: buckets.
    max_distance: largest distinguished distance.
    num_heads: H.
    dtype: output dtype.
  """
  num_buckets: int
  max_distance: int
  num_heads: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, qlen: int, klen: int, bidirectional: bool, query_offset: int = 0) -> Array:
    """-> [1, H, qlen, klen] additive attention bias.

    Query i is at position i + query_offset, key j at j (an offset P places P prefix keys
    before the queries; see `prefixes`).
    """
    rel = np.arange(klen)[None, :] - (np.arange(qlen)[:, None] + query_offset)
    buckets = relative_position_bucket(rel, bidirectional, self.num_buckets, self.max_distance)
    table = _param(self, "rel_embedding",
                   nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                   (self.num_heads, self.num_buckets), ("heads", "relpos_buckets"))
    bias = jnp.take(table, jnp.asarray(buckets), axis=1)  # [H, q, k]
    return bias[None].astype(self.dtype)


def _attention_weights(query: Array, key: Array, addend: Optional[Array]) -> Array:
  logits = jnp.einsum("bhqd,bhkd->bhqk", query, key)
  if addend is not None:
    logits = logits + addend
  return jax.nn.softmax(logits)


@jax.custom_vjp
def attend(query: Array, key: Array, value: Array, addend: Optional[Array]) -> Array:
  """softmax(query . key + addend) . value on heads-major [B, H, T, D] operands -> [B, H, Q, D].

  The softmax is taken in the dtype of query/key (the logits dtype); the weights are cast to the
  dtype of value for the second product. `addend` ([B or 1, H or 1, Q, K], or None) is the
  position bias plus mask bias. The backward pass is written out: the softmax gradient
  w * (dw - sum(dw * w)) from the saved weights, the formula JAX derives from jax.nn.softmax but
  in fewer passes over the [B, H, Q, K] arrays (about 1.5x faster on CPU at T5-small shapes).
  """
  return _attend_fwd(query, key, value, addend)[0]


def _attend_fwd(query, key, value, addend):
  weights = _attention_weights(query, key, addend)
  out = jnp.einsum("bhqk,bhkd->bhqd", weights.astype(value.dtype), value)
  return out, (weights, query, key, value, addend)


def _attend_bwd(residuals, d_out):
  weights, query, key, value, addend = residuals
  d_value = jnp.einsum("bhqk,bhqd->bhkd", weights.astype(value.dtype), d_out)
  d_weights = jnp.einsum("bhqd,bhkd->bhqk", d_out, value).astype(weights.dtype)
  d_logits = weights * (d_weights - jnp.sum(d_weights * weights, axis=-1, keepdims=True))
  d_query = jnp.einsum("bhqk,bhkd->bhqd", d_logits, key).astype(query.dtype)
  d_key = jnp.einsum("bhqk,bhqd->bhkd", d_logits, query).astype(key.dtype)
  d_addend = None
  if addend is not None:
    summed = tuple(i for i, n in enumerate(addend.shape) if n == 1 and d_logits.shape[i] != 1)
    d_addend = jnp.sum(d_logits, axis=summed, keepdims=True).astype(addend.dtype)
  return d_query, d_key, d_value, d_addend


attend.defvjp(_attend_fwd, _attend_bwd)


class MultiHeadDotProductAttention(nn.Module):
  """T5 attention: no 1/sqrt(D) at run time (it is folded into the query initialiser).

  With `decode=True` keys and values are appended to a cache ([B, L, H, D] in the "cache"
  collection) one position per call, as in t5x's incremental decoding. With `fixed_kv=True`
  (the decoder's cross-attention while decoding: `inputs_kv` is the same encoder output at every
  step) the projected keys and values are kept in the FIXED_KV collection: a call with that
  collection mutable stores them (heads-major [B, H, K, D]), later calls read them instead of
  projecting the encoder output again at every generated token.

  Attributes:
    num_heads: H.
    head_dim: D.
    dropout_rate: dropout on the attention weights (mask [B, H, 1, K], shared by the queries;
      applied to the values, which is the same product).
    float32_logits: compute logits and softmax in float32.
    dtype: activation dtype.
  """
  num_heads: int
  head_dim: int
  dropout_rate: float = 0.0
  float32_logits: bool = True
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array, mask: Optional[Array],
               bias: Optional[Array], *, deterministic: bool, decode: bool = False,
               fixed_kv: bool = False, prefix: Optional[prefixes.LayerPrefix] = None) -> Array:
    """inputs [B, Q, E], [B, K, E]; mask [B, 1, Q, K] bool; bias [1, H, Q, K] -> [B, Q, E].

    `prefix` (a deep prompt, see `prefixes`) adds P key/value positions in front of the K
    input ones; without it the computation is exactly the plain attention.
    """
    heads, depth = self.num_heads, self.head_dim
    fan_in = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
    query_init = lambda key, shape, dtype: fan_in(key, shape, dtype) / np.sqrt(depth)
    proj = functools.partial(Dense, (heads, depth), ("embed", "joined_kv"), dtype=self.dtype)
    logits_dtype = jnp.float32 if self.float32_logits else self.dtype
    # Heads-major [B, H, T, D] operands: both products are plain batched matmuls.
    to_heads = lambda t: jnp.swapaxes(t, 1, 2)
    query = proj(kernel_init=query_init, name="query")(inputs_q)
    query = constrain(query, ("batch", "length", "heads", "kv"))
    key_proj = proj(kernel_init=fan_in, name="key")
    value_proj = proj(kernel_init=fan_in, name="value")
    if fixed_kv and self.has_variable(FIXED_KV, "key"):  # projected once per sequence
      key, value = self.get_variable(FIXED_KV, "key"), self.get_variable(FIXED_KV, "value")
    else:
      key = constrain(key_proj(inputs_kv), ("batch", "length", "heads", "kv"))
      value = constrain(value_proj(inputs_kv), ("batch", "length", "heads", "kv"))
      if decode and not fixed_kv:
        key, value, mask, bias, prefix = self._cached(key, value, mask, bias, prefix,
                                                      query.shape[1])
      key, value = to_heads(key).astype(logits_dtype), to_heads(value)
      if fixed_kv and self.is_mutable_collection(FIXED_KV):
        self.put_variable(FIXED_KV, "key", key)
        self.put_variable(FIXED_KV, "value", value)

    # The mask enters as an additive -1e10 bias (t5x's mask-to-bias): one [B, H, Q, K] addend
    # that does not depend on the layer, so XLA computes it once per stack.
    addend = None if bias is None else bias.astype(logits_dtype)
    if mask is not None:
      addend = jnp.where(mask, jnp.zeros((), logits_dtype) if addend is None else addend,
                         jnp.asarray(NEG_INF, logits_dtype))
    if prefix is not None:
      key, value, addend = _with_prefix(prefix, key, value, addend, key_proj, value_proj,
                                        query.shape[1], logits_dtype)
    # t5x drops attention weights with a mask [B, H, 1, K] shared by all queries, so
    # (weights * mask) . v == weights . (mask^T * v): the same mask (the same random bits, in
    # the same order) is applied to the rows of v, a [B, H, K, D] product instead of [B, H, Q, K].
    value = Dropout(self.dropout_rate, broadcast_dims=(-1,))(value, deterministic=deterministic)
    out = jnp.swapaxes(attend(to_heads(query).astype(logits_dtype), key, value, addend), 1, 2)
    out = Dense((inputs_q.shape[-1],), ("joined_kv", "embed"), fan_in, self.dtype,
                in_axes=2, name="out")(out)
    return constrain(out, ("batch", "length", "embed"))

  def _cached(self, key: Array, value: Array, mask: Optional[Array], bias: Optional[Array],
              prefix: Optional[prefixes.LayerPrefix], qlen: int):
    """Incremental decoding: appends this position's key/value [B, 1, H, D] to the cache and
    returns the cached ones [B, L, H, D] with the mask, bias and prefix bias of this position."""
    initialized = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
    cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return key, value, mask, bias, prefix
    length = cached_key.value.shape[1]
    if qlen != 1:
      raise ValueError(f"incremental decoding takes one position per call, got {qlen}")
    idx = cache_index.value
    key = jax.lax.dynamic_update_slice(cached_key.value, key, (0, idx, 0, 0))
    value = jax.lax.dynamic_update_slice(cached_value.value, value, (0, idx, 0, 0))
    cached_key.value, cached_value.value = key, value
    cache_index.value = idx + 1
    visible = (jnp.arange(length) <= idx)[None, None, None, :]
    mask = visible if mask is None else jnp.logical_and(mask, visible)
    if bias is not None:
      bias = jax.lax.dynamic_slice_in_dim(bias, idx, 1, axis=2)
    if prefix is not None and prefix.bias is not None:
      prefix = prefix._replace(bias=jax.lax.dynamic_slice_in_dim(prefix.bias, idx, 1, axis=2))
    return key, value, mask, bias, prefix


def _with_prefix(prefix: prefixes.LayerPrefix, key: Array, value: Array, addend: Optional[Array],
                 key_proj: nn.Module, value_proj: nn.Module, qlen: int, logits_dtype: jnp.dtype
                 ) -> tuple[Array, Array, Array]:
  """Puts a deep prompt's P positions in front of the heads-major keys/values [B, H, K, D].

  Returns keys and values [B, H, P + K, D] and the addend [B', H', Q', P + K]: the prefix's own
  position bias (zero without one), NEG_INF where the prefix is not `visible`.
  """
  if prefix.tokens is not None:  # deep prompt tokens: this layer's frozen projections
    p_key, p_value = key_proj(prefix.tokens), value_proj(prefix.tokens)
  else:
    p_key, p_value = prefix.key, prefix.value  # [B or 1, P, H, D]
  batch, klen = key.shape[0], key.shape[2]
  plen = p_key.shape[1]

  def fit(p: Array, like: Array) -> Array:  # [b, P, H, D] -> [B, H, P, D]
    p = jnp.swapaxes(p.astype(like.dtype), 1, 2)
    return jnp.broadcast_to(p, (batch,) + p.shape[1:])

  key = jnp.concatenate([fit(p_key, key), key], axis=2)
  value = jnp.concatenate([fit(p_value, value), value], axis=2)
  p_add = (jnp.zeros((1, 1, qlen, plen), logits_dtype) if prefix.bias is None
           else prefix.bias.astype(logits_dtype))
  if prefix.visible is not None:
    p_add = jnp.where(prefix.visible[:, None, None, :], p_add, jnp.asarray(NEG_INF, logits_dtype))
  if addend is None:
    addend = jnp.zeros((1, 1, qlen, klen), logits_dtype)
  lead = tuple(max(a, b) for a, b in zip(p_add.shape[:3], addend.shape[:3]))
  addend = jnp.concatenate([jnp.broadcast_to(p_add, lead + p_add.shape[3:]),
                            jnp.broadcast_to(addend, lead + addend.shape[3:])], axis=-1)
  return key, value, addend
