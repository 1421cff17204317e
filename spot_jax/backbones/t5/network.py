"""The T5 encoder-decoder, with t5x's parameter tree and call convention.

Parameter tree (identical to t5x checkpoints under `target`):
  token_embedder/embedding                                    [vocab, embed]
  encoder/relpos_bias/rel_embedding                           [heads, relpos_buckets]
  encoder/layers_{i}/{pre_attention_layer_norm,pre_mlp_layer_norm}/scale
  encoder/layers_{i}/attention/{query,key,value,out}/kernel
  encoder/layers_{i}/mlp/{wi|wi_0,wi_1,wo}/kernel
  encoder/encoder_norm/scale
  decoder/... self_attention, encoder_decoder_attention, pre_cross_attention_layer_norm, ...
  decoder/decoder_norm/scale, decoder/logits_dense/kernel (untied models only)
  prompt/...                                                  (only when a prompt module is set)

The input hook: a prompt module given as `Transformer(config, prompt=...)` is called on the
embedded encoder input as `prompt(embedded [B,T,E], tokens [B,T], embedding=[V,E] table,
deterministic=...)` and returns `(embedded' [B,T',E], valid' [B,T'] bool)`. The encoder's
self-attention and the decoder's cross-attention masks are built from `valid'`, so prompt
positions are visible to every real token and padding is never visible.

The deep hook: a prompt module with a `layer_prompts` method (prefix tuning, deep prompt
tokens) leaves the input alone; the model calls `prompt.layer_prompts(config,
embedding=[V,E] table, deterministic=...)` once per call and hands the returned
`prefixes.DeepPrompt` to the attention layers (see `prefixes`). `encode` and `decode` also take
an explicit `prefixes=` (per-row prompts when serving mixed batches); without a deep prompt
the network computes exactly what it computes without the hook.

A prompt module whose `task_indexed` attribute is True (multi-task methods) also gets
`task_index=` [B] int32 (each row's task) when the caller gives one; other prompt modules
never see it.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax.backbones import memory
from spot_jax.backbones.t5 import layers, prefixes as prefixes_lib
from spot_jax.backbones.t5.config import T5Config

Array = jax.Array


def _dropout(cfg: T5Config) -> nn.Dropout:
  return layers.Dropout(cfg.dropout_rate)


def is_deep_prompt(module: Optional[nn.Module]) -> bool:
  """Whether a prompt module uses the deep hook (`layer_prompts`) rather than the input hook."""
  return module is not None and callable(getattr(module, "layer_prompts", None))


class EncoderLayer(nn.Module):
  """Pre-norm self-attention + MLP block.

  Attributes:
    config: the model configuration.
  """
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, mask: Array, bias: Array, deterministic: bool,
               prefix: Optional[prefixes_lib.LayerPrefix] = None) -> Array:
    """[B, T, E] -> [B, T, E]; mask [B, 1, T, T], bias [1, H, T, T]; optional deep prompt."""
    cfg, dtype = self.config, self.config.activation_dtype
    norm = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="pre_attention_layer_norm")
    y = norm(x)
    prefix = _normed_tokens(prefix, norm)
    y = layers.MultiHeadDotProductAttention(
        cfg.num_heads, cfg.head_dim, cfg.dropout_rate, cfg.float32_attention_logits, dtype,
        name="attention")(y, y, mask, bias, deterministic=deterministic, prefix=prefix)
    x = x + _dropout(cfg)(y, deterministic=deterministic)
    y = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="pre_mlp_layer_norm")(x)
    y = layers.MlpBlock(cfg.mlp_dim, cfg.mlp_activations, cfg.dropout_rate, dtype, name="mlp")(
        y, deterministic=deterministic)
    x = x + _dropout(cfg)(y, deterministic=deterministic)
    return layers.constrain(x, ("batch", "length", "embed"))


class DecoderLayer(nn.Module):
  """Pre-norm causal self-attention, cross-attention and MLP block.

  Attributes:
    config: the model configuration.
  """
  config: T5Config

  @nn.compact
  def __call__(self, y: Array, encoded: Array, self_mask: Optional[Array], cross_mask: Array,
               bias: Array, *, deterministic: bool, decode: bool,
               prefix: Optional[prefixes_lib.LayerPrefix] = None,
               cross_prefix: Optional[prefixes_lib.LayerPrefix] = None) -> Array:
    """[B, S, E], encoded [B, T, E] -> [B, S, E]; optional deep prompts of both attentions."""
    cfg, dtype = self.config, self.config.activation_dtype
    attn = lambda name: layers.MultiHeadDotProductAttention(
        cfg.num_heads, cfg.head_dim, cfg.dropout_rate, cfg.float32_attention_logits,
        dtype, name=name)
    norm = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="pre_self_attention_layer_norm")
    z = norm(y)
    prefix = _normed_tokens(prefix, norm)
    z = attn("self_attention")(z, z, self_mask, bias, deterministic=deterministic, decode=decode,
                               prefix=prefix)
    y = y + _dropout(cfg)(z, deterministic=deterministic)
    z = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="pre_cross_attention_layer_norm")(y)
    # While decoding, the encoder output is the same at every step: its keys and values are
    # projected once per sequence (layers.FIXED_KV), not once per generated token.
    z = attn("encoder_decoder_attention")(z, encoded, cross_mask, None, deterministic=deterministic,
                                          prefix=cross_prefix, fixed_kv=decode)
    y = y + _dropout(cfg)(z, deterministic=deterministic)
    z = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="pre_mlp_layer_norm")(y)
    z = layers.MlpBlock(cfg.mlp_dim, cfg.mlp_activations, cfg.dropout_rate, dtype, name="mlp")(
        z, deterministic=deterministic)
    y = y + _dropout(cfg)(z, deterministic=deterministic)
    return layers.constrain(y, ("batch", "length", "embed"))


def _normed_tokens(prefix: Optional[prefixes_lib.LayerPrefix], norm: nn.Module
                   ) -> Optional[prefixes_lib.LayerPrefix]:
  """Deep prompt tokens go through the layer's own pre-attention layer norm, as inputs do."""
  if prefix is None or prefix.tokens is None:
    return prefix
  return prefix._replace(tokens=norm(prefix.tokens))


