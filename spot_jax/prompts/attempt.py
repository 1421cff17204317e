"""ATTEMPT (Asai et al. 2022): a target prompt plus a per-input attentional mixture of prompts.

Frozen source prompts P_1..P_S [m, E] (SPoT library entries) and a trainable target prompt
P_t [m, E]. For an input X [T, E] (its embedded real tokens):

    x   = maxpool_T(X)                                   [E]
    h   = LayerNorm(W_up^T SiLU(W_down^T x))             [E]   W_down [E, r], W_up [r, E]
    a_j = softmax_j(maxpool_m(P_j) . h / T)              over j in [P_1..P_S, P_t]
    P   = P_t + sum_j a_j P_j                            [m, E]

and P is combined with the input like any prompt. T defaults to E * e (the paper's code: 2087
for T5-Base). The input is max-pooled over real tokens only: padding never enters, so a row's
prompt is the same however the batch is padded (the paper's code pools over padded positions).

Multi-task variant (the paper's, `num_targets` = K > 1): one target prompt per task, one shared
attention network and the same sources; each example uses its own task's target (the model's
`task_index` feature; rows without it use `default_task`), both as the attention's last
candidate and as the base it is added to.

Source prompts are module constants (`common.Constant`), never parameters: they get no gradient,
no optimizer state and are not saved in the training state; under jit they are compile-time
constants of each program, S * m * E * 4 bytes (6 sources of 100 x 768: 1.8 MB; of 100 x 4096:
9.8 MB). The export is the stack of candidates [S + K, m, E] (sources, then targets), which the
serving table reads together with the attention network from the training state.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import common, initializers

Array = jax.Array
LAYER_NORM_EPSILON = 1e-5  # PyTorch's nn.LayerNorm default, as in the paper's code


def default_temperature(embed: int) -> float:
  """The paper's softmax temperature, E * e."""
  return float(embed) * math.e


def attention_query(pooled: Array, down: Array, up: Array, scale: Array, bias: Array) -> Array:
  """pooled [B, E] -> h [B, E] = LayerNorm(SiLU(pooled W_down) W_up) (float32).

  The network is one ([E, r], [r, E], [E], [E]) or one per row ([B, E, r], [B, r, E], [B, E]...).
  """
  hp = jax.lax.Precision.HIGHEST
  hidden = nn.silu(jnp.einsum("...e,...er->...r", pooled, down, precision=hp))
  y = jnp.einsum("...r,...re->...e", hidden, up, precision=hp)
  mean = jnp.mean(y, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(y - mean), axis=-1, keepdims=True)
  return (y - mean) * jax.lax.rsqrt(var + LAYER_NORM_EPSILON) * scale + bias


