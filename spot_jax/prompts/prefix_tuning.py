"""Prefix tuning (Li & Liang 2021): learned key/value prefixes in every attention layer.

Every layer of each chosen attention type gets P = `length` extra key and value positions in
front of its own (see
`spot_jax.backbones.t5.prefixes`: visible to every query; in self-attention they sit
just before the sequence for the relative-position bias). The prefixes are stored flat, as
PEFT's PrefixEncoder stores them, [P, S * H * D] for S key/value slots, or produced by PEFT's
`prefix_projection` MLP

  prefixes = W_2 tanh(W_1 e + b_1) + b_2,   e [P, H * D] learned, W_1 [H*D, M], W_2 [M, S*H*D]

which `fold` computes once after training (the MLP is dropped; the plain prefixes are what is
exported and served).

Layouts of the S slots (`layout`):
  "separate": one key and one value slot per layer of each attention type in `attention`
    (encoder self-attention, decoder self-attention, cross-attention, in that order; within a
    type, layer 0's key, layer 0's value, layer 1's key, ...). Li & Liang's encoder-decoder
    setting is all three types.
  "peft": what peft 0.21.2 computes for a T5 SEQ_2_SEQ_LM model with transformers 5. PEFT
    stores S = 2 n slots (n = num_layers, the encoder depth); `get_prompt` views them as
    [P, 2n, H, D], concatenates that with itself along the slot axis, splits the 4n slots into
    chunks of 4 (self key, self value, cross key, cross value) per decoder layer, then drops
    the cross-attention part (it replaces the EncoderDecoderCache's cross-attention cache with
    an empty one) and the encoder never sees `past_key_values`. So only decoder self-attention
    gets prefixes: layer i's key is slot 4i mod 2n and its value slot 4i+1 mod 2n. With an even
    n, layers i and i + n/2 share one prefix and half the slots are never used; with an odd n
    every slot is used once. Requires the two stacks to have the same depth.

On a decoder-only backbone (a `DecoderConfig`) there is one attention type, the decoder's
self-attention (`attention=("decoder",)`, layout "separate"): S = 2 n slots of K * D numbers (K
key/value heads, D the head size), layer i's key in slot 2i and its value in slot 2i+1, which is
also how peft stores a CAUSAL_LM prefix; `layer_prompts` then returns the network's per-layer
(key, value) pairs, each [1, P, K, D].
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import common, deep, initializers
from spot_jax.backbones import kinds
from spot_jax.backbones.t5 import prefixes as prefixes_lib
from spot_jax.backbones.t5.config import T5Config

Array = jax.Array

LAYOUTS = ("separate", "peft")


def normal(stddev: float = 1.0) -> initializers.Initializer:
  """N(0, stddev^2) entries (PEFT initialises its prefix embedding as torch's N(0, 1))."""
  if not isinstance(stddev, (int, float)) or isinstance(stddev, bool) or not stddev >= 0:
    raise ConfigError(f"normal: stddev must be a non-negative number, got {stddev!r}; e.g. 1.0")

  def init(rng: Array, shape: Sequence[int], embedding: Array) -> Array:
    del embedding
    return stddev * jax.random.normal(rng, tuple(shape), jnp.float32)

  return init


def _torch_linear_init(fan_in: int):
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): torch.nn.Linear's default, as PEFT's MLP starts."""
  bound = 1.0 / np.sqrt(fan_in)
  return lambda rng, shape, dtype=jnp.float32: jax.random.uniform(rng, shape, dtype, -bound, bound)


def decoder_only(config: Any) -> bool:
  """Whether `config` is a decoder-only backbone's (one stack, grouped key/value heads)."""
  try:
    return kinds.kind_of(config) == "decoder"
  except TypeError:
    return False


def kv_shape(config: Any) -> tuple[int, int]:
  """(key/value heads, head size) of one prefix position: K x D on a decoder, H x D on T5."""
  if decoder_only(config):
    return config.num_kv_heads, config.head_dim
  return config.num_heads, config.head_dim


def slot_map(attention: Sequence[str], layout: str, config: T5Config
             ) -> dict[str, list[tuple[int, int]]]:
  """{attention type: [(key slot, value slot) per layer]} and, implicitly, S = stored slots."""
  if decoder_only(config):
    return {"decoder": [(2 * i, 2 * i + 1) for i in range(config.num_layers)]}
  if layout == "peft":
    n = config.num_encoder_layers
    return {"decoder": [((4 * i) % (2 * n), (4 * i + 1) % (2 * n))
                        for i in range(config.num_decoder_layers)]}
  out, offset = {}, 0
  for name in prefixes_lib.ATTENTION_TYPES:
    if name in attention:
      layers = config.num_encoder_layers if name == "encoder" else config.num_decoder_layers
      out[name] = [(offset + 2 * i, offset + 2 * i + 1) for i in range(layers)]
      offset += 2 * layers
  return out


