"""Residual Prompt Tuning (Razdaibiedina et al. 2023): a prompt reparameterised by an MLP.

    P'_i = LayerNorm(W_up act(W_down P_i + b_down) + b_up) + P_i

with optional dropout after the up-projection (before the LayerNorm), as in the paper's
reference code, and a full LayerNorm (scale and bias). One MLP is shared by all prompt tokens
by default; `shared_mlp=False` gives every token its own MLP (kernels with a leading "prompt"
axis); `skip=False` drops the "+ P_i" for the ablation. After training, `fold` computes P' once
and the MLP is discarded: the folded prompt is what is exported and served.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import common, initializers, placement as placement_lib
from spot_jax.prompts.prompt_tuning import PromptTuning

Array = jax.Array

ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": nn.relu,
    "tanh": jnp.tanh,
    "sigmoid": nn.sigmoid,
    "gelu": nn.gelu,
    "silu": nn.silu,
}


def check_mlp_settings(module: Any, owner: str) -> None:
  """The reparameterisation MLP's settings of a module (`owner` names it in the errors)."""
  validate.positive_int(module.bottleneck, f"{owner}.bottleneck")
  validate.one_of(module.activation, f"{owner}.activation", tuple(ACTIVATIONS))
  validate.fraction(module.dropout, f"{owner}.dropout", low_closed=True)
  validate.positive(module.layer_norm_epsilon, f"{owner}.layer_norm_epsilon")