class Attempt(common.TaskIndexed):
  """ATTEMPT's input-dependent mixture of frozen source prompts and trainable target prompts.

  Parameters (under the backbone's `prompt/` subtree):
    prompts [K, m, E] float32, axes ("prompts", "prompt", "prompt_embed"): the target prompts;
    attention/down_kernel [E, r] ("prompt_embed", "prompt_mlp"), attention/up_kernel [r, E]
      ("prompt_mlp", "prompt_embed"), attention/layer_norm_scale and layer_norm_bias [E]
      ("prompt_embed",). Trainable count: K*m*E + 2*E*r + 2*E.

  Attributes:
    source_prompts: [S, m, E] frozen source prompts (an array or `common.Constant`; S >= 1).
    num_targets: K, target prompts (1: single-task ATTEMPT; > 1: the multi-task variant).
    bottleneck: r, the attention network's width (100 in the paper's code).
    temperature: softmax temperature T; None uses E * e.
    prompt_init: initialiser of the [K, m, E] targets; None starts every target as the first
      source prompt (the paper's code).
    and, by keyword, `common.TaskIndexed`'s: default_task (the target of rows without a task
      index), placement, dtype.
  """
  source_prompts: Any
  num_targets: int = 1
  bottleneck: int = 100
  temperature: Optional[float] = None
  prompt_init: Optional[initializers.Initializer] = None

  def __post_init__(self):
    sources = common.Constant(self.source_prompts)
    if sources.value.ndim != 3 or 0 in sources.shape:
      raise ConfigError(f"Attempt.source_prompts has shape {sources.shape}; give S >= 1 source "
                        f"prompts as [S, m, E] (e.g. spot_jax.spot.sources.library_prompts)")
    if not np.all(np.isfinite(sources.value)):
      raise ConfigError("Attempt.source_prompts hold NaN or infinite values; give finite prompts")
    object.__setattr__(self, "source_prompts", sources)
    k = validate.positive_int(self.num_targets, "Attempt.num_targets")
    validate.positive_int(self.bottleneck, "Attempt.bottleneck")
    self.check_task_settings(k, "Attempt")
    if self.temperature is not None:
      validate.positive(self.temperature, "Attempt.temperature", note="None: E * e, the paper's")
    super().__post_init__()

  @property
  def length(self) -> int:
    """m, the prompt tokens the encoder sees."""
    return int(self.source_prompts.shape[1])

  @property
  def num_sources(self) -> int:
    return int(self.source_prompts.shape[0])

  def resolved_temperature(self) -> float:
    embed = int(self.source_prompts.shape[2])
    return default_temperature(embed) if self.temperature is None else float(self.temperature)

  def _targets_init(self) -> initializers.Initializer:
    if self.prompt_init is not None:
      return self.prompt_init
    first = self.source_prompts.value[0]
    return lambda rng, shape, embedding: jnp.broadcast_to(jnp.asarray(first), shape)

  def row_prompts(self, embedded: Array, valid: Array, task_index: Array,
                  embedding: Array) -> Array:
    """Each row's mixture of the sources and its target prompt: [B, m, E]."""
    sources = self.source_prompts.value
    embed = embedded.shape[-1]
    if sources.shape[2] != embed:
      raise ConfigError(f"Attempt.source_prompts have width {sources.shape[2]} but the backbone's "
                        f"is {embed}; give source prompts trained on this model")
    k, m, r = self.num_targets, self.length, self.bottleneck
    targets = common.prompt_param(self, "prompts", self._targets_init(), (k, m, embed),
                                  ("prompts", "prompt", "prompt_embed"), embedding)
    net = AttentionNetwork(r, name="attention")
    down, up, scale, bias = net(embed)
    target = jnp.asarray(targets)[task_index]  # [B, m, E]; parameters may come in as NumPy
    weights = mixture_weights(common.max_pool(embedded, valid), jnp.asarray(sources), target,
                              down, up, scale, bias, self.resolved_temperature())
    self.sow("intermediates", "attention_weights", jnp.mean(weights, axis=0))
    self.sow("intermediates", "attention_entropy", jnp.mean(
        -jnp.sum(weights * jnp.log(jnp.maximum(weights, 1e-30)), axis=-1)))
    return mix(weights, jnp.asarray(sources), target)

  def export_prompt(self, params: Any) -> np.ndarray:
    """The candidates [S + K, m, E] float32: the sources, then the target prompts."""
    targets = common.unboxed_numpy(params)["prompts"].astype(np.float32)
    return np.concatenate([self.source_prompts.value, targets], axis=0)


class AttentionNetwork(nn.Module):
  """ATTEMPT's attention parameters (down/up projections without bias, a LayerNorm).

  Attributes:
    bottleneck: r.
  """
  bottleneck: int

  @nn.compact
  def __call__(self, embed: int) -> tuple[Array, Array, Array, Array]:
    """-> (down [E, r], up [r, E], layer-norm scale [E], bias [E]), float32."""
    r = self.bottleneck

    def param(name, init, shape, axes):
      return self.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)

    down = param("down_kernel", common.torch_linear_init(embed), (embed, r),
                 ("prompt_embed", "prompt_mlp"))
    up = param("up_kernel", common.torch_linear_init(r), (r, embed), ("prompt_mlp", "prompt_embed"))
    scale = param("layer_norm_scale", nn.initializers.ones, (embed,), ("prompt_embed",))
    bias = param("layer_norm_bias", nn.initializers.zeros, (embed,), ("prompt_embed",))
    return down, up, scale, bias


def mixture_weights(pooled: Array, sources: Array, target: Array, down: Array, up: Array,
                    scale: Array, bias: Array, temperature: float) -> Array:
  """Attention [B, S + 1] over [sources..., the row's target] (float32).

  Args:
    pooled: [B, E] max-pooled inputs; sources: [S, m, E]; target: [B, m, E] each row's target;
    down, up, scale, bias: the attention network; temperature: T.
  """
  hp = jax.lax.Precision.HIGHEST
  h = attention_query(pooled, down, up, scale, bias)  # [B, E]
  source_keys = jnp.max(sources.astype(jnp.float32), axis=1)  # [S, E]
  target_keys = jnp.max(target.astype(jnp.float32), axis=1)  # [B, E]
  scores = jnp.concatenate([jnp.dot(h, source_keys.T, precision=hp),
                            jnp.sum(h * target_keys, axis=-1, keepdims=True)], axis=-1)
  return jax.nn.softmax(scores / temperature, axis=-1)


def mix(weights: Array, sources: Array, target: Array) -> Array:
  """P = P_t + sum_j a_j P_j: weights [B, S + 1], sources [S, m, E],
  target [B, m, E] -> [B, m, E]."""
  num = sources.shape[0]
  from_sources = jnp.einsum("bs,sme->bme", weights[:, :num], sources.astype(jnp.float32),
                            precision=jax.lax.Precision.HIGHEST)
  return target * (1.0 + weights[:, num:, None]) + from_sources