class Encoder(nn.Module):
  """The encoder stack over already-embedded inputs.

  Attributes:
    config: the model configuration.
  """
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, valid: Array, deterministic: bool,
               prefix: Optional[prefixes_lib.Prefix] = None) -> Array:
    """x [B, T, E], valid [B, T] bool -> [B, T, E]; optional self-attention deep prompt."""
    cfg, dtype = self.config, self.config.activation_dtype
    length = x.shape[1]
    relpos = layers.RelativePositionBiases(
        cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance, cfg.num_heads,
        dtype, name="relpos_bias")
    bias = relpos(length, length, True)
    prefix_bias = None
    if prefix is not None:  # the prefix sits just before the input
      prefix_bias = relpos(length, prefix.length, True, query_offset=prefix.length)
    mask = jnp.logical_and(valid[:, None, :, None], valid[:, None, None, :])
    x = _dropout(cfg)(x.astype(dtype), deterministic=deterministic)
    for i in range(cfg.num_encoder_layers):
      layer_prefix = None if prefix is None else prefix.layer(i, prefix_bias)
      x = memory.remat_call(EncoderLayer(cfg, name=f"layers_{i}"), cfg.remat_policy, x, mask,
                            bias, prefix=layer_prefix, static={"deterministic": deterministic})
    x = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="encoder_norm")(x)
    return _dropout(cfg)(x, deterministic=deterministic)


