"""SMoP (Choi et al. 2023): k short prompts and a router that picks one per example.

The router is a bias-free linear map R^E -> R^k applied to the mean embedding of each input's
real tokens. In training its logits are perturbed multiplicatively, logits * (1 + delta) with
delta ~ N(0, sigma^2), which spreads the load over the prompts. Each example then gets the
prompt of highest probability p, scaled by p, so the encoder sees l prompt tokens (not k*l) and
the router learns through the scale.

Routing variants (`routing`):
  "linear":     the method above (set perturbation_std=0 for the no-perturbation ablation).
  "top2":       p1 * P_i1 + p2 * P_i2 over the two most probable prompts.
  "gumbel":     straight-through Gumbel-softmax: the forward pass uses the hard sample (weight
                1), gradients flow through softmax((logits + g) / temperature); argmax at eval.
  "stochastic": a uniformly random prompt per example in training, the mean prompt at eval
                (no router).
  "single":     one prompt (k must be 1), no router: Prompt Tuning of length l.

Sown each call: intermediates/router_load [k] (examples per prompt, summing to the batch
size) and intermediates/router_entropy (mean routing entropy in nats), so collapse shows; and
aux_loss/load_balancing (Switch Transformer's k * sum_i f_i * P_i times
`load_balancing_weight`, f_i the fraction of examples sent to prompt i and P_i its mean
probability) when the weight is positive. Without a router ("stochastic", "single") the
entropy is that of the uniform choice (log k) and, for the mean prompt at evaluation, each
prompt's load is B / k.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import common, initializers, placement as placement_lib

Array = jax.Array

ROUTINGS = ("linear", "top2", "gumbel", "stochastic", "single")
_ROUTED = ("linear", "top2", "gumbel")


class SMoP(nn.Module):
  """Sparse mixture of k prompts of length l, routed per example.

  Parameters (under the backbone's `prompt/` subtree):
    prompts [k, l, E] float32, axes ("prompts", "prompt", "prompt_embed");
    router/kernel [E, k] float32, axes ("prompt_embed", "prompts"), no bias (only for the
      routed variants "linear", "top2", "gumbel").

  Attributes:
    num_prompts: k (>= 1).
    length: l, tokens per prompt (>= 1).
    routing: one of ROUTINGS (see the module docstring).
    perturbation_std: sigma of the training-time router perturbation (>= 0; 0 disables it).
    gumbel_temperature: temperature of the Gumbel-softmax (> 0).
    load_balancing_weight: weight of the Switch-style load-balancing loss (>= 0).
    prompt_init: initialiser of the [k, l, E] prompts (rows are filled as k*l rows).
    router_init: Flax initialiser of the [E, k] router kernel.
    placement: "prefix", "after_bos" or "suffix".
    dtype: optional activation dtype; must equal the backbone's (None follows it).
  """
  num_prompts: int = 4
  length: int = 5
  routing: str = "linear"
  perturbation_std: float = 1.0
  gumbel_temperature: float = 1.0
  load_balancing_weight: float = 0.0
  prompt_init: initializers.Initializer = initializers.sampled_vocab()
  router_init: Callable[..., Array] = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
  placement: str = "prefix"
  dtype: Optional[Any] = None

  def __post_init__(self):
    k = validate.positive_int(self.num_prompts, "SMoP.num_prompts")
    validate.positive_int(self.length, "SMoP.length")
    validate.one_of(self.placement, "SMoP.placement", placement_lib.PLACEMENTS)
    validate.one_of(self.routing, "SMoP.routing", ROUTINGS)
    if self.routing == "top2" and k < 2:
      raise ConfigError(f"SMoP.routing='top2' needs num_prompts >= 2, got {k}")
    if self.routing == "single" and k != 1:
      raise ConfigError(f"SMoP.routing='single' needs num_prompts == 1, got {k}")
    validate.non_negative(self.perturbation_std, "SMoP.perturbation_std")
    validate.positive(self.gumbel_temperature, "SMoP.gumbel_temperature")
    validate.non_negative(self.load_balancing_weight, "SMoP.load_balancing_weight")
    if self.load_balancing_weight > 0 and self.routing not in _ROUTED:
      raise ConfigError(f"SMoP.load_balancing_weight needs a learned router; routing="
                        f"{self.routing!r} has none (use one of {', '.join(_ROUTED)})")
    super().__post_init__()

  @nn.compact
  def __call__(self, embedded: Array, tokens: Array, *, embedding: Array, deterministic: bool,
               valid: Optional[Array] = None) -> tuple[Array, Array]:
    """embedded [B, T, E], tokens [B, T], valid [B, T] bool (None: tokens > 0)
    -> (x [B, l + T, E], valid [B, l + T])."""
    common.check_dtype(self.dtype, embedded, "SMoP")
    k, batch = self.num_prompts, embedded.shape[0]
    prompts = common.prompt_param(self, "prompts", self.prompt_init,
                                  (k, self.length, embedded.shape[-1]),
                                  ("prompts", "prompt", "prompt_embed"), embedding)
    prompts = self.reparameterize(prompts, deterministic)
    valid = common.validity(tokens, valid)
    if self.routing in _ROUTED:
      weights, choice, probs = self._route(common.mean_embedding(embedded, valid), deterministic)
      load = jnp.sum(jax.nn.one_hot(choice, k, dtype=jnp.float32), axis=0)
    elif self.routing == "stochastic" and not deterministic:
      choice = jax.random.randint(self.make_rng("dropout"), (batch,), 0, k)
      weights = jax.nn.one_hot(choice, k, dtype=jnp.float32)
      probs = jnp.full((batch, k), 1.0 / k, jnp.float32)
      load = jnp.sum(weights, axis=0)
    else:  # stochastic at evaluation (the mean prompt), or a single prompt
      weights = probs = jnp.full((batch, k), 1.0 / k, jnp.float32)
      load = jnp.full((k,), batch / k, jnp.float32)
    entropy = jnp.mean(-jnp.sum(probs * jnp.log(jnp.maximum(probs, 1e-30)), axis=-1))
    self.sow("intermediates", "router_load", load)
    self.sow("intermediates", "router_entropy", entropy)
    if self.load_balancing_weight > 0:
      fraction, mean_prob = load / batch, jnp.mean(probs, axis=0)
      self.sow("aux_loss", "load_balancing",
               self.load_balancing_weight * k * jnp.sum(fraction * mean_prob))
    prompt = jnp.einsum("bk,kle->ble", weights, prompts)
    return placement_lib.combine(prompt, embedded, valid, self.placement)

  def reparameterize(self, prompts: Array, deterministic: bool) -> Array:
    """The prompts the router mixes, from the parameter [k, l, E]: itself (subclasses add maps)."""
    del deterministic
    return prompts

  def _route(self, features: Array, deterministic: bool) -> tuple[Array, Array, Array]:
    """features [B, E] float32 -> (weights [B, k], primary choice [B], probs [B, k])."""
    k = self.num_prompts
    router = nn.Dense(k, use_bias=False, dtype=jnp.float32, param_dtype=jnp.float32,
                      kernel_init=nn.with_logical_partitioning(self.router_init,
                                                               ("prompt_embed", "prompts")),
                      name="router")
    logits = router(features)
    if not deterministic and self.perturbation_std > 0:
      delta = self.perturbation_std * jax.random.normal(self.make_rng("dropout"), logits.shape)
      logits = logits * (1.0 + delta)
    probs = jax.nn.softmax(logits, axis=-1)
    if self.routing == "linear":
      choice = jnp.argmax(probs, axis=-1)
      weights = jax.nn.one_hot(choice, k, dtype=jnp.float32) * probs
    elif self.routing == "top2":
      top_p, top_i = jax.lax.top_k(probs, 2)
      weights = jnp.sum(jax.nn.one_hot(top_i, k, dtype=jnp.float32) * top_p[..., None], axis=1)
      choice = top_i[:, 0]
    elif deterministic:  # gumbel at evaluation: the most probable prompt, weight 1
      choice = jnp.argmax(logits, axis=-1)
      weights = jax.nn.one_hot(choice, k, dtype=jnp.float32)
    else:
      noise = jax.random.gumbel(self.make_rng("dropout"), logits.shape)
      soft = jax.nn.softmax((logits + noise) / self.gumbel_temperature, axis=-1)
      choice = jnp.argmax(soft, axis=-1)
      hard = jax.nn.one_hot(choice, k, dtype=jnp.float32)
      weights = hard + soft - jax.lax.stop_gradient(soft)
    return weights, choice, probs

  def export_prompt(self, params: Any) -> np.ndarray:
    """The [k, l, E] float32 prompts (the router is not part of the export)."""
    return common.unboxed_numpy(params)["prompts"].astype(np.float32)
