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
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax.t5 import layers
from spot_jax.t5.config import T5Config

Array = jax.Array


def _dropout(cfg: T5Config) -> nn.Dropout:
  return layers.Dropout(cfg.dropout_rate)


class EncoderLayer(nn.Module):
  """Pre-norm self-attention + MLP block.

  Attributes:
    config: the model configuration.
  """
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, mask: Array, bias: Array, deterministic: bool) -> Array:
    """[B, T, E] -> [B, T, E]; mask [B, 1, T, T], bias [1, H, T, T]."""
    cfg, dtype = self.config, self.config.activation_dtype
    y = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="pre_attention_layer_norm")(x)
    y = layers.MultiHeadDotProductAttention(
        cfg.num_heads, cfg.head_dim, cfg.dropout_rate, cfg.float32_attention_logits, dtype,
        name="attention")(y, y, mask, bias, deterministic=deterministic)
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
               bias: Array, *, deterministic: bool, decode: bool) -> Array:
    """[B, S, E], encoded [B, T, E] -> [B, S, E]."""
    cfg, dtype = self.config, self.config.activation_dtype
    attn = lambda name: layers.MultiHeadDotProductAttention(
        cfg.num_heads, cfg.head_dim, cfg.dropout_rate, cfg.float32_attention_logits, dtype, name=name)
    z = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="pre_self_attention_layer_norm")(y)
    z = attn("self_attention")(z, z, self_mask, bias, deterministic=deterministic, decode=decode)
    y = y + _dropout(cfg)(z, deterministic=deterministic)
    z = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="pre_cross_attention_layer_norm")(y)
    # While decoding, the encoder output is the same at every step: its keys and values are
    # projected once per sequence (layers.FIXED_KV), not once per generated token.
    z = attn("encoder_decoder_attention")(z, encoded, cross_mask, None, deterministic=deterministic,
                                          fixed_kv=decode)
    y = y + _dropout(cfg)(z, deterministic=deterministic)
    z = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="pre_mlp_layer_norm")(y)
    z = layers.MlpBlock(cfg.mlp_dim, cfg.mlp_activations, cfg.dropout_rate, dtype, name="mlp")(
        z, deterministic=deterministic)
    y = y + _dropout(cfg)(z, deterministic=deterministic)
    return layers.constrain(y, ("batch", "length", "embed"))