class Decoder(nn.Module):
  """The decoder stack and output projection.

  Attributes:
    config: the model configuration.
    shared_embedding: the token embedder shared with the encoder.
  """
  config: T5Config
  shared_embedding: layers.Embed

  @nn.compact
  def __call__(self, encoded: Array, encoder_valid: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Optional[Array], *, deterministic: bool, decode: bool,
               max_decode_length: Optional[int], prefix: Optional[prefixes_lib.Prefix] = None,
               cross_prefix: Optional[prefixes_lib.Prefix] = None, segments: int = 1) -> Array:
    """-> logits [B, S, V] in float32; optional self- and cross-attention deep prompts.

    `segments` = G > 1 (teacher-forced only): each row holds G sequences of S / G tokens one
    after another, each attending to itself only, with the position biases it has alone; they
    share the row's encoder output, whose keys and values are then projected once, not G times.
    """
    cfg, dtype = self.config, self.config.activation_dtype
    length = decoder_input_tokens.shape[1] // segments
    if segments > 1 and (decode or length * segments != decoder_input_tokens.shape[1]):
      raise ValueError(f"segments={segments} needs teacher forcing and a length divisible by it")
    if decode:
      if max_decode_length is None:
        raise ValueError("decode=True needs max_decode_length (the cache length)")
      bias_len = max_decode_length
      self_mask = None  # the cache masks positions not yet written
      cross_mask = encoder_valid[:, None, None, :]
    else:
      bias_len = length
      causal = np.tril(np.ones((length, length), dtype=bool))
      causal = np.kron(np.eye(segments, dtype=bool), causal)[None, None]
      if decoder_target_tokens is None:
        self_mask = jnp.asarray(causal)
        cross_mask = encoder_valid[:, None, None, :]
      else:
        tgt = decoder_target_tokens > 0
        self_mask = causal & tgt[:, None, :, None] & tgt[:, None, None, :]
        cross_mask = tgt[:, None, :, None] & encoder_valid[:, None, None, :]
    relpos = layers.RelativePositionBiases(
        cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance, cfg.num_heads,
        dtype, name="relpos_bias")
    # Segments: every block gets the one-sequence biases (blocks off the diagonal are masked).
    tile = lambda b, keys: b if segments == 1 else jnp.tile(b, (1, 1, segments, keys))
    bias = tile(relpos(bias_len, bias_len, False), segments)
    prefix_bias = None
    if prefix is not None:  # the prefix sits just before the first decoder position
      prefix_bias = tile(relpos(bias_len, prefix.length, False, query_offset=prefix.length), 1)
    y = self.shared_embedding(decoder_input_tokens)
    y = _dropout(cfg)(y.astype(dtype), deterministic=deterministic)
    # Decoding writes a cache and is never differentiated: no remat there.
    remat = "none" if decode else cfg.remat_policy
    for i in range(cfg.num_decoder_layers):
      y = memory.remat_call(
          DecoderLayer(cfg, name=f"layers_{i}"), remat, y, encoded, self_mask, cross_mask, bias,
          prefix=None if prefix is None else prefix.layer(i, prefix_bias),
          cross_prefix=None if cross_prefix is None else cross_prefix.layer(i),
          static={"deterministic": deterministic, "decode": decode})
    y = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="decoder_norm")(y)
    y = _dropout(cfg)(y, deterministic=deterministic)
    if cfg.logits_via_embedding:
      logits = self.shared_embedding.attend(y) / jnp.sqrt(jnp.asarray(y.shape[-1], dtype))
    else:
      logits = layers.Dense((cfg.vocab_size,), ("embed", "vocab"), dtype=dtype,
                            name="logits_dense")(y)
    return layers.constrain(logits.astype(jnp.float32), ("batch", "length", "vocab"))