def num_slots(attention: Sequence[str], layout: str, config: T5Config) -> int:
  """S, the key/value slots stored (PEFT's num_layers * 2 for the "peft" layout)."""
  if layout == "peft" and not decoder_only(config):
    return 2 * config.num_encoder_layers
  return sum(2 * len(v) for v in slot_map(attention, layout, config).values())


class PrefixTuning(nn.Module):
  """Per-layer key/value prefixes for the chosen attention types (the deep hook).

  Parameters (under the backbone's `prompt/` subtree), with T = H * D:
    without projection: prefix [P, S * T] float32, axes ("prompt", "prompt_embed");
    with projection: embedding [P, T] ("prompt", "prompt_embed"),
      hidden/kernel [T, M] ("prompt_embed", "prompt_mlp"), hidden/bias [M] ("prompt_mlp",),
      out/kernel [M, S * T] ("prompt_mlp", "prompt_embed"), out/bias [S * T] ("prompt_embed",).

  Attributes:
    length: P, the prefix positions (PEFT's num_virtual_tokens).
    attention: which attention types get prefixes, from "encoder", "decoder", "cross".
    layout: "separate" or "peft" (see the module docstring; "peft" needs attention=("decoder",)).
    projection: PEFT's prefix_projection (the MLP reparameterisation, folded after training).
    projection_dim: M, the MLP's hidden width (PEFT's encoder_hidden_size; default T).
    prefix_init: initialiser of the plain prefixes, or of the embedding e with projection.
    dtype: optional activation dtype; must equal the backbone's (None follows it).
  """
  length: int
  attention: tuple[str, ...] = prefixes_lib.ATTENTION_TYPES
  layout: str = "separate"
  projection: bool = False
  projection_dim: Optional[int] = None
  prefix_init: initializers.Initializer = normal(1.0)
  dtype: Optional[Any] = None

  def __post_init__(self):
    validate.positive_int(self.length, "PrefixTuning.length", example=10)
    attention = (self.attention,) if isinstance(self.attention, str) else tuple(self.attention)
    unknown = [a for a in attention if a not in prefixes_lib.ATTENTION_TYPES]
    if unknown or not attention or len(set(attention)) != len(attention):
      raise ConfigError(f"PrefixTuning.attention={self.attention!r}; give distinct names from "
                        f"{', '.join(prefixes_lib.ATTENTION_TYPES)}")
    object.__setattr__(self, "attention", attention)
    validate.one_of(self.layout, "PrefixTuning.layout", LAYOUTS)
    if self.layout == "peft" and attention != ("decoder",):
      raise ConfigError(f"PrefixTuning.layout='peft' puts prefixes in decoder self-attention only "
                        f"(as peft 0.21.2 does for T5); set attention=('decoder',), not "
                        f"{attention}")
    if self.projection_dim is not None:
      validate.positive_int(self.projection_dim, "PrefixTuning.projection_dim", example=512)
    super().__post_init__()

  def _check_config(self, config: T5Config) -> None:
    if self.dtype is not None and jnp.dtype(self.dtype) != jnp.dtype(config.activation_dtype):
      raise ConfigError(f"PrefixTuning.dtype={jnp.dtype(self.dtype).name} but the backbone runs in "
                        f"{jnp.dtype(config.activation_dtype).name}; leave dtype unset")
    if decoder_only(config):
      if self.attention != ("decoder",) or self.layout != "separate":
        raise ConfigError(f"PrefixTuning(attention={self.attention}, layout={self.layout!r}) on a "
                          f"decoder-only model, which has only the decoder's self-attention; set "
                          f"attention=('decoder',) and layout='separate'")
      return
    if self.layout == "peft" and config.num_encoder_layers != config.num_decoder_layers:
      raise ConfigError(f"PrefixTuning.layout='peft' needs as many decoder as encoder layers "
                        f"(peft sizes its prefix by the encoder); the model has "
                        f"{config.num_encoder_layers} and {config.num_decoder_layers}; use "
                        f"layout='separate'")

  @nn.compact
  def layer_prompts(self, config: T5Config, *, embedding: Array, deterministic: bool) -> Any:
    """The per-layer prefixes (batch axis 1) of `config`'s stacks: T5's `DeepPrompt`, or a
    decoder-only network's per-layer (key, value) pairs."""
    del deterministic  # no dropout in PEFT's prefix encoder
    self._check_config(config)
    width = int(np.prod(kv_shape(config)))
    slots = num_slots(self.attention, self.layout, config)
    if not self.projection:
      flat = common.prompt_param(self, "prefix", self.prefix_init, (self.length, slots * width),
                                 ("prompt", "prompt_embed"), embedding)
    else:
      flat = self._projected(width, slots, embedding)
    return self.prefixes(flat, config)

  def _projected(self, width: int, slots: int, embedding: Array) -> Array:
    """PEFT's prefix_projection: Linear(T, M) -> Tanh -> Linear(M, S * T) on the embedding."""
    hidden = self.projection_dim or width
    e = common.prompt_param(self, "embedding", self.prefix_init, (self.length, width),
                            ("prompt", "prompt_embed"), embedding)

    def dense(features: int, fan_in: int, axes: tuple[str, str], name: str) -> nn.Dense:
      init = _torch_linear_init(fan_in)
      return nn.Dense(features, dtype=jnp.float32, param_dtype=jnp.float32,
                      precision=jax.lax.Precision.HIGHEST,
                      kernel_init=nn.with_logical_partitioning(init, axes),
                      bias_init=nn.with_logical_partitioning(init, axes[1:]), name=name)

    h = jnp.tanh(dense(hidden, width, ("prompt_embed", "prompt_mlp"), "hidden")(e))
    return dense(slots * width, hidden, ("prompt_mlp", "prompt_embed"), "out")(h)

  def prefixes(self, flat: Array, config: T5Config) -> Any:
    """Flat prefixes [P, S * H * D] -> the `DeepPrompt` of this layout (a decoder-only model:
    per layer (key, value), each [1, P, K, D])."""
    heads, depth = kv_shape(config)
    slots = jnp.asarray(flat, jnp.float32).reshape(self.length, -1, heads, depth)
    if decoder_only(config):
      dtype = config.activation_dtype
      return tuple((slots[None, :, k].astype(dtype), slots[None, :, v].astype(dtype))
                   for k, v in slot_map(self.attention, self.layout, config)["decoder"])
    out = {}
    for name, pairs in slot_map(self.attention, self.layout, config).items():
      keys = jnp.stack([slots[:, k] for k, _ in pairs])[None]  # [1, layers, P, H, D]
      values = jnp.stack([slots[:, v] for _, v in pairs])[None]
      out[name] = prefixes_lib.Prefix(key=keys, value=values)
    return prefixes_lib.DeepPrompt(**out)

  def fold(self, params: Any, config: T5Config) -> dict[str, Array]:
    """The plain-prefix parameters {"prefix": [P, S * H * D]} that compute the same model.

    Args:
      params: this module's parameter subtree, boxed or not.
      config: the model configuration.
    """
    params = nn.meta.unbox(params)
    if not self.projection:
      return {"prefix": jnp.asarray(params["prefix"], jnp.float32)}
    missing = {"embedding", "hidden", "out"} - set(params)
    if missing:
      raise ConfigError(f"PrefixTuning.fold: the parameter subtree lacks {sorted(missing)}; pass "
                        f"the `prompt` subtree of a projected PrefixTuning model")
    width = int(np.prod(kv_shape(config)))
    slots = num_slots(self.attention, self.layout, config)
    e = jnp.asarray(params["embedding"], jnp.float32)
    hp = jax.lax.Precision.HIGHEST
    h = jnp.tanh(jnp.dot(e, params["hidden"]["kernel"], precision=hp) + params["hidden"]["bias"])
    flat = jnp.dot(h, params["out"]["kernel"], precision=hp) + params["out"]["bias"]
    assert flat.shape == (self.length, slots * width), flat.shape
    return {"prefix": flat}

  def folded_module(self) -> "PrefixTuning":
    """The plain PrefixTuning that, with `fold(params, config)`, computes the same outputs."""
    return PrefixTuning(self.length, self.attention, self.layout, projection=False,
                        prefix_init=self.prefix_init, dtype=self.dtype, parent=None)

  def export_parts(self, params: Any, config: T5Config) -> dict[str, np.ndarray]:
    """{attention type: plain [layers, 2, P, H, D] prefixes} (see `deep`), folded."""
    prompt = self.prefixes(self.fold(params, config)["prefix"], config)
    if decoder_only(config):
      return {"decoder": np.stack([np.stack([np.asarray(k[0]), np.asarray(v[0])])
                                   for k, v in prompt]).astype(np.float32)}
    return {name: np.stack([np.asarray(p.key[0]), np.asarray(p.value[0])], axis=1)
            for name, p in zip(prompt._fields, prompt) if p is not None}

  def export_prompt(self, params: Any, config: Optional[T5Config] = None) -> np.ndarray:
    """The exported record (see `deep`): plain prefixes by attention type."""
    if config is None:
      raise ConfigError("PrefixTuning.export_prompt needs the model's T5Config (heads, head_dim, "
                        "layers) to lay out its prefixes")
    return deep.to_record(self.export_parts(params, config))
