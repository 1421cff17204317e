"""Decoder-only configuration: one frozen dataclass for the Llama, Gemma 2/3 and Qwen 2/3 shapes.

Field names follow t5x's `T5Config` where the concept is shared (`emb_dim`, `num_heads`,
`head_dim`, `mlp_dim`, `dtype`); the rest name what the families differ in. A family is a set
of switches, not a subclass:

  Llama 3     silu, norm_offset 0, rope_scaling "llama3", untied or tied output layer
  Gemma 2     gelu_tanh, norm_offset 1, post_norms, scale_embeddings, alternating sliding and
              full layers, attention and final soft-capping, query_pre_attn_scalar
  Gemma 3     as Gemma 2 without soft-capping, plus qk_norm, five sliding layers to one full,
              a local rope base for sliding layers (rope_local_theta)
  Qwen 2 / 3  as Llama plus query/key/value biases (Qwen 2) or qk_norm (Qwen 3)

`CONFIGS` holds the published shapes (from each model's config.json) and tiny test models.
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Mapping, Optional, Union

import jax.numpy as jnp

from spot_jax import validate
from spot_jax.backbones import memory
from spot_jax.backbones import quantization
from spot_jax.errors import ConfigError

ACTIVATIONS = ("gelu", "gelu_tanh", "silu")
LAYER_TYPES = ("full", "sliding")
ROPE_TYPES = ("linear", "llama3")
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """A RoPE frequency scaling, as transformers' `rope_parameters` names it.

  Attributes:
    rope_type: "linear" (every frequency / factor) or "llama3" (Llama 3.1's piecewise rule).
    factor: the scaling factor.
    low_freq_factor, high_freq_factor, original_max_position_embeddings: "llama3" only.
  """
  rope_type: str
  factor: float
  low_freq_factor: Optional[float] = None
  high_freq_factor: Optional[float] = None
  original_max_position_embeddings: Optional[int] = None

  def __post_init__(self):
    validate.one_of(self.rope_type, "RopeScaling.rope_type", ROPE_TYPES)
    object.__setattr__(self, "factor", validate.positive(self.factor, "RopeScaling.factor"))
    llama3 = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    for name in llama3:
      value = getattr(self, name)
      if self.rope_type == "llama3":
        if name == "original_max_position_embeddings":
          value = validate.positive_int(value, f"RopeScaling.{name}", example=8192)
        else:
          value = validate.positive(value, f"RopeScaling.{name}")
      elif value is not None:
        raise ConfigError(f"RopeScaling.{name}={value!r} is for rope_type 'llama3' only; leave "
                          f"it unset for {self.rope_type!r}")
      object.__setattr__(self, name, value)
    if self.rope_type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
      raise ConfigError(f"RopeScaling.high_freq_factor={self.high_freq_factor} must exceed "
                        f"low_freq_factor={self.low_freq_factor}")


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """Hyper-parameters of a decoder-only transformer (pre-norm, RoPE, grouped-query attention).

  Attributes:
    vocab_size: rows V of the embedding table.
    emb_dim: model width E.
    num_heads: query heads N.
    num_kv_heads: key/value heads K (N a multiple of K; K = 1 is multi-query attention).
    num_layers: decoder blocks.
    head_dim: width D of one head (N * D need not equal E).
    mlp_dim: hidden width F of the gated MLP.
    mlp_activation: the gate's activation: "silu" (Llama, Qwen), "gelu_tanh" (Gemma), "gelu".
    norm_epsilon: epsilon of every RMSNorm.
    norm_offset: 0.0 (Llama: x * scale) or 1.0 (Gemma: scales stored zero-centred, applied as
      x * (1 + scale)). It also selects the dtype order of the norm, as transformers does.
    post_norms: Gemma 2/3's extra norms after attention and after the MLP.
    qk_norm: RMSNorm on each query and key head before RoPE (Gemma 3, Qwen 3).
    attention_bias: biases on the query, key and value projections (Qwen 2).
    rope_theta: RoPE base of full-attention layers (and of sliding ones without their own).
    rope_local_theta: RoPE base of sliding layers (Gemma 3: 10000); None: `rope_theta`.
    rope_scaling: a `RopeScaling` (or a dict of its fields), or None. It applies to full
      layers, and to sliding layers only when they share the global base (transformers scales
      Gemma 3's global rope only).
    layer_types: "full" or "sliding" per layer; () means every layer is full.
    sliding_window: W of sliding layers: a query at index i sees keys at i - W < j <= i.
    attn_logit_softcap: c in tanh(logits / c) * c on attention logits (Gemma 2), or None.
    final_logit_softcap: the same on the output logits (Gemma 2), or None.
    query_pre_attn_scalar: s in the attention scale s**-0.5; None: head_dim.
    scale_embeddings: multiply embedded tokens by sqrt(emb_dim) (Gemma), rounded to the
      activation dtype first as transformers does.
    tie_word_embeddings: the output layer is the embedding table (no logits_dense).
    max_position_embeddings: the context length the model was trained for (informative; HF).
    bos_id, eos_id: beginning- and end-of-sequence ids of the model's tokenizer.
    pad_id: the tokenizer's padding id, or None.
    dtype: activation dtype name ("float32" or "bfloat16"); weights are cast to it at use.
    param_dtype: the dtype the frozen weights are stored in ("float32" or "bfloat16"; None:
      the checkpoint's, bfloat16 for a Hugging Face checkpoint stored so, else float32).
    remat_policy: what each layer keeps for the backward pass ("none", "full", "save_dots",
      "offload"; see `spot_jax.backbones.memory`).
    quantization: the frozen matmul kernels' weight-only quantization ("none", "int8", "int4",
      "nf4"; `spot_jax.backbones.quantization`).
    quantization_tile: None (a scale per output channel) or the sub-channel tile size.
  """
  vocab_size: int
  emb_dim: int
  num_heads: int
  num_kv_heads: int
  num_layers: int
  head_dim: int
  mlp_dim: int
  mlp_activation: str = "silu"
  norm_epsilon: float = 1e-6
  norm_offset: float = 0.0
  post_norms: bool = False
  qk_norm: bool = False
  attention_bias: bool = False
  rope_theta: float = 10000.0
  rope_local_theta: Optional[float] = None
  rope_scaling: Union[None, RopeScaling, Mapping[str, Any]] = None
  layer_types: tuple[str, ...] = ()
  sliding_window: Optional[int] = None
  attn_logit_softcap: Optional[float] = None
  final_logit_softcap: Optional[float] = None
  query_pre_attn_scalar: Optional[float] = None
  scale_embeddings: bool = False
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 8192
  bos_id: int = 1
  eos_id: int = 2
  pad_id: Optional[int] = None
  dtype: str = "float32"
  param_dtype: Optional[str] = None
  remat_policy: str = "none"
  quantization: str = "none"
  quantization_tile: Optional[int] = None

  def __post_init__(self):
    name = "DecoderConfig."
    for field in ("vocab_size", "emb_dim", "num_heads", "num_kv_heads", "num_layers",
                  "head_dim", "mlp_dim", "max_position_embeddings"):
      validate.positive_int(getattr(self, field), name + field)
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(f"{name}num_heads={self.num_heads} must be a multiple of "
                        f"num_kv_heads={self.num_kv_heads} (grouped-query attention)")
    validate.one_of(self.mlp_activation, name + "mlp_activation", ACTIVATIONS)
    validate.one_of(self.dtype, name + "dtype", DTYPES)
    memory.check_dtype(self.param_dtype, name + "param_dtype")
    memory.check_remat(self.remat_policy, name + "remat_policy")
    quantization.check(self.quantization, self.quantization_tile, name)
    self._set("norm_epsilon", validate.positive(self.norm_epsilon, name + "norm_epsilon"))
    self._set("norm_offset", validate.non_negative(self.norm_offset, name + "norm_offset"))
    self._set("rope_theta", validate.positive(self.rope_theta, name + "rope_theta"))
    for field in ("rope_local_theta", "attn_logit_softcap", "final_logit_softcap",
                  "query_pre_attn_scalar"):
      value = getattr(self, field)
      self._set(field, None if value is None else validate.positive(value, name + field))
    for field in ("post_norms", "qk_norm", "attention_bias", "scale_embeddings",
                  "tie_word_embeddings"):
      self._set(field, bool(getattr(self, field)))
    if isinstance(self.rope_scaling, Mapping):
      self._set("rope_scaling", RopeScaling(**self.rope_scaling))
    elif self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
      raise ConfigError(f"{name}rope_scaling={self.rope_scaling!r} must be None, a RopeScaling "
                        f"or a dict of its fields, e.g. {{'rope_type': 'linear', 'factor': 8.0}}")
    self._check_layer_types()
    for field in ("bos_id", "eos_id", "pad_id"):
      value = getattr(self, field)
      if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool)
                                or not 0 <= value < self.vocab_size):
        raise ConfigError(f"{name}{field}={value!r} must be a token id in [0, "
                          f"{self.vocab_size}) (vocab_size)")
      self._set(field, None if value is None else int(value))
    if self.bos_id is None or self.eos_id is None:
      raise ConfigError(f"{name}bos_id and eos_id must be token ids, not None")

  def _set(self, field: str, value: Any) -> None:
    object.__setattr__(self, field, value)

  def _check_layer_types(self) -> None:
    name = "DecoderConfig."
    types = tuple(self.layer_types or ())
    for i, kind in enumerate(types):
      validate.one_of(kind, f"{name}layer_types[{i}]", LAYER_TYPES)
    if types and len(types) != self.num_layers:
      raise ConfigError(f"{name}layer_types has {len(types)} entries but num_layers="
                        f"{self.num_layers}; give one per layer, or () for all 'full'")
    # One spelling of "every layer is full", so equal models compare equal.
    self._set("layer_types", () if all(t == "full" for t in types) else types)
    if self.layer_types or self.sliding_window is not None:
      self._set("sliding_window", validate.positive_int(
          self.sliding_window, name + "sliding_window", optional=not self.layer_types,
          note="sliding layers need a window", example=4096))

  @property
  def activation_dtype(self) -> jnp.dtype:
    """The jnp dtype of activations."""
    return jnp.dtype(self.dtype)

  @property
  def frozen_dtype(self) -> jnp.dtype:
    """The jnp dtype the frozen weights are stored in (float32 while `param_dtype` is None)."""
    return memory.frozen_dtype(self.param_dtype)

  @property
  def attention_scale(self) -> float:
    """The factor on query-key logits: query_pre_attn_scalar**-0.5 (default head_dim**-0.5)."""
    return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

  def layer_type(self, i: int) -> str:
    """"full" or "sliding" for layer i."""
    return self.layer_types[i] if self.layer_types else "full"

  def replace(self, **changes) -> "DecoderConfig":
    """A copy with `changes` applied (checked again)."""
    return dataclasses.replace(self, **changes)


def _every(n: int, layers: int) -> tuple[str, ...]:
  """Gemma's pattern: every n-th layer full, the others sliding (n - 1 local : 1 global)."""
  return tuple("full" if (i + 1) % n == 0 else "sliding" for i in range(layers))


_LLAMA3_SCALING = RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
_LLAMA = dict(mlp_activation="silu", norm_epsilon=1e-5, rope_theta=500000.0,
              rope_scaling=_LLAMA3_SCALING, tie_word_embeddings=True,
              max_position_embeddings=131072, bos_id=128000, eos_id=128001)
_LLAMA31 = dict(_LLAMA, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
                tie_word_embeddings=False)
_QWEN3 = dict(mlp_activation="silu", norm_epsilon=1e-6, qk_norm=True, rope_theta=1_000_000.0,
              max_position_embeddings=40960, bos_id=151643, eos_id=151645)
_GEMMA = dict(mlp_activation="gelu_tanh", norm_epsilon=1e-6, norm_offset=1.0, post_norms=True,
              scale_embeddings=True, tie_word_embeddings=True, query_pre_attn_scalar=256,
              bos_id=2, eos_id=1, pad_id=0)
_GEMMA3 = dict(_GEMMA, qk_norm=True, rope_theta=1_000_000.0, rope_local_theta=10_000.0)


def _build_registry() -> dict[str, DecoderConfig]:
  reg = {
      # meta-llama/Llama-3.2-1B and -3B config.json.
      "llama_3_2_1b": DecoderConfig(vocab_size=128256, emb_dim=2048, num_heads=32,
                                    num_kv_heads=8, num_layers=16, head_dim=64, mlp_dim=8192,
                                    **_LLAMA),
      "llama_3_2_3b": DecoderConfig(vocab_size=128256, emb_dim=3072, num_heads=24,
                                    num_kv_heads=8, num_layers=28, head_dim=128, mlp_dim=8192,
                                    **_LLAMA),
      # google/gemma-2-2b: sliding first, then alternating.
      "gemma_2_2b": DecoderConfig(vocab_size=256000, emb_dim=2304, num_heads=8, num_kv_heads=4,
                                  num_layers=26, head_dim=256, mlp_dim=9216,
                                  layer_types=_every(2, 26), sliding_window=4096,
                                  attn_logit_softcap=50.0, final_logit_softcap=30.0,
                                  max_position_embeddings=8192, **_GEMMA),
      # google/gemma-3-270m, -1b-pt and -4b-pt's text_config: five sliding layers to one full.
      "gemma_3_270m": DecoderConfig(vocab_size=262144, emb_dim=640, num_heads=4, num_kv_heads=1,
                                    num_layers=18, head_dim=256, mlp_dim=2048,
                                    layer_types=_every(6, 18), sliding_window=512,
                                    max_position_embeddings=32768, **_GEMMA3),
      "gemma_3_1b": DecoderConfig(vocab_size=262144, emb_dim=1152, num_heads=4, num_kv_heads=1,
                                  num_layers=26, head_dim=256, mlp_dim=6912,
                                  layer_types=_every(6, 26), sliding_window=512,
                                  max_position_embeddings=32768, **_GEMMA3),
      "gemma_3_4b": DecoderConfig(vocab_size=262208, emb_dim=2560, num_heads=8, num_kv_heads=4,
                                  num_layers=34, head_dim=256, mlp_dim=10240,
                                  layer_types=_every(6, 34), sliding_window=1024,
                                  rope_scaling=RopeScaling("linear", 8.0),
                                  max_position_embeddings=131072, **_GEMMA3),
      # meta-llama/Llama-3.1-8B and -70B: untied, the same llama3 rope scaling (factor 8).
      "llama_3_1_8b": DecoderConfig(vocab_size=128256, emb_dim=4096, num_heads=32,
                                    num_kv_heads=8, num_layers=32, head_dim=128, mlp_dim=14336,
                                    **_LLAMA31),
      "llama_3_1_70b": DecoderConfig(vocab_size=128256, emb_dim=8192, num_heads=64,
                                     num_kv_heads=8, num_layers=80, head_dim=128,
                                     mlp_dim=28672, **_LLAMA31),
      # google/gemma-3-12b-pt and -27b-pt's text_config (27B: head_dim 128, scalar 5376 / 32).
      "gemma_3_12b": DecoderConfig(vocab_size=262208, emb_dim=3840, num_heads=16,
                                   num_kv_heads=8, num_layers=48, head_dim=256, mlp_dim=15360,
                                   layer_types=_every(6, 48), sliding_window=1024,
                                   rope_scaling=RopeScaling("linear", 8.0),
                                   max_position_embeddings=131072, **_GEMMA3),
      "gemma_3_27b": DecoderConfig(vocab_size=262208, emb_dim=5376, num_heads=32,
                                   num_kv_heads=16, num_layers=62, head_dim=128, mlp_dim=21504,
                                   layer_types=_every(6, 62), sliding_window=1024,
                                   rope_scaling=RopeScaling("linear", 8.0),
                                   max_position_embeddings=131072,
                                   **dict(_GEMMA3, query_pre_attn_scalar=168)),
      # Qwen/Qwen3-8B and -32B: qk_norm, untied, no sliding layers.
      "qwen_3_8b": DecoderConfig(vocab_size=151936, emb_dim=4096, num_heads=32, num_kv_heads=8,
                                 num_layers=36, head_dim=128, mlp_dim=12288, **_QWEN3),
      "qwen_3_32b": DecoderConfig(vocab_size=151936, emb_dim=5120, num_heads=64, num_kv_heads=8,
                                  num_layers=64, head_dim=128, mlp_dim=25600, **_QWEN3),
  }
  # Tiny random models for tests and CPU smoke runs: each family's every switch, small sizes;
  # 384 rows hold the byte vocabulary's 259 ids (as t5_1_1_byte_tiny's table).
  tiny = dict(vocab_size=384, emb_dim=32, num_heads=4, num_kv_heads=2, num_layers=2,
              head_dim=8, mlp_dim=64)
  reg["decoder_tiny_llama"] = DecoderConfig(
      **tiny, **dict(_LLAMA, tie_word_embeddings=False, bos_id=1, eos_id=2,
                     rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 16)))
  reg["decoder_tiny_gemma2"] = DecoderConfig(
      **tiny, **dict(_GEMMA, query_pre_attn_scalar=8), layer_types=_every(2, 2),
      sliding_window=4, attn_logit_softcap=50.0, final_logit_softcap=30.0)
  reg["decoder_tiny_gemma3"] = DecoderConfig(
      **dict(tiny, num_layers=3), **dict(_GEMMA3, query_pre_attn_scalar=8),
      layer_types=_every(3, 3), sliding_window=4, rope_scaling=RopeScaling("linear", 8.0))
  return reg


CONFIGS: dict[str, DecoderConfig] = _build_registry()


def config_by_name(name: str, *, dtype: Optional[str] = None, param_dtype: Optional[str] = None,
                   remat_policy: Optional[str] = None, quantization: Optional[str] = None,
                   quantization_tile: Optional[int] = None) -> DecoderConfig:
  """The named configuration, e.g. "gemma_3_1b", "llama_3_2_1b", "decoder_tiny_llama".

  Args:
    name: a key of `CONFIGS`.
    dtype: override the activation dtype ("float32", "bfloat16").
    param_dtype: the frozen weights' dtype (gin FROZEN_DTYPE; None: the checkpoint's).
    remat_policy: per-layer rematerialisation (gin REMAT; None: "none").
    quantization, quantization_tile: the frozen kernels' quantization (gin QUANTIZATION,
      QUANTIZATION_TILE; None: "none", per channel).

  Raises:
    ConfigError: an unknown name, in one line with close matches and every valid name.
  """
  try:
    config = CONFIGS[name]
  except KeyError:
    close = validate.close_names(name, list(CONFIGS))
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ConfigError(f"unknown decoder config {name!r}{hint}; valid names: "
                      f"{', '.join(sorted(CONFIGS))}") from None
  memory.check_dtype(param_dtype, "param_dtype")
  if remat_policy is not None:
    memory.check_remat(remat_policy, "remat_policy")
  changes = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype),
                               ("remat_policy", remat_policy), ("quantization", quantization),
                               ("quantization_tile", quantization_tile)) if v is not None}
  return config.replace(**changes) if changes else config