class Transformer(nn.Module):
  """T5 encoder-decoder with an optional prompt module on the embedded encoder input.

  Attributes:
    config: the model configuration (`T5Config`).
    prompt: optional input hook (see module docstring); its parameters live under `prompt/`.
  """
  config: T5Config
  prompt: Optional[nn.Module] = None

  def setup(self):
    cfg = self.config
    self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim, cfg.activation_dtype)
    self.encoder = Encoder(cfg)
    self.decoder = Decoder(cfg, self.token_embedder)

  def embed_encoder_input(self, encoder_input_tokens: Array, *, enable_dropout: bool = True,
                          task_index: Optional[Array] = None) -> tuple[Array, Array]:
    """Embeds tokens and applies the prompt hook: -> (x [B, T', E], valid [B, T'] bool).

    `task_index` [B] reaches only prompt modules with `task_indexed` set (see module docstring).
    """
    x = self.token_embedder(encoder_input_tokens)
    valid = encoder_input_tokens > 0
    if self.prompt is not None and not is_deep_prompt(self.prompt):
      extra = ({"task_index": task_index}
               if task_index is not None and getattr(self.prompt, "task_indexed", False) else {})
      x, valid = self.prompt(x, encoder_input_tokens, embedding=self.token_embedder.table(),
                             deterministic=not enable_dropout, valid=valid, **extra)
    return x, valid

  def deep_prompt(self, *, enable_dropout: bool = True) -> Optional[prefixes_lib.DeepPrompt]:
    """The deep prompt module's per-layer prefixes, or None without one."""
    if not is_deep_prompt(self.prompt):
      return None
    cfg = self.config
    deep = self.prompt.layer_prompts(cfg, embedding=self.token_embedder.table(),
                                     deterministic=not enable_dropout)
    prefixes_lib.check(deep, cfg.num_encoder_layers, cfg.num_decoder_layers)
    return deep

  def encode(self, encoder_input_tokens: Array, encoder_segment_ids: Optional[Array] = None,
             encoder_positions: Optional[Array] = None, *, enable_dropout: bool = True,
             prefixes: Optional[prefixes_lib.DeepPrompt] = None,
             task_index: Optional[Array] = None) -> tuple[Array, Array]:
    """Encodes [B, T] ids (0 = padding) -> (encoded [B, T', E], valid [B, T'] bool).

    T' = T plus the prompt's length when an input-hook prompt module is set. `prefixes`
    (default: the deep prompt module's, if any) gives the encoder's deep prompt.
    """
    _reject_packing(encoder_segment_ids, encoder_positions)
    if prefixes is None:
      prefixes = self.deep_prompt(enable_dropout=enable_dropout)
    x, valid = self.embed_encoder_input(encoder_input_tokens, enable_dropout=enable_dropout,
                                        task_index=task_index)
    if prefixes is None or prefixes.encoder is None:
      encoded = self.encoder(x, valid, not enable_dropout)
    else:
      encoded = self.encoder(x, valid, not enable_dropout, prefixes.encoder)
    return encoded, valid

  def decode(self, encoded: Array, encoder_valid: Array, decoder_input_tokens: Array,
             decoder_target_tokens: Optional[Array] = None,
             decoder_segment_ids: Optional[Array] = None,
             decoder_positions: Optional[Array] = None, *, enable_dropout: bool = True,
             decode: bool = False, max_decode_length: Optional[int] = None,
             prefixes: Optional[prefixes_lib.DeepPrompt] = None, segments: int = 1) -> Array:
    """Decoder logits [B, S, V] (float32) given the encoder output and its valid mask.

    `prefixes` (default: the deep prompt module's, if any) gives the decoder's deep prompts;
    `segments`: sequences per row sharing its encoder output (see `Decoder`).
    """
    _reject_packing(decoder_segment_ids, decoder_positions)
    if prefixes is None:
      prefixes = self.deep_prompt(enable_dropout=enable_dropout)
    deep = {} if prefixes is None else dict(prefix=prefixes.decoder, cross_prefix=prefixes.cross)
    return self.decoder(encoded, encoder_valid, decoder_input_tokens, decoder_target_tokens,
                        deterministic=not enable_dropout, decode=decode,
                        max_decode_length=max_decode_length, segments=segments, **deep)

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Optional[Array] = None,
               encoder_segment_ids: Optional[Array] = None,
               decoder_segment_ids: Optional[Array] = None,
               encoder_positions: Optional[Array] = None,
               decoder_positions: Optional[Array] = None, *, enable_dropout: bool = True,
               decode: bool = False, max_decode_length: Optional[int] = None,
               prefixes: Optional[prefixes_lib.DeepPrompt] = None,
               task_index: Optional[Array] = None) -> Array:
    """Teacher-forced logits [B, S, V] (t5x's call convention; padding id 0).

    `prefixes`: an explicit deep prompt (default: the deep prompt module's, if any).
    """
    if prefixes is None:  # once for both stacks
      prefixes = self.deep_prompt(enable_dropout=enable_dropout)
    encoded, valid = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                                 enable_dropout=enable_dropout, prefixes=prefixes,
                                 task_index=task_index)
    return self.decode(encoded, valid, decoder_input_tokens, decoder_target_tokens,
                       decoder_segment_ids, decoder_positions, enable_dropout=enable_dropout,
                       decode=decode, max_decode_length=max_decode_length, prefixes=prefixes)


def _reject_packing(segment_ids: Optional[Array], positions: Optional[Array]) -> None:
  if segment_ids is not None or positions is not None:
    raise ValueError("packed examples (segment ids / positions) are not supported: soft prompts "
                     "attach to one example per row; use unpacked batches (pack=False)")
