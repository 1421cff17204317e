"""Soft-prompt methods for a frozen T5: Prompt Tuning, SMoP, Residual Prompt Tuning, ATTEMPT, MPT.

Each method is a Flax module for the backbone's input hook (`Transformer(config, prompt=...)`);
its parameters live under the model's `prompt/` subtree. Initialisers are plain functions
`init(rng, shape, embedding)`. Nothing here imports gin, seqio or tensorflow; gin files under
`gin/prompts/` configure these names with `from __gin__ import dynamic_registration`.
"""
from typing import Any

import flax.linen as nn
import numpy as np

from spot_jax.prompts.attempt import Attempt
from spot_jax.prompts.common import Constant
from spot_jax.prompts.initializers import (Initializer, class_labels, class_labels_from_strings,
                                           exported_prompt_path, from_array, from_checkpoint,
                                           from_file, from_text, sampled_vocab, uniform)
from spot_jax.prompts.placement import PLACEMENTS, combine
from spot_jax.prompts.prompt_tuning import PromptTuning
from spot_jax.prompts.residual import ResidualMlp, ResidualPrompt
from spot_jax.prompts.mpt import MultitaskPrompt
from spot_jax.prompts.smop import ROUTINGS, SMoP

PROMPT_METHODS = (PromptTuning, SMoP, ResidualPrompt, Attempt, MultitaskPrompt)


def effective_prompt(module: nn.Module, prompt_params: Any) -> np.ndarray:
  """The prompt a run exports, as float32 NumPy.

  PromptTuning: P [L, E]; ResidualPrompt: the folded P' [L, E]; SMoP: the [k, l, E] prompts;
  Attempt: its candidates [S + K, m, E] (sources, then targets); MultitaskPrompt: the folded
  P* o (U V) [L, E] of one task, [K, L, E] of several.

  Args:
    module: the prompt module the model was built with.
    prompt_params: its parameter subtree (the model's `prompt/` subtree), boxed or not.
  """
  if not isinstance(module, PROMPT_METHODS):
    raise TypeError(f"effective_prompt: {type(module).__name__} is not a prompt method; "
                    f"valid: {', '.join(m.__name__ for m in PROMPT_METHODS)}")
  return module.export_prompt(prompt_params)