class Encoder(nn.Module):
  """The encoder stack over already-embedded inputs.

  Attributes:
    config: the model configuration.
  """
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, valid: Array, deterministic: bool) -> Array:
    """x [B, T, E], valid [B, T] bool -> [B, T, E]."""
    cfg, dtype = self.config, self.config.activation_dtype
    length = x.shape[1]
    bias = layers.RelativePositionBiases(
        cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance, cfg.num_heads,
        dtype, name="relpos_bias")(length, length, True)
    mask = jnp.logical_and(valid[:, None, :, None], valid[:, None, None, :])
    x = _dropout(cfg)(x.astype(dtype), deterministic=deterministic)
    for i in range(cfg.num_encoder_layers):
      x = EncoderLayer(cfg, name=f"layers_{i}")(x, mask, bias, deterministic)
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
               max_decode_length: Optional[int]) -> Array:
    """-> logits [B, S, V] in float32."""
    cfg, dtype = self.config, self.config.activation_dtype
    length = decoder_input_tokens.shape[1]
    if decode:
      if max_decode_length is None:
        raise ValueError("decode=True needs max_decode_length (the cache length)")
      bias_len = max_decode_length
      self_mask = None  # the cache masks positions not yet written
      cross_mask = encoder_valid[:, None, None, :]
    else:
      bias_len = length
      causal = np.tril(np.ones((length, length), dtype=bool))[None, None]
      if decoder_target_tokens is None:
        self_mask = jnp.asarray(causal)
        cross_mask = encoder_valid[:, None, None, :]
      else:
        tgt = decoder_target_tokens > 0
        self_mask = causal & tgt[:, None, :, None] & tgt[:, None, None, :]
        cross_mask = tgt[:, None, :, None] & encoder_valid[:, None, None, :]
    bias = layers.RelativePositionBiases(
        cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance, cfg.num_heads,
        dtype, name="relpos_bias")(bias_len, bias_len, False)
    y = self.shared_embedding(decoder_input_tokens)
    y = _dropout(cfg)(y.astype(dtype), deterministic=deterministic)
    for i in range(cfg.num_decoder_layers):
      y = DecoderLayer(cfg, name=f"layers_{i}")(
          y, encoded, self_mask, cross_mask, bias, deterministic=deterministic, decode=decode)
    y = layers.RMSNorm(cfg.layer_norm_epsilon, dtype, name="decoder_norm")(y)
    y = _dropout(cfg)(y, deterministic=deterministic)
    if cfg.logits_via_embedding:
      logits = self.shared_embedding.attend(y) / jnp.sqrt(jnp.asarray(y.shape[-1], dtype))
    else:
      logits = layers.Dense((cfg.vocab_size,), ("embed", "vocab"), dtype=dtype, name="logits_dense")(y)
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

  def embed_encoder_input(self, encoder_input_tokens: Array, *, enable_dropout: bool = True
                          ) -> tuple[Array, Array]:
    """Embeds tokens and applies the prompt hook: -> (x [B, T', E], valid [B, T'] bool)."""
    x = self.token_embedder(encoder_input_tokens)
    valid = encoder_input_tokens > 0
    if self.prompt is not None:
      x, valid = self.prompt(x, encoder_input_tokens, embedding=self.token_embedder.table(),
                             deterministic=not enable_dropout)
    return x, valid

  def encode(self, encoder_input_tokens: Array, encoder_segment_ids: Optional[Array] = None,
             encoder_positions: Optional[Array] = None, *, enable_dropout: bool = True
             ) -> tuple[Array, Array]:
    """Encodes [B, T] ids (0 = padding) -> (encoded [B, T', E], valid [B, T'] bool).

    T' = T plus the prompt's length when a prompt module is set.
    """
    _reject_packing(encoder_segment_ids, encoder_positions)
    x, valid = self.embed_encoder_input(encoder_input_tokens, enable_dropout=enable_dropout)
    encoded = self.encoder(x, valid, not enable_dropout)
    return encoded, valid

  def decode(self, encoded: Array, encoder_valid: Array, decoder_input_tokens: Array,
             decoder_target_tokens: Optional[Array] = None, decoder_segment_ids: Optional[Array] = None,
             decoder_positions: Optional[Array] = None, *, enable_dropout: bool = True,
             decode: bool = False, max_decode_length: Optional[int] = None) -> Array:
    """Decoder logits [B, S, V] (float32) given the encoder output and its valid mask."""
    _reject_packing(decoder_segment_ids, decoder_positions)
    return self.decoder(encoded, encoder_valid, decoder_input_tokens, decoder_target_tokens,
                        deterministic=not enable_dropout, decode=decode,
                        max_decode_length=max_decode_length)

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               decoder_target_tokens: Optional[Array] = None,
               encoder_segment_ids: Optional[Array] = None,
               decoder_segment_ids: Optional[Array] = None,
               encoder_positions: Optional[Array] = None,
               decoder_positions: Optional[Array] = None, *, enable_dropout: bool = True,
               decode: bool = False, max_decode_length: Optional[int] = None) -> Array:
    """Teacher-forced logits [B, S, V] (t5x's call convention; padding id 0)."""
    encoded, valid = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                                 enable_dropout=enable_dropout)
    return self.decode(encoded, valid, decoder_input_tokens, decoder_target_tokens,
                       decoder_segment_ids, decoder_positions, enable_dropout=enable_dropout,
                       decode=decode, max_decode_length=max_decode_length)


def _reject_packing(segment_ids: Optional[Array], positions: Optional[Array]) -> None:
  if segment_ids is not None or positions is not None:
    raise ValueError("packed examples (segment ids / positions) are not supported: soft prompts "
                     "attach to one example per row; use unpacked batches (pack=False)")
