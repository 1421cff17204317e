"""T5 configuration: one frozen dataclass whose field names follow t5x's `T5Config`."""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax.numpy as jnp

from spot_jax import validate
from spot_jax.backbones import memory
from spot_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyper-parameters of a T5 encoder-decoder.

  Attributes:
    vocab_size: rows of the (padded) embedding table, 32128 for public T5 checkpoints.
    dtype: activation dtype name ("float32" or "bfloat16"); weights are cast to it at use.
    emb_dim: model width E.
    num_heads: attention heads H.
    num_encoder_layers: encoder blocks.
    num_decoder_layers: decoder blocks.
    head_dim: width of one head D (H * D need not equal E).
    mlp_dim: hidden width of the feed-forward block.
    mlp_activations: ("gelu", "linear") for gated-GELU (T5.1.1), ("relu",) for original T5.
    dropout_rate: dropout applied when `enable_dropout=True`.
    logits_via_embedding: tie the output layer to the input embedding (original T5); the
      decoder output is then scaled by emb_dim**-0.5 before the tied projection.
    float32_attention_logits: compute attention logits and softmax in float32.
    relative_attention_num_buckets: relative-position buckets per stack.
    relative_attention_max_distance: distance beyond which positions share a bucket.
    layer_norm_epsilon: epsilon of T5's RMS layer norm.
    param_dtype: the dtype the frozen weights are stored in ("float32" or "bfloat16"; None:
      float32).
    remat_policy: what each encoder and decoder layer keeps for the backward pass ("none",
      "full", "save_dots", "offload"; see `spot_jax.backbones.memory`).
  """
  vocab_size: int = 32128
  dtype: str = "float32"
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ("relu",)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = True
  float32_attention_logits: bool = True
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  param_dtype: Optional[str] = None
  remat_policy: str = "none"

  def __post_init__(self):
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
    for name in ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim",
                 "num_encoder_layers", "num_decoder_layers",
                 "relative_attention_num_buckets", "relative_attention_max_distance"):
      validate.positive_int(getattr(self, name), f"T5Config.{name}")
    validate.one_of(self.dtype, "T5Config.dtype", ("float32", "bfloat16", "float16"))
    unknown = [a for a in self.mlp_activations if a not in _ACTIVATION_NAMES]
    if unknown or not self.mlp_activations:
      raise ConfigError(f"T5Config.mlp_activations {self.mlp_activations!r} must be a non-empty "
                        f"sequence of {sorted(_ACTIVATION_NAMES)}")
    validate.fraction(self.dropout_rate, "T5Config.dropout_rate", low_closed=True)
    memory.check_dtype(self.param_dtype, "T5Config.param_dtype")
    memory.check_remat(self.remat_policy, "T5Config.remat_policy")

  @property
  def activation_dtype(self) -> jnp.dtype:
    """The jnp dtype of activations."""
    return jnp.dtype(self.dtype)

  @property
  def frozen_dtype(self) -> jnp.dtype:
    """The jnp dtype the frozen weights are stored in (float32 while `param_dtype` is None)."""
    return memory.frozen_dtype(self.param_dtype)

  def replace(self, **changes) -> "T5Config":
    """A copy with `changes` applied."""
    return dataclasses.replace(self, **changes)


_ACTIVATION_NAMES = frozenset({"gelu", "relu", "linear", "silu", "gelu_exact"})

_T5_1_1 = dict(mlp_activations=("gelu", "linear"), logits_via_embedding=False, dropout_rate=0.1)
_T5 = dict(mlp_activations=("relu",), logits_via_embedding=True, dropout_rate=0.1)

# Sizes from the public T5 / T5.1.1 gin files (emb_dim, num_heads, layers, head_dim, mlp_dim).
_SIZES_1_1 = {
    "small": (512, 6, 8, 64, 1024),
    "base": (768, 12, 12, 64, 2048),
    "large": (1024, 16, 24, 64, 2816),
    "xl": (2048, 32, 24, 64, 5120),
    "xxl": (4096, 64, 24, 64, 10240),
}
_SIZES_1_0 = {
    "small": (512, 8, 6, 64, 2048),
    "base": (768, 12, 12, 64, 3072),
    "large": (1024, 16, 24, 64, 4096),
    "xl": (1024, 32, 24, 128, 16384),   # "3B"
    "xxl": (1024, 128, 24, 128, 65536),  # "11B"
}


def _sized(family: dict, size: tuple[int, int, int, int, int]) -> T5Config:
  emb, heads, layers, head_dim, mlp = size
  return T5Config(emb_dim=emb, num_heads=heads, num_encoder_layers=layers,
                  num_decoder_layers=layers, head_dim=head_dim, mlp_dim=mlp, **family)


def _build_registry() -> dict[str, T5Config]:
  reg: dict[str, T5Config] = {}
  for size, dims in _SIZES_1_1.items():
    cfg = _sized(_T5_1_1, dims)
    reg[f"t5_1_1_{size}"] = cfg
    # LM-adapted checkpoints (t5_1_1_lm100k_*) share the T5.1.1 architecture.
    reg[f"t5_1_1_lm100k_{size}"] = cfg
  for size, dims in _SIZES_1_0.items():
    reg[f"t5_{size}"] = _sized(_T5, dims)
  reg["t5_3b"] = reg["t5_xl"]
  reg["t5_11b"] = reg["t5_xxl"]
  # The real T5X test checkpoint in prompt-tuning's test_data (../shared/fixtures/t5).
  reg["t5_1_1_tiny"] = T5Config(emb_dim=4, num_heads=2, head_dim=2, mlp_dim=8,
                                num_encoder_layers=2, num_decoder_layers=2,
                                relative_attention_num_buckets=4,
                                relative_attention_max_distance=8, **_T5_1_1)
  reg["t5_tiny"] = reg["t5_1_1_tiny"].replace(**_T5)
  # The t5x comparison's benchmark shape: T5.1.1 small's widths with 6+6 layers of 8 heads
  # (random weights).
  reg["t5_1_1_small_like"] = reg["t5_1_1_small"].replace(num_heads=8, num_encoder_layers=6,
                                                          num_decoder_layers=6)
  # Small-vocabulary test models: fast enough for unit tests and CPU smoke runs.
  reg["t5_1_1_test"] = T5Config(vocab_size=128, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=64,
                                num_encoder_layers=2, num_decoder_layers=2,
                                relative_attention_num_buckets=8,
                                relative_attention_max_distance=16, **_T5_1_1)
  reg["t5_test"] = reg["t5_1_1_test"].replace(**_T5)
  # Byte-vocabulary smoke models (seqio.ByteVocabulary has 259 ids; the table is padded to 384).
  reg["t5_1_1_byte_tiny"] = T5Config(vocab_size=384, emb_dim=64, num_heads=4, head_dim=16,
                                     mlp_dim=128, num_encoder_layers=2, num_decoder_layers=2,
                                     **_T5_1_1)
  reg["t5_byte_tiny"] = reg["t5_1_1_byte_tiny"].replace(**_T5)
  # The embedded toy T5 made by `python -m spot_jax.embedded.pretrain` (spot_jax/embedded/toy_t5):
  # its SentencePiece vocabulary (< 284 pieces) plus 100 sentinels, padded to 384 rows.
  reg["t5_1_1_toy"] = T5Config(vocab_size=384, emb_dim=128, num_heads=4, head_dim=32, mlp_dim=384,
                               num_encoder_layers=3, num_decoder_layers=3,
                               relative_attention_num_buckets=16,
                               relative_attention_max_distance=64, **_T5_1_1)
  return reg


CONFIGS: dict[str, T5Config] = _build_registry()


def config_by_name(name: str, *, dtype: Optional[str] = None,
                   dropout_rate: Optional[float] = None, param_dtype: Optional[str] = None,
                   remat_policy: Optional[str] = None) -> T5Config:
  """The named configuration, e.g. "t5_1_1_lm100k_base", "t5_large", "t5_1_1_tiny".

  Args:
    name: a key of `CONFIGS`.
    dtype: override the activation dtype ("float32", "bfloat16").
    dropout_rate: override the dropout rate.
    param_dtype: the frozen weights' dtype (gin FROZEN_DTYPE; None: float32).
    remat_policy: per-layer rematerialisation (gin REMAT; None: "none").

  Raises:
    ValueError: for an unknown name, listing close matches and every valid name.
  """
  try:
    config = CONFIGS[name]
  except KeyError:
    close = validate.close_names(name, list(CONFIGS))
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ConfigError(f"unknown T5 config {name!r}{hint}; valid names: "
                      f"{', '.join(sorted(CONFIGS))}") from None
  memory.check_dtype(param_dtype, "param_dtype")
  if remat_policy is not None:
    memory.check_remat(remat_policy, "remat_policy")
  changes = {k: v for k, v in (("dtype", dtype), ("dropout_rate", dropout_rate),
                               ("param_dtype", param_dtype), ("remat_policy", remat_policy))
             if v is not None}
  return config.replace(**changes) if changes else config
