"""The decoder-only network `DecoderLM` (Llama, Gemma 2/3, Qwen 2/3) under an optional prompt.

Parameter tree (created float32, stored in `config.param_dtype` by the models' `init_backbone`
and the loaders; logical axes in parentheses; N heads, K key/value heads, D head size):

  token_embedder/embedding                      [V, E]     (vocab, embed)
  layers_{i}/pre_attention_norm/scale           [E]        (embed)
  layers_{i}/attention/query/kernel             [E, N, D]  (embed, heads, kv)
  layers_{i}/attention/{key,value}/kernel       [E, K, D]  (embed, kv_heads, kv)
  layers_{i}/attention/{query,key,value}/bias   [N|K, D]   attention_bias only
  layers_{i}/attention/{query,key}_norm/scale   [D]        (kv), qk_norm only
  layers_{i}/attention/out/kernel               [N, D, E]  (heads, kv, embed)
  layers_{i}/post_attention_norm/scale          [E]        post_norms only
  layers_{i}/pre_mlp_norm/scale                 [E]
  layers_{i}/mlp/wi_0/kernel, wi_1/kernel       [E, F]     (embed, mlp): gate, up
  layers_{i}/mlp/wo/kernel                      [F, E]     (mlp, embed)
  layers_{i}/post_mlp_norm/scale                [E]        post_norms only
  final_norm/scale                              [E]
  logits_dense/kernel                           [E, V]     (embed, vocab), untied only
  prompt/...                                    only when a prompt module is given

The input hook: a prompt module without `layer_prompts` is called on the embedded tokens (after
Gemma's sqrt(E) scaling, so a soft prompt is not scaled, as PEFT's) as `prompt(embedded [B,T,E],
tokens [B,T], embedding=[V,E] table, deterministic=..., valid=[B,T] bool)`, plus `task_index=`
when its `task_indexed` is True, and returns (x [B,T',E], valid [B,T']). It reads validity from
`valid` only (the prompt modules' contract): every id a tokenizer has, 0 included, is a token.

The deep hook: a prompt module with a callable `layer_prompts` is called as
`prompt.layer_prompts(config, embedding=table, deterministic=...)` and returns one (key, value)
pair per layer, each [B or 1, P, K, D]; an explicit `prefixes=` takes precedence. They are used
raw, as a transformers cache of length P would be: no RoPE and no key norm on them.

Indices and positions: the sequence is [prefixes (P), x (T')]. Token t has index P + t and RoPE
position P + (cumsum(valid) - 1) clipped at 0, so positions count a soft prompt (as PEFT's
CAUSAL_LM) and skip left padding. Key j is seen by query i when j <= i, key j is valid, and on
sliding layers i - j < sliding_window (transformers' rule, in indices; prefixes are valid keys).
Input-hook placements are made for rows that start at index 0 (right padding): on a left-padded
row a "prefix" prompt lands before the padding, and a sliding window then counts the padding
between them, as transformers would. `decoding.generate` start-aligns its rows first.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax.errors import ConfigError
from spot_jax.backbones import memory, quantization
from spot_jax.backbones.decoder import layers
from spot_jax.backbones.decoder.config import DecoderConfig

Array = jax.Array
Prefixes = Sequence[layers.KV]  # per layer (key, value), each [B or 1, P, K, D]


def is_deep_prompt(module: Optional[nn.Module]) -> bool:
  """Whether a prompt module uses the deep hook (`layer_prompts`) rather than the input hook."""
  return module is not None and callable(getattr(module, "layer_prompts", None))


class Embed(nn.Module):
  """The token embedding table, also the output layer when tied.

  Parameters: embedding [V, E] ("vocab", "embed").

  Attributes:
    num_embeddings: V.
    features: E.
  """
  num_embeddings: int
  features: int

  def setup(self):
    init = nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=1, out_axis=0)
    self.embedding = layers._param(self, "embedding", init,  # pylint: disable=protected-access
                                   (self.num_embeddings, self.features), ("vocab", "embed"))

  def __call__(self, tokens: Array) -> Array:
    """tokens [B, T] int -> [B, T, E] rows of the table (in its stored dtype)."""
    return jnp.take(self.embedding, tokens, axis=0)

  def table(self) -> Array:
    """The table [V, E] in its stored dtype (prompt initialisers read it as float32)."""
    return self.embedding


class DecoderBlock(nn.Module):
  """One pre-norm decoder layer: attention, then the gated MLP, each with a residual.

  Attributes:
    config: the DecoderConfig.
    layer_type: "full" or "sliding".
  """
  config: DecoderConfig
  layer_type: str = "full"

  @nn.compact
  def __call__(self, x: Array, positions: Array, mask: Optional[Array],
               past: Optional[layers.KV] = None, write_index: Optional[Array] = None,
               kv_only: bool = False) -> tuple[Array, Optional[layers.KV]]:
    """x [B, T, E] -> ([B, T, E], written cache or None); see `layers.Attention`. With
    `kv_only`: the (key, value) this layer's attention makes of x, through its own frozen norm
    and projections (P-tuning v2's prompt tokens)."""
    cfg = self.config

    def norm(name: str) -> layers.RMSNorm:
      return layers.RMSNorm(cfg.norm_epsilon, cfg.norm_offset, "embed", name=name)

    attention = layers.Attention(cfg, self.layer_type, name="attention")
    if kv_only:
      return attention(norm("pre_attention_norm")(x), positions, None, kv_only=True)
    h, cache = attention(norm("pre_attention_norm")(x), positions, mask, past, write_index)
    if cfg.post_norms:
      h = norm("post_attention_norm")(h)
    x = x + h
    h = layers.GatedMLP(cfg, name="mlp")(norm("pre_mlp_norm")(x))
    if cfg.post_norms:
      h = norm("post_mlp_norm")(h)
    return x + h, cache


class DecoderLM(nn.Module):
  """A decoder-only language model with an optional prompt module (see the module docstring).

  Attributes:
    config: the DecoderConfig.
    prompt: an input-hook or deep prompt module, or None; its parameters live under `prompt/`.
  """
  config: DecoderConfig
  prompt: Optional[nn.Module] = None

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim)
    self.layers = [DecoderBlock(cfg, cfg.layer_type(i)) for i in range(cfg.num_layers)]
    self.final_norm = layers.RMSNorm(cfg.norm_epsilon, cfg.norm_offset, "embed")
    if not cfg.tie_word_embeddings:
      self.logits_dense = layers.Dense(cfg.vocab_size, ("embed", "vocab"), cfg.activation_dtype)

  def embed(self, tokens: Array) -> Array:
    """tokens [B, T] int -> embedded [B, T, E] in the activation dtype, times sqrt(E) for Gemma
    (the factor rounded to the activation dtype first, as transformers rounds it)."""
    dtype = self.config.activation_dtype
    x = self.token_embedder(tokens).astype(dtype)
    if self.config.scale_embeddings:
      x = x * jnp.asarray(np.float32(self.config.emb_dim ** 0.5)).astype(dtype)
    return x

  def table(self) -> Array:
    """The embedding table [V, E] (in the frozen weights' dtype)."""
    return self.token_embedder.table()

  def inputs(self, tokens: Optional[Array], *, valid: Optional[Array] = None,
             deterministic: bool = True, task_index: Optional[Array] = None,
             inputs_embeds: Optional[Array] = None,
             reads: Optional[Array] = None) -> tuple[Array, Array]:
    """The embedded sequence after the input hook: (x [B, T', E], valid [B, T'] bool).

    Args:
      tokens: [B, T] int ids (may be None with `inputs_embeds` and no input-hook prompt).
      valid: [B, T] bool, True at real tokens; None: every position is real.
      deterministic: no dropout in the prompt module.
      task_index: [B] int each row's task, for prompt modules with `task_indexed`.
      inputs_embeds: [B, T, E] used instead of `embed(tokens)`: already scaled, as
        transformers' `inputs_embeds` (which no family scales again).
      reads: [B, T] bool, the positions the prompt module reads (a router's mean, ATTEMPT's
        pooling, DePT's offsets): the inputs, not the targets a teacher-forced row carries
        after them, so that a prompt sees in training what it sees before decoding. None: every
        real position.
    """
    x = self.embed(tokens) if inputs_embeds is None else inputs_embeds.astype(
        self.config.activation_dtype)
    valid = jnp.ones(x.shape[:2], bool) if valid is None else valid.astype(bool)
    if self.prompt is not None and not is_deep_prompt(self.prompt):
      if tokens is None:
        raise ConfigError("an input-hook prompt needs the tokens; pass tokens with "
                          "inputs_embeds")
      extra = ({"task_index": task_index}
               if task_index is not None and getattr(self.prompt, "task_indexed", False) else {})
      if reads is not None and getattr(self.prompt, "placement", "prefix") == "suffix":
        raise ConfigError("placement='suffix' would put the prompt after the inputs a "
                          "teacher-forced row reads, before its targets; use 'prefix' or "
                          "'after_bos'")
      read = valid if reads is None else valid & reads.astype(bool)
      x, combined = self.prompt(x, jnp.where(read, tokens, 0), embedding=self.table(),
                                deterministic=deterministic, valid=read, **extra)
      if reads is not None:  # the positions it did not read are still real
        at = self.prompted_index(jnp.arange(valid.shape[1]), combined.shape[1] - valid.shape[1])
        combined = combined.at[:, at].set(combined[:, at] | valid)
      valid = combined
      x = x.astype(self.config.activation_dtype)
    return nn.with_logical_constraint(x, ("batch", "length", "embed")), valid.astype(bool)

  def deep_prefixes(self, deterministic: bool = True) -> Optional[Prefixes]:
    """The deep prompt module's per-layer (key, value) prefixes [1, P, K, D], or None without
    one. A module may give per-layer prompt tokens [layers, P, E] instead (P-tuning v2): layer
    l's prefixes are then its own frozen norm, key/value projections, key norm and RoPE applied
    to its tokens at positions 0..P-1, i.e. the tokens placed in front of layer l's input with
    their outputs discarded."""
    if not is_deep_prompt(self.prompt):
      return None
    deep = self.prompt.layer_prompts(self.config, embedding=self.table(),
                                     deterministic=deterministic)
    if isinstance(deep, tuple):
      return deep
    return self.token_prefixes(deep)

  def token_prefixes(self, tokens: Array) -> Prefixes:
    """Per-layer prompt tokens [layers, P, E] -> per layer (key, value) [1, P, K, D]: layer l's
    frozen norm, key/value projections, key norm and RoPE at positions 0..P-1."""
    tokens = jnp.asarray(tokens).astype(self.config.activation_dtype)
    positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
    return tuple(self.layers[i](tokens[i][None], positions, None, kv_only=True)
                 for i in range(self.config.num_layers))

  def stack(self, x: Array, *, positions: Array, q_index: Array, k_index: Array,
            k_valid: Array, past: Optional[Prefixes] = None,
            write_index: Optional[Array] = None, last_only: bool = False,
            keep: Optional[Array] = None) -> tuple[Array, Optional[tuple]]:
    """The layers, the final norm and the output layer.

    Args:
      x: [B, T, E] embedded inputs.
      positions: [B, T] RoPE positions.
      q_index: [B, T] the inputs' indices; k_index, k_valid: [B, S] the keys' (see
        `layers.attention_mask`).
      past: per layer (key, value): deep prefixes, or the decoding cache (`write_index`).
      write_index: where the inputs' keys and values go in the cache (a scalar, or [B]: each
        row's one input to its own index), or None.
      last_only: the logits of the last position only (T = 1 in the result), as decoding's
        prefill needs: [B, T, V] over a 262k vocabulary would dwarf the rest.
      keep: [B, K] int indices of the positions whose logits to compute (T = K in the result),
        or None: every position.

    Returns:
      (logits [B, T, V] float32, per layer the written cache, or None without write_index).
    """
    cfg = self.config
    if past is not None and len(past) != cfg.num_layers:
      raise ConfigError(f"{len(past)} prefix (key, value) pairs for a model of "
                        f"{cfg.num_layers} layers; give one per layer")
    masks = {kind: layers.attention_mask(q_index, k_index, k_valid,
                                         cfg.sliding_window if kind == "sliding" else None)
             for kind in set(cfg.layer_type(i) for i in range(cfg.num_layers))}
    caches = []
    # Decoding (a cache to write) is never differentiated: remat would only cost compile time.
    remat = cfg.remat_policy if write_index is None and not self.is_initializing() else "none"
    for i, layer in enumerate(self.layers):
      layer_past, mask = None if past is None else past[i], masks[cfg.layer_type(i)]
      if remat == "none":
        x, cache = layer(x, positions, mask, layer_past, write_index)
      else:  # the layer as a pure function of its parameters (it has no rngs, no state)
        block = DecoderBlock(cfg, cfg.layer_type(i), parent=None)
        run = lambda p, *a, block=block: block.apply({"params": p}, *a)  # noqa: E731
        x, cache = memory.checkpointed(run, remat)(layer.variables["params"], x, positions, mask,
                                                   layer_past)
      caches.append(cache)
    x = x[:, -1:] if last_only else x
    if keep is not None:
      x = jnp.take_along_axis(x, keep[..., None].astype(jnp.int32), axis=1)
    x = self.final_norm(x)
    logits = self.output_layer(x, remat)
    logits = layers.softcap(logits, cfg.final_logit_softcap)
    return logits, (tuple(caches) if write_index is not None else None)

  def output_layer(self, x: Array, remat: str) -> Array:
    """Logits [B, T, V] float32 of final-normed `x` [B, T, E] (the tied table or logits_dense).

    Under remat, the weight is converted (or gathered, under FSDP) again in the backward pass
    instead of being kept from the forward pass (for a bfloat16 table of 128k rows, a float32
    copy of 1.5 GB saved across the step).
    """
    cfg = self.config
    if cfg.tie_word_embeddings:
      weight, spec = self.table(), "bte,ve->btv"
    elif self.is_initializing():
      return self.logits_dense(x).astype(jnp.float32)
    elif quantization.is_quantized(self.logits_dense.variables["params"]["kernel"]):
      # qwix's matmul; detached (`memory.weight_as`): no float32 gradient of the whole kernel
      return quantization.einsum("bte,ev->btv", x,
                                 self.logits_dense.variables["params"]["kernel"],
                                 cfg.activation_dtype, detach=True).astype(jnp.float32)
    elif remat != "none":
      weight, spec = self.logits_dense.variables["params"]["kernel"], "bte,ev->btv"
    else:
      return self.logits_dense(x).astype(jnp.float32)

    def product(x, weight):
      return jnp.einsum(spec, x, memory.weight_as(weight, x.dtype, x, detach=True),
                        preferred_element_type=jnp.float32)

    if remat == "none" or weight.dtype == x.dtype == jnp.float32:
      return product(x, weight)
    return memory.checkpointed(product, "full")(x, weight)

  def __call__(self, tokens: Optional[Array], *, valid: Optional[Array] = None,
               deterministic: bool = True, task_index: Optional[Array] = None,
               prefixes: Optional[Prefixes] = None,
               inputs_embeds: Optional[Array] = None,
               keep: Optional[Array] = None, reads: Optional[Array] = None) -> Array:
    """Next-token logits of every position (or of the `keep` positions).

    Args:
      tokens: [B, T] int32 ids.
      valid: [B, T] bool, True at real tokens (any padding, left or right); None: all real.
      deterministic: no dropout in the prompt module.
      task_index: [B] int, each row's task (prompt modules with `task_indexed`).
      prefixes: per layer (key, value) [B or 1, P, K, D]; None: the deep prompt's, if any.
      inputs_embeds: [B, T, E] in place of the embedded tokens (see `inputs`).
      keep: [B, K] int positions of `tokens` whose logits alone are computed (a loss that
        counts K positions of a row need not pay the output layer for the other T' - K).
      reads: [B, T] bool, the positions the prompt module reads (see `inputs`).

    Returns:
      logits [B, T', V] float32, T' = T plus the input-hook prompt's positions; with `keep`,
      [B, K, V] at those positions.
    """
    x, valid = self.inputs(tokens, valid=valid, deterministic=deterministic,
                           task_index=task_index, inputs_embeds=inputs_embeds, reads=reads)
    if prefixes is None:
      prefixes = self.deep_prefixes(deterministic)
    batch, length = valid.shape
    num = 0 if prefixes is None else prefixes[0][0].shape[1]
    positions = num + jnp.maximum(jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1, 0)
    q_index = jnp.broadcast_to(num + jnp.arange(length, dtype=jnp.int32), (batch, length))
    k_index = jnp.broadcast_to(jnp.arange(num + length, dtype=jnp.int32), (batch, num + length))
    k_valid = jnp.concatenate([jnp.ones((batch, num), bool), valid], axis=1)
    if keep is not None:
      given = (tokens if tokens is not None else inputs_embeds).shape[1]
      keep = self.prompted_index(keep, length - given)
    logits, _ = self.stack(x, positions=positions, q_index=q_index, k_index=k_index,
                           k_valid=k_valid, past=prefixes, keep=keep)
    return logits

  def prompted_index(self, index: Array, added: int) -> Array:
    """Token positions -> their positions in the sequence the input-hook prompt made, `added`
    positions longer (the prompt's placement: before every token, after BOS, or after each
    row's last token)."""
    placement = getattr(self.prompt, "placement", "prefix")
    if not added or placement == "suffix":
      return index
    if placement == "after_bos":
      return jnp.where(index > 0, index + added, index)
    return index + added


def abstract_params(config: DecoderConfig, prompt: Optional[nn.Module] = None) -> Any:
  """The boxed parameter tree (logical axes, ShapeDtypeStructs) of `DecoderLM(config, prompt)`,
  from `jax.eval_shape`: no memory is allocated."""
  model = DecoderLM(config, prompt)
  tokens = jnp.ones((1, 2), jnp.int32)
  rngs = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}
  return jax.eval_shape(lambda: model.init(rngs, tokens))["params"]
