"""Soft-prompt methods for a frozen T5: Prompt Tuning, SMoP, Residual Prompt Tuning and their
successors: the deep prompts (prefix tuning, P-tuning v2), DePT, Residual SMoP, ATTEMPT, MPT
and ULPT.

Each method is a Flax module for the backbone's input hook (`Transformer(config, prompt=...)`),
or, for the deep prompts, its deep hook (`layer_prompts`, per-layer prefixes in the attention);
its parameters live under the model's `prompt/` subtree. An input-hook module is called as
`prompt(embedded [B, T, E], tokens [B, T], embedding=..., deterministic=..., valid=[B, T] bool)`
and reads validity from `valid` alone: every id, 0 included, is a token (T5 callers pass
`tokens > 0`; None means that). Initialisers are plain functions
`init(rng, shape, embedding)`. Nothing here imports gin, seqio or tensorflow; gin files under
`gin/prompts/` configure these names with `from __gin__ import dynamic_registration`.

  prompt_tuning  Prompt Tuning (Lester et al. 2021): one prompt [L, E] before every input
  smop           SMoP (Choi et al. 2023): k short prompts and a router
  residual       Residual Prompt Tuning (Razdaibiedina et al. 2023): a prompt through an MLP
  residual_smop  SMoP's prompts, each reparameterised as in Residual Prompt Tuning
  prefix_tuning  prefix tuning (Li & Liang 2021): key/value prefixes in every attention
  ptuning_v2     P-tuning v2 (Liu et al. 2022): fresh prompt tokens at every layer
  deep           what the deep prompts share: their exported artifact, conversion to prefixes
  dept           DePT (Shi & Lipani 2024): a shorter prompt plus low-rank input offsets
  attempt        ATTEMPT (Asai et al. 2022): a target prompt plus an attention over sources
  mpt            MPT (Wang et al. 2023): a shared prompt times rank-r task factors
  ulpt           ULPT (Wu et al. 2025): r-dimensional rows through a frozen random projection
  placement      where a prompt goes in the encoder input, and the resulting mask
  initializers   initialisers `init(rng, shape, embedding)`
  common         setting checks and embedding-aware parameters the modules share
"""
from typing import Any, Optional

import flax.linen as nn
import numpy as np

from spot_jax.prompts.attempt import Attempt
from spot_jax.prompts.common import Constant
from spot_jax.prompts.initializers import (Initializer, class_labels, class_labels_from_strings,
                                           exported_prompt_path, from_array, from_checkpoint,
                                           from_file, from_text, sampled_vocab, uniform)
from spot_jax.prompts.dept import DePT
from spot_jax.prompts.placement import PLACEMENTS, combine
from spot_jax.prompts.prefix_tuning import PrefixTuning
from spot_jax.prompts.prompt_tuning import PromptTuning
from spot_jax.prompts.ptuning_v2 import PTuningV2
from spot_jax.prompts.residual import ResidualMlp, ResidualPrompt
from spot_jax.prompts.mpt import MultitaskPrompt
from spot_jax.prompts.residual_smop import ResidualSMoP
from spot_jax.prompts.smop import ROUTINGS, SMoP
from spot_jax.prompts.ulpt import ULPT
from spot_jax.backbones.t5.config import T5Config

DEEP_PROMPT_METHODS = (PrefixTuning, PTuningV2)  # the deep hook: per-layer prefixes
PROMPT_METHODS = (PromptTuning, SMoP, ResidualPrompt, DePT, ResidualSMoP, Attempt,
                  MultitaskPrompt, ULPT) + DEEP_PROMPT_METHODS


def effective_prompt(module: nn.Module, prompt_params: Any,
                     config: Optional[T5Config] = None) -> np.ndarray:
  """The prompt a run exports, as float32 NumPy.

  PromptTuning: P [L, E]; ResidualPrompt: the folded P' [L, E]; SMoP: the [k, l, E] prompts;
  ResidualSMoP: the folded [k, l, E] prompts; DePT: its prompt P [m, E] (see `export_arrays`);
  Attempt: its candidates [S + K, m, E] (sources, then targets); MultitaskPrompt: the folded
  P* o (U V) [L, E] of one task, [K, L, E] of several; ULPT: the folded (Z P) diag(s) + b [n, E];
  the deep prompts: a record of their per-layer
  prefixes or tokens (see `deep`; prefix tuning's MLP folded), which needs `config`.

  Args:
    module: the prompt module the model was built with.
    prompt_params: its parameter subtree (the model's `prompt/` subtree), boxed or not.
    config: the model's configuration (required by the deep prompts).
  """
  if isinstance(module, DEEP_PROMPT_METHODS):
    return module.export_prompt(prompt_params, config)
  if not isinstance(module, PROMPT_METHODS):
    raise TypeError(f"effective_prompt: {type(module).__name__} is not a prompt method; "
                    f"valid: {', '.join(m.__name__ for m in PROMPT_METHODS)}")
  return module.export_prompt(prompt_params)


def export_arrays(module: nn.Module, prompt_params: Any) -> dict[str, np.ndarray]:
  """Arrays a run exports beside the effective prompt, by name: DePT's folded "offset" [s, E],
  ULPT's frozen "projection" P [r, E].

  Empty for methods whose export is the prompt alone.
  """
  extra = getattr(module, "export_arrays", None)
  return {} if extra is None else {k: np.asarray(v, np.float32)
                                   for k, v in extra(prompt_params).items()}
