"""Residual SMoP: SMoP's k short prompts, each reparameterised as in Residual Prompt Tuning.

    P'_{j,i} = LayerNorm(W_up act(W_down P_{j,i} + b_down) + b_up) + P_{j,i}

for prompt j = 1..k and token i = 1..l, with one MLP shared by all k prompts
(`shared_mlp=True`, the default) or one MLP per prompt (`shared_mlp=False`, kernels with a
leading "prompts" axis); within a prompt the MLP is shared by its tokens, as in the Residual
paper's default. The router then mixes the P' exactly as SMoP mixes its prompts (see `smop`).
After training, `fold` computes the P' once: the result is a plain `SMoP` (prompts P' and the
same router), which is what a run exports and what serving loads.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np

from spot_jax.prompts import residual
from spot_jax.prompts.residual import ResidualMlp
from spot_jax.prompts.smop import SMoP

Array = jax.Array


class ResidualSMoP(SMoP, residual.MlpSettings):
  """SMoP (every attribute of `SMoP`) whose k prompts pass through a residual MLP.

  Parameters (under the backbone's `prompt/` subtree): SMoP's `prompts [k, l, E]` and
  `router/kernel [E, k]`, plus `mlp/...` (ResidualMlp's; with `shared_mlp=False` every kernel
  has a leading "prompts" axis of size k).

  Attributes: SMoP's, and `residual.MlpSettings`'s by keyword (`shared_mlp`: one MLP for all k
  prompts, or one per prompt).
  """

  def __post_init__(self):
    residual.check_mlp_settings(self, "ResidualSMoP")
    super().__post_init__()

  def _mlp(self, **kwargs: Any) -> nn.Module:
    """One ResidualMlp (shared by all k*l tokens) or k of them (vmapped over the prompts)."""
    settings = (self.bottleneck, self.activation, self.dropout, True, self.skip,
                self.layer_norm_epsilon)
    if self.shared_mlp:
      return ResidualMlp(*settings, **kwargs)
    per_prompt = nn.vmap(ResidualMlp, in_axes=(0, None), out_axes=0,
                         variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                         metadata_params={nn.PARTITION_NAME: "prompts"})
    return per_prompt(*settings, **kwargs)

  def _run_mlp(self, mlp: Callable[[Array, bool], Array], prompts: Array,
               deterministic: bool) -> Array:
    """[k, l, E] -> P' [k, l, E]; the shared MLP sees the k*l tokens as one [k*l, E] prompt."""
    if self.shared_mlp:
      return mlp(prompts.reshape(-1, prompts.shape[-1]), deterministic).reshape(prompts.shape)
    return mlp(prompts, deterministic)

  def reparameterize(self, prompts: Array, deterministic: bool) -> Array:
    """[k, l, E] -> P' [k, l, E] float32."""
    return self._run_mlp(self._mlp(name="mlp"), prompts, deterministic)

  def fold(self, params: Any) -> dict[str, Any]:
    """The parameters of the equivalent `folded_module()`: {"prompts": P' [k, l, E], "router"}.

    Args:
      params: this module's parameter subtree ({"prompts", "mlp", ["router"]}), boxed or not.
    """
    params, prompts = residual.fold_inputs(params, "prompts", "ResidualSMoP")
    mlp = self._mlp(parent=None)
    folded = self._run_mlp(lambda p, d: mlp.apply({"params": params["mlp"]}, p, d), prompts, True)
    return {k: v for k, v in params.items() if k != "mlp"} | {"prompts": folded}

  def folded_module(self) -> SMoP:
    """The plain SMoP that, with `fold(params)`, computes the same outputs."""
    fields = ("num_prompts", "length", "routing", "perturbation_std", "gumbel_temperature",
              "load_balancing_weight", "prompt_init", "router_init", "placement", "dtype")
    # parent=None: a free-standing module, not a child of this one.
    return SMoP(**{f: getattr(self, f) for f in fields}, parent=None)

  def export_prompt(self, params: Any) -> np.ndarray:
    """The folded prompts P' [k, l, E] float32 (the router stays in the training state)."""
    return np.asarray(self.fold(params)["prompts"], np.float32)

