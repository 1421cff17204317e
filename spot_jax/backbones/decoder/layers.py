"""Building blocks of the decoder-only network, in Flax linen, with logical axes on every weight.

  RMSNorm         x / rms(x) * (offset + scale), computed in float32
  rope_frequencies, apply_rope   rotary position embedding (default, linear, llama3)
  attention_mask  causal by index, valid keys, and the sliding window
  Attention       grouped-query attention, optional q/k/v biases and q/k norms, a key/value
                  past (deep prefixes, or the decoding cache) and soft-capping
  GatedMLP        act(x W_gate) * (x W_up) W_down

Numerics follow transformers' float32 path exactly and its bfloat16 path closely: norms and
attention softmax in float32, attention logits accumulated in float32, RoPE tables in float32
cast to the activation dtype.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax.backbones import quantization
from spot_jax.backbones.decoder.config import DecoderConfig, RopeScaling

Array = jax.Array
KV = tuple[Array, Array]  # (key, value): deep prefixes [B, P, K, D]; a cache [B, K, S, D]


def _param(module: nn.Module, name: str, init: Any, shape: Sequence[int],
           axes: tuple[str, ...]) -> Array:
  """A parameter with logical axis names, created float32 (a frozen tree may hold it in
  bfloat16: every use casts it; a quantized kernel is returned as stored)."""
  stored = quantization.param(module, name)
  if stored is not None:
    return stored
  return module.param(name, nn.with_logical_partitioning(init, axes), tuple(shape), jnp.float32)


class RMSNorm(nn.Module):
  """Root-mean-square norm over the last axis, with a learned scale.

  Parameters: scale [dim] float32 (zeros when offset > 0: Gemma stores it zero-centred).

  Attributes:
    epsilon: added to the mean square.
    offset: 0.0 (Llama: y = x_hat * scale) or 1.0 (Gemma: y = x_hat * (1 + scale)).
    axis_name: logical axis of the scale ("embed", or "kv" for query/key norms).
  """
  epsilon: float = 1e-6
  offset: float = 0.0
  axis_name: str = "embed"

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x [..., dim] -> [..., dim] in x's dtype."""
    init = nn.initializers.zeros if self.offset else nn.initializers.ones
    scale = _param(self, "scale", init, (x.shape[-1],), (self.axis_name,))
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
    if self.offset:
      # Gemma: (x_hat * (1 + w)) in float32, then cast (transformers PR 29402).
      return (normed * (self.offset + scale.astype(jnp.float32))).astype(x.dtype)
    # Llama, Qwen: x_hat cast to the activation dtype first, then scaled there.
    return scale.astype(x.dtype) * normed.astype(x.dtype)


# ----------------------------------------------------------------------------------- RoPE


@functools.lru_cache(maxsize=None)
def rope_frequencies(head_dim: int, theta: float, scaling: Optional[RopeScaling] = None
                     ) -> np.ndarray:
  """Inverse frequencies [head_dim // 2] float32, as transformers' rope initialisers give them.

  The llama3 rule runs in float32 as transformers' does, so the band each frequency falls in
  (kept, divided by factor, or interpolated) is decided on the same numbers.
  """
  exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
  inv = (1.0 / theta ** exponents).astype(np.float32)
  if scaling is None:
    return inv
  factor = np.float32(scaling.factor)
  if scaling.rope_type == "linear":
    return (inv / factor).astype(np.float32)
  old = np.float32(scaling.original_max_position_embeddings)
  low, high = np.float32(scaling.low_freq_factor), np.float32(scaling.high_freq_factor)
  wavelen = np.float32(2 * math.pi) / inv
  scaled = np.where(wavelen > old / low, inv / factor, inv).astype(np.float32)
  smooth = (old / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelen < old / high) & ~(wavelen > old / low)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def apply_rope(x: Array, positions: Array, inv_freq: np.ndarray) -> Array:
  """Rotates x [B, T, H, D] by positions [B, T] (transformers' rotate-half layout)."""
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, D/2]
  angles = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


def layer_frequencies(config: DecoderConfig, layer_type: str) -> np.ndarray:
  """The inverse frequencies of a "full" or "sliding" layer of `config`."""
  if layer_type == "sliding" and config.rope_local_theta is not None:
    return rope_frequencies(config.head_dim, config.rope_local_theta, None)
  return rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)