def _torch_linear_init(fan_in: int) -> Callable[..., Array]:
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's nn.Linear default, as in the paper's code."""
  bound = 1.0 / np.sqrt(fan_in)
  return lambda rng, shape, dtype=jnp.float32: jax.random.uniform(rng, shape, dtype, -bound, bound)


class ResidualMlp(nn.Module):
  """The reparameterisation network applied to a prompt [L, E].

  Parameters (axes in parentheses; per-token kernels add a leading "prompt" axis of size L):
    down_kernel [E, m] ("prompt_embed", "prompt_mlp"), down_bias [m] ("prompt_mlp",),
    up_kernel [m, E] ("prompt_mlp", "prompt_embed"), up_bias [E] ("prompt_embed",),
    layer_norm_scale [E], layer_norm_bias [E] ("prompt_embed",).

  Attributes:
    bottleneck: m, the hidden width.
    activation: a name in ACTIVATIONS.
    dropout: dropout rate after the up-projection (training only).
    shared_mlp: one MLP for all tokens (True) or one per token (False).
    skip: add the input prompt back (the residual connection).
    layer_norm_epsilon: LayerNorm epsilon (PyTorch's default 1e-5).
  """
  bottleneck: int
  activation: str = "relu"
  dropout: float = 0.0
  shared_mlp: bool = True
  skip: bool = True
  layer_norm_epsilon: float = 1e-5

  @nn.compact
  def __call__(self, prompt: Array, deterministic: bool) -> Array:
    """prompt [L, E] float32 -> P' [L, E] float32."""
    length, embed = prompt.shape
    m = self.bottleneck
    lead, lead_axes = ((), ()) if self.shared_mlp else ((length,), ("prompt",))

    def param(name, init, shape, axes):
      return self.param(name, nn.with_logical_partitioning(init, lead_axes + axes),
                        lead + shape, jnp.float32)

    down_k = param("down_kernel", _torch_linear_init(embed), (embed, m),
                   ("prompt_embed", "prompt_mlp"))
    down_b = param("down_bias", _torch_linear_init(embed), (m,), ("prompt_mlp",))
    up_k = param("up_kernel", _torch_linear_init(m), (m, embed), ("prompt_mlp", "prompt_embed"))
    up_b = param("up_bias", _torch_linear_init(m), (embed,), ("prompt_embed",))
    ln_scale = param("layer_norm_scale", nn.initializers.ones, (embed,), ("prompt_embed",))
    ln_bias = param("layer_norm_bias", nn.initializers.zeros, (embed,), ("prompt_embed",))

    hp = jax.lax.Precision.HIGHEST
    if self.shared_mlp:
      hidden = jnp.dot(prompt, down_k, precision=hp) + down_b
      hidden = ACTIVATIONS[self.activation](hidden)
      y = jnp.dot(hidden, up_k, precision=hp) + up_b
    else:
      hidden = jnp.einsum("le,lem->lm", prompt, down_k, precision=hp) + down_b
      hidden = ACTIVATIONS[self.activation](hidden)
      y = jnp.einsum("lm,lme->le", hidden, up_k, precision=hp) + up_b
    y = nn.Dropout(self.dropout)(y, deterministic=deterministic)
    mean = jnp.mean(y, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=-1, keepdims=True)
    y = (y - mean) * jax.lax.rsqrt(var + self.layer_norm_epsilon) * ln_scale + ln_bias
    return y + prompt if self.skip else y


def fold_inputs(params: Any, key: str, owner: str) -> tuple[dict, Array]:
  """A fold's parameter subtree unboxed, and its `key` array (the prompt or prompts) in float32;
  a ConfigError naming what is missing when the subtree lacks it or the MLP."""
  params = nn.meta.unbox(params)
  missing = {key, "mlp"} - set(params)
  if missing:
    raise ConfigError(f"{owner}.fold: the parameter subtree lacks {sorted(missing)}; pass the "
                      f"`prompt` subtree of a {owner} model")
  return params, jnp.asarray(params[key], jnp.float32)


class MlpSettings(nn.Module):
  """The reparameterisation MLP's settings, keyword-only, for the modules that run one
  (`ResidualPrompt`, `ResidualSMoP`); checked by `check_mlp_settings`.

  Attributes:
    bottleneck: m, the MLP's hidden width.
    activation: a name in ACTIVATIONS ("relu" in the paper).
    dropout: dropout rate inside the MLP, in [0, 1) (training only).
    shared_mlp: one MLP for all tokens (prompts) or one per token (prompt).
    skip: keep the residual connection (False is the paper's no-skip ablation).
    layer_norm_epsilon: LayerNorm epsilon.
  """
  _: dataclasses.KW_ONLY
  bottleneck: int = 400
  activation: str = "relu"
  dropout: float = 0.0
  shared_mlp: bool = True
  skip: bool = True
  layer_norm_epsilon: float = 1e-5


class ResidualPrompt(MlpSettings):
  """A prompt P [L, E] reparameterised as P' = LayerNorm(MLP(P)) + P, then combined.

  Parameters (under the backbone's `prompt/` subtree):
    prompt [L, E] float32, axes ("prompt", "prompt_embed"); mlp/... (see ResidualMlp).

  Attributes (and `MlpSettings`'s, by keyword: the paper's T5-Base runs used bottlenecks of a
  few hundred, its reference code defaults to 800; `shared_mlp=False`: one MLP per token):
    length: L (>= 1).
    prompt_init: initialiser of P (the paper's code samples vocabulary rows).
    placement: "prefix", "after_bos" or "suffix".
    dtype: optional activation dtype; must equal the backbone's (None follows it).
  """
  length: int
  prompt_init: initializers.Initializer = initializers.sampled_vocab()
  placement: str = "prefix"
  dtype: Optional[Any] = None

  def __post_init__(self):
    validate.positive_int(self.length, "ResidualPrompt.length")
    validate.one_of(self.placement, "ResidualPrompt.placement", placement_lib.PLACEMENTS)
    check_mlp_settings(self, "ResidualPrompt")
    super().__post_init__()

  def _mlp(self, **kwargs: Any) -> ResidualMlp:
    return ResidualMlp(self.bottleneck, self.activation, self.dropout, self.shared_mlp,
                       self.skip, self.layer_norm_epsilon, **kwargs)

  @nn.compact
  def __call__(self, embedded: Array, tokens: Array, *, embedding: Array, deterministic: bool,
               valid: Optional[Array] = None) -> tuple[Array, Array]:
    """embedded [B, T, E], tokens [B, T], valid [B, T] bool (None: tokens > 0)
    -> (x [B, L + T, E], valid [B, L + T])."""
    common.check_dtype(self.dtype, embedded, "ResidualPrompt")
    prompt = common.prompt_param(self, "prompt", self.prompt_init,
                                 (self.length, embedded.shape[-1]), ("prompt", "prompt_embed"),
                                 embedding)
    effective = self._mlp(name="mlp")(prompt, deterministic)
    valid = common.validity(tokens, valid)
    return placement_lib.combine(effective, embedded, valid, self.placement)

  def fold(self, params: Any) -> dict[str, Array]:
    """The parameters of the equivalent `folded_module()`: {"prompt": P' [L, E]}.

    Args:
      params: this module's parameter subtree ({"prompt": ..., "mlp": {...}}), boxed or not.
    """
    params, prompt = fold_inputs(params, "prompt", "ResidualPrompt")
    folded = self._mlp(parent=None).apply({"params": params["mlp"]}, prompt, True)
    return {"prompt": folded}

  def folded_module(self) -> PromptTuning:
    """The PromptTuning module that, with `fold(params)`, computes the same outputs."""
    # parent=None: a free-standing module, not a child of this one.
    return PromptTuning(self.length, prompt_init=self.prompt_init, placement=self.placement,
                        dtype=self.dtype, parent=None)

  def export_prompt(self, params: Any) -> np.ndarray:
    """The folded prompt P' [L, E] float32."""
    return np.asarray(self.fold(params)["prompt"], np.float32)
