"""Prompt parameters carry the prompt axes, which the default rules replicate and the XXL
option shards over "model"."""
from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from spot_jax import partitioning, prompts
from spot_jax.backbones.t5 import Transformer
from tests.helpers import prompt_train as util

MODULES = {
    "prompt_tuning": prompts.PromptTuning(5),
    "smop": prompts.SMoP(4, 5),
    "residual": prompts.ResidualPrompt(5, bottleneck=16),
    "residual_per_token": prompts.ResidualPrompt(5, bottleneck=16, shared_mlp=False),
    "dept": prompts.DePT(5, max_length=8, rank=3),
    "residual_smop_per_prompt": prompts.ResidualSMoP(4, 5, bottleneck=16, shared_mlp=False),
    "attempt": prompts.Attempt(np.zeros((3, 5, util.TEST_CONFIG.emb_dim)), num_targets=2,
                               bottleneck=8),
    "mpt": prompts.MultitaskPrompt(5, num_tasks=2, rank=2),
    "ulpt": prompts.ULPT(5, rank=4),
}
PROMPT_AXES = {"prompt", "prompt_embed", "prompts", "prompt_mlp"}


def _boxed_prompt_params(module):
  model = Transformer(util.TEST_CONFIG, prompt=module)
  batch, frozen = util.synthetic_batch(0, batch=2), util.frozen_backbone()
  return jax.eval_shape(lambda: model.apply(
      {"params": frozen}, batch["encoder_input_tokens"], method=Transformer.embed_encoder_input,
      rngs={"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(0)},
      mutable=["params"])[1]["params"]["prompt"])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_prompt_params_use_only_prompt_axes(name):
  boxed = _boxed_prompt_params(MODULES[name])
  specs = nn.get_partition_spec(boxed)
  leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
  assert leaves and all(set(spec) <= PROMPT_AXES for spec in leaves), specs
  replicated = nn.logical_to_mesh_axes
  for spec in leaves:
    assert replicated(spec, partitioning.logical_rules()) == PartitionSpec(*[None] * len(spec))
    sharded = replicated(spec, partitioning.logical_rules(shard_prompt_embed=True))
    want = tuple("model" if axis == "prompt_embed" else None for axis in spec)
    assert tuple(sharded) == want
