"""P-tuning v2 (Liu et al. 2022) as deep prompt tokens: a fresh prompt at every layer's input.

What it computes in spot-jax: layer l of each chosen stack gets its own prompt P_l [L, E]. The
prompt is placed in front of that layer's input, goes through the layer's frozen
pre-attention layer norm and key/value projections, and is attended to by every input
position (placed just before the sequence for the relative-position bias, visible to all
queries, as prefixes are; see `spot_jax.backbones.t5.prefixes`). Its own outputs are discarded: the
next layer sees a fresh P_{l+1}, and the decoder's cross-attention sees only the input's
positions. Equivalently, layer l gets key/value prefixes

  K_l = RMSNorm_l(P_l) W_k^l,   V_l = RMSNorm_l(P_l) W_v^l

with the frozen layer's own norm and kernels, which is how the network computes it (no query,
MLP or output projection is spent on prompt positions).

How it differs from prefix tuning (`prefix_tuning`): prefix tuning learns the keys and values
themselves, 2 H D numbers per position and layer, in any direction of key/value space; P-tuning
v2 here learns one E-vector per position and layer and reaches keys and values only through the
frozen projections (E numbers instead of 2 H D, tied to the backbone). The two coincide on what
the attention sees, so `fold` turns a trained P-tuning v2 prompt into plain prefix-tuning
prefixes for serving (it needs the frozen weights). THUDM's P-tuning v2 code for NLU models
learns past key values directly, i.e. prefix tuning on the encoder without the MLP:
`PrefixTuning(length, attention=("encoder",))` is that variant.

`stacks` chooses the encoder's self-attention (default, the paper's NLU setting) and/or the
decoder's self-attention. On a decoder-only backbone (Llama, Gemma) it is the decoder's: layer l
makes its prefixes of P_l with its own pre-attention RMSNorm, key/value projections, key norm
(Gemma 3) and RoPE at positions 0..L-1, before the sequence's positions L, L+1, ...
(`DecoderLM.deep_prefixes`).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import common, deep, initializers
from spot_jax.prompts.prefix_tuning import PrefixTuning, decoder_only
from spot_jax.backbones.t5 import prefixes as prefixes_lib
from spot_jax.backbones.t5.config import T5Config

Array = jax.Array

STACKS = ("encoder", "decoder")


def check_decoder_stacks(stacks: tuple[str, ...]) -> None:
  """Refuses, in one line, stacks a decoder-only model does not have."""
  if tuple(stacks) != ("decoder",):
    raise ConfigError(f"PTuningV2.stacks={tuple(stacks)!r}: a decoder-only model has only the "
                      f"decoder's self-attention; set stacks=('decoder',) (DEEP_STACKS)")


class PTuningV2(nn.Module):
  """Deep prompt tokens: one prompt [L, E] per layer of the chosen stacks (the deep hook).

  Parameters (under the backbone's `prompt/` subtree):
    encoder_tokens [encoder layers, L, E] and/or decoder_tokens [decoder layers, L, E]
    float32, axes ("prompts", "prompt", "prompt_embed").

  Attributes:
    length: L, the prompt tokens per layer.
    stacks: "encoder" and/or "decoder".
    prompt_init: initialiser of each stack's [layers, L, E] tokens (rows filled as layers * L
      rows; the layer norm makes the scale irrelevant to the forward pass).
    dtype: optional activation dtype; must equal the backbone's (None follows it).
  """
  length: int
  stacks: tuple[str, ...] = ("encoder",)
  prompt_init: initializers.Initializer = initializers.sampled_vocab()
  dtype: Optional[Any] = None

  def __post_init__(self):
    validate.positive_int(self.length, "PTuningV2.length", example=10)
    stacks = (self.stacks,) if isinstance(self.stacks, str) else tuple(self.stacks)
    if not stacks or any(s not in STACKS for s in stacks) or len(set(stacks)) != len(stacks):
      raise ConfigError(f"PTuningV2.stacks={self.stacks!r}; give distinct names from "
                        f"{', '.join(STACKS)}")
    object.__setattr__(self, "stacks", tuple(s for s in STACKS if s in stacks))
    super().__post_init__()

  @nn.compact
  def layer_prompts(self, config: T5Config, *, embedding: Array, deterministic: bool
                    ) -> prefixes_lib.DeepPrompt:
    """The per-layer prompt tokens (batch axis 1) of the chosen stacks."""
    del deterministic
    if self.dtype is not None and jnp.dtype(self.dtype) != jnp.dtype(config.activation_dtype):
      raise ConfigError(f"PTuningV2.dtype={jnp.dtype(self.dtype).name} but the backbone runs in "
                        f"{jnp.dtype(config.activation_dtype).name}; leave dtype unset")
    if decoder_only(config):  # the network makes each layer's prefixes of its tokens
      check_decoder_stacks(self.stacks)
      return common.prompt_param(self, "decoder_tokens", self.prompt_init,
                                 (config.num_layers, self.length, config.emb_dim),
                                 ("prompts", "prompt", "prompt_embed"), embedding)
    out = {}
    for stack in self.stacks:
      layers = config.num_encoder_layers if stack == "encoder" else config.num_decoder_layers
      tokens = common.prompt_param(self, f"{stack}_tokens", self.prompt_init,
                                   (layers, self.length, config.emb_dim),
                                   ("prompts", "prompt", "prompt_embed"), embedding)
      out[stack] = prefixes_lib.Prefix(tokens=tokens.astype(config.activation_dtype)[None])
    return prefixes_lib.DeepPrompt(**out)

  def _tokens(self, params: Any) -> dict[str, np.ndarray]:
    params = common.unboxed_numpy(params)
    missing = [f"{s}_tokens" for s in self.stacks if f"{s}_tokens" not in params]
    if missing:
      raise ConfigError(f"PTuningV2: the parameter subtree lacks {missing}; pass the `prompt` "
                        f"subtree of a PTuningV2 model")
    return {f"{s}_tokens": np.asarray(params[f"{s}_tokens"], np.float32) for s in self.stacks}

  def export_prompt(self, params: Any, config: Optional[T5Config] = None) -> np.ndarray:
    """The exported record (see `deep`): the tokens of each stack, [layers, L, E]."""
    del config  # the tokens' shapes say everything
    return deep.to_record(self._tokens(params))

  def fold(self, params: Any, backbone: Mapping[str, Any], config: T5Config
           ) -> dict[str, Array]:
    """The parameters of `folded_module()` (plain prefixes) computing the same model.

    Args:
      params: this module's parameter subtree.
      backbone: the frozen parameters the prompt was trained with (unboxed).
      config: the model configuration.
    """
    parts = {s: deep.fold_tokens(t, backbone, config, s)
             for s, t in ((k[:-len("_tokens")], v) for k, v in self._tokens(params).items())}
    # PrefixTuning's "separate" layout: per stack, layer 0's key slot, its value slot, layer 1...
    flat = np.concatenate([np.moveaxis(parts[s], 2, 0).reshape(self.length, -1)
                           for s in self.stacks], axis=1)
    return {"prefix": jnp.asarray(flat)}

  def folded_module(self) -> PrefixTuning:
    """The plain PrefixTuning of the same attention types (with `fold`, the same model)."""
    return PrefixTuning(self.length, attention=self.stacks, layout="separate", dtype=self.dtype,
                        parent=None)