def attention_mask(q_index: Array, k_index: Array, k_valid: Array,
                   window: Optional[int] = None) -> Array:
  """Which keys each query sees: [B, 1, 1, T, S] bool (broadcast over K and the group axis).

  Indices count the concatenated sequence (deep prefixes first): key j is seen by query i when
  j <= i, the key is valid, and on sliding layers i - j < window, transformers' rule
  (`kv_idx > q_idx - sliding_window`).

  Args:
    q_index: [B, T] int, the queries' indices.
    k_index: [B, S] int, the keys' indices.
    k_valid: [B, S] bool.
    window: the sliding window W, or None for a full layer.
  """
  qi, ki = q_index[:, :, None], k_index[:, None, :]
  mask = (ki <= qi) & k_valid[:, None, :]
  if window is not None:
    mask &= ki > qi - window
  return mask[:, None, None]


# ----------------------------------------------------------------------------------- layers


class HeadsIn(nn.Module):
  """[B, T, E] -> [B, T, heads, D]: a query, key or value projection.

  Parameters: kernel [E, heads, D] ("embed", heads_axis, "kv"); bias [heads, D] if use_bias.

  Attributes:
    heads: number of heads.
    head_dim: D.
    heads_axis: "heads" for queries, "kv_heads" for keys and values.
    use_bias: add a bias (Qwen 2).
    dtype: activation dtype.
  """
  heads: int
  head_dim: int
  heads_axis: str
  use_bias: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=0,
                                            out_axis=(1, 2))
    kernel = _param(self, "kernel", init, (x.shape[-1], self.heads, self.head_dim),
                    ("embed", self.heads_axis, "kv"))
    y = quantization.einsum("bte,enh->btnh", x, kernel, self.dtype)
    if self.use_bias:
      bias = _param(self, "bias", nn.initializers.zeros, (self.heads, self.head_dim),
                    (self.heads_axis, "kv"))
      y = y + bias.astype(self.dtype)
    return y


class HeadsOut(nn.Module):
  """[B, T, N, D] -> [B, T, E]: the attention output projection.

  Parameters: kernel [N, D, E] ("heads", "kv", "embed").

  Attributes:
    features: E.
    dtype: activation dtype.
  """
  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=(0, 1),
                                            out_axis=2)
    kernel = _param(self, "kernel", init, (x.shape[-2], x.shape[-1], self.features),
                    ("heads", "kv", "embed"))
    return quantization.einsum("btnh,nhe->bte", x, kernel, self.dtype)


class Dense(nn.Module):
  """[..., in] -> [..., features] without bias.

  Parameters: kernel [in, features] with logical axes `axes`.

  Attributes:
    features: output width.
    axes: the kernel's logical axes (input, output).
    dtype: activation dtype.
  """
  features: int
  axes: tuple[str, str]
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
    kernel = _param(self, "kernel", init, (x.shape[-1], self.features), self.axes)
    return quantization.einsum("...i,io->...o", x, kernel, self.dtype)


def softcap(x: Array, cap: Optional[float]) -> Array:
  """tanh(x / cap) * cap (Gemma 2's soft-capping), or x when cap is None."""
  return x if cap is None else jnp.tanh(x / cap) * cap


class Attention(nn.Module):
  """Grouped-query self-attention over the new tokens and an optional key/value past.

  Parameters: query/kernel [E, N, D], key/kernel and value/kernel [E, K, D], out/kernel
  [N, D, E]; {query,key,value}/bias with attention_bias; query_norm/scale and key_norm/scale
  [D] with qk_norm.

  Attributes:
    config: the model's DecoderConfig.
    layer_type: "full" or "sliding" (selects the RoPE base and scaling).
  """
  config: DecoderConfig
  layer_type: str = "full"

  @nn.compact
  def __call__(self, x: Array, positions: Array, mask: Optional[Array],
               past: Optional[KV] = None, write_index: Optional[Array] = None,
               kv_only: bool = False) -> tuple[Array, Optional[KV]]:
    """Attends the new tokens' queries to the past's keys and their own.

    Args:
      x: [B, T, E] normed inputs.
      positions: [B, T] RoPE positions.
      mask: [B, 1, 1, T, S] bool from `attention_mask`, S the key axis (see `past`).
      past: None (S = T); deep prefixes (key, value) [B or 1, P, K, D], used raw, before the
        new keys (S = P + T); or, with `write_index`, a cache [B, K, S, D] (heads-major, so
        the attention's dots read it in place) the new keys and values are written into at
        `write_index` before attending over all S of it.
      write_index: the cache index of the first new token (a scalar), or [B] one per row (T =
        1: each row's token goes to its own index, as slots decoding apart need), or None.
      kv_only: return the inputs' (key, value) [B, T, K, D] at `positions` (key norm and RoPE
        applied, as the cache holds them) and attend to nothing (`mask` unused).

    Returns:
      (y [B, T, E], the cache written to when `write_index` is given, else None); with
      `kv_only`, (key, value).
    """
    cfg, dtype = self.config, self.config.activation_dtype
    heads_in = functools.partial(HeadsIn, head_dim=cfg.head_dim, use_bias=cfg.attention_bias,
                                 dtype=dtype)
    norm = functools.partial(RMSNorm, cfg.norm_epsilon, cfg.norm_offset, "kv")
    inv_freq = layer_frequencies(cfg, self.layer_type)
    k = heads_in(cfg.num_kv_heads, heads_axis="kv_heads", name="key")(x)
    v = heads_in(cfg.num_kv_heads, heads_axis="kv_heads", name="value")(x)
    k = apply_rope(norm(name="key_norm")(k) if cfg.qk_norm else k, positions, inv_freq)
    if kv_only:
      return k, v
    q = heads_in(cfg.num_heads, heads_axis="heads", name="query")(x)
    q = apply_rope(norm(name="query_norm")(q) if cfg.qk_norm else q, positions, inv_freq)
    cache = None
    if past is not None and write_index is not None and jnp.ndim(write_index) == 1:
      rows = jnp.arange(x.shape[0])
      k = past[0].at[rows, :, write_index].set(k[:, 0].astype(past[0].dtype), mode="drop")
      v = past[1].at[rows, :, write_index].set(v[:, 0].astype(past[1].dtype), mode="drop")
      cache = (k, v)
    elif past is not None and write_index is not None:
      at = (0, 0, write_index, 0)
      heads = lambda a, c: jnp.swapaxes(a, 1, 2).astype(c.dtype)  # noqa: E731
      k = jax.lax.dynamic_update_slice(past[0], heads(k, past[0]), at)
      v = jax.lax.dynamic_update_slice(past[1], heads(v, past[1]), at)
      cache = (k, v)
    elif past is not None:
      batch = x.shape[0]
      grow = lambda p: jnp.broadcast_to(p, (batch,) + p.shape[1:]).astype(dtype)  # noqa: E731
      k = jnp.concatenate([grow(past[0]), k], axis=1)
      v = jnp.concatenate([grow(past[1]), v], axis=1)
    batch, length = q.shape[:2]
    groups = cfg.num_heads // cfg.num_kv_heads
    # Query head n reads key/value head n // groups (transformers' repeat_kv).
    q = q.reshape(batch, length, cfg.num_kv_heads, groups, cfg.head_dim)
    # A cache is heads-major and one new token (decoding) drops its length-1 axis: the dots'
    # batch axes (b, k) then lead both operands, and XLA copies no cache into another layout.
    kv = "bksd" if cache is not None else "bskd"
    one = length == 1
    logits = jnp.einsum(f"bkgd,{kv}->bkgs" if one else f"btkgd,{kv}->bkgts",
                        q[:, 0] if one else q, k.astype(dtype),
                        preferred_element_type=jnp.float32) * cfg.attention_scale
    logits = softcap(logits, cfg.attn_logit_softcap)
    logits = jnp.where(mask[..., 0, :] if one else mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(dtype)
    out = jnp.einsum(f"bkgs,{kv}->bkgd" if one else f"bkgts,{kv}->btkgd", probs,
                     v.astype(dtype))
    out = out.reshape(batch, length, cfg.num_heads, cfg.head_dim)
    return HeadsOut(x.shape[-1], dtype=dtype, name="out")(out), cache


_ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
                "gelu": functools.partial(jax.nn.gelu, approximate=False)}


class GatedMLP(nn.Module):
  """act(x W_0) * (x W_1) W_o: SwiGLU (Llama) or GeGLU (Gemma).

  Parameters: wi_0/kernel (gate) and wi_1/kernel (up) [E, F] ("embed", "mlp"); wo/kernel [F, E]
  ("mlp", "embed").

  Attributes:
    config: the model's DecoderConfig.
  """
  config: DecoderConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x [B, T, E] -> [B, T, E]."""
    cfg, dtype = self.config, self.config.activation_dtype
    gate = Dense(cfg.mlp_dim, ("embed", "mlp"), dtype, name="wi_0")(x)
    up = Dense(cfg.mlp_dim, ("embed", "mlp"), dtype, name="wi_1")(x)
    hidden = _ACTIVATIONS[cfg.mlp_activation](gate) * up
    return Dense(x.shape[-1], ("mlp", "embed"), dtype, name="wo")(hidden)
