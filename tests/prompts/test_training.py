"""Every prompt method trains inside one jitted step on a tiny frozen T5.

For each method and variant: the step compiles once; the frozen backbone is bit-identical after
100 steps (leaf by leaf, and never donated); every prompt-method leaf changed; SMoP's routing
counts sum to the batch size; the held-out loss falls.
"""
from __future__ import annotations

import warnings

import jax
import numpy as np
import optax
import pytest

from spot_jax import prompts
from spot_jax.backbones.t5 import Transformer
from tests.helpers import prompt_train as util

STEPS, BATCH = 100, 16

METHODS = {
    "prompt_tuning": prompts.PromptTuning(5),
    "prompt_tuning_after_bos": prompts.PromptTuning(5, placement="after_bos",
                                                    prompt_init=prompts.sampled_vocab()),
    "prompt_tuning_suffix": prompts.PromptTuning(5, placement="suffix"),
    "smop": prompts.SMoP(4, 5),
    "smop_no_perturbation": prompts.SMoP(4, 5, perturbation_std=0.0),
    "smop_top2": prompts.SMoP(4, 5, routing="top2"),
    "smop_gumbel": prompts.SMoP(4, 5, routing="gumbel", perturbation_std=0.0),
    "smop_stochastic": prompts.SMoP(4, 5, routing="stochastic"),
    "smop_single": prompts.SMoP(1, 5, routing="single"),
    "smop_load_balancing": prompts.SMoP(4, 5, load_balancing_weight=0.01),
    "residual": prompts.ResidualPrompt(5, bottleneck=16),
    "residual_per_token": prompts.ResidualPrompt(5, bottleneck=16, shared_mlp=False),
    "residual_no_skip": prompts.ResidualPrompt(5, bottleneck=16, skip=False),
    "residual_dropout": prompts.ResidualPrompt(5, bottleneck=16, dropout=0.1),
}
# Variants whose every prompt should be picked (so trained) at some step.
ALL_PROMPTS_USED = ("smop", "smop_top2", "smop_gumbel", "smop_stochastic", "smop_load_balancing")


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_trains_only_its_prompt_parameters(name):
  module = METHODS[name]
  model = Transformer(util.TEST_CONFIG, prompt=module)
  frozen = util.frozen_backbone()
  frozen_before = jax.tree_util.tree_map(np.array, frozen)
  initial = util.create_prompt_params(model, frozen)
  initial_np = jax.tree_util.tree_map(np.array, initial)
  optimizer = optax.adam(0.1)
  step, traces = util.make_train_step(model, optimizer)
  state = util.init_state(initial, optimizer)
  held_out = util.synthetic_batch(10_000, batch=64)
  # The held-out loss is a measurement, not the step under test: unoptimised machine code
  # compiles in half the time on CPU.
  eval_loss = jax.jit(util.make_eval_loss(model),
                      compiler_options={"xla_backend_optimization_level": 0})
  loss_before = float(eval_loss(frozen, initial, held_out))

  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
    for i in range(STEPS):
      state, metrics = step(state, frozen, util.synthetic_batch(i, batch=BATCH))
      if isinstance(module, prompts.SMoP):
        load = np.asarray(metrics["intermediates"]["prompt"]["router_load"][0])
        assert load.sum() == BATCH, load

  assert traces() == 1 and step._cache_size() == 1  # compiled once for all 100 steps
  assert int(state["step"]) == STEPS
  for path, leaf in jax.tree_util.tree_leaves_with_path(frozen):
    assert not leaf.is_deleted(), f"frozen {jax.tree_util.keystr(path)} was donated"
    np.testing.assert_array_equal(np.asarray(leaf), _at(frozen_before, path),
                                  err_msg=f"frozen {jax.tree_util.keystr(path)} changed")
  trained = jax.tree_util.tree_map(np.asarray, state["prompt"])
  assert jax.tree_util.tree_structure(trained) == jax.tree_util.tree_structure(initial_np)
  for path, leaf in jax.tree_util.tree_leaves_with_path(trained):
    assert not np.array_equal(leaf, _at(initial_np, path)), \
        f"{jax.tree_util.keystr(path)} did not train"
  if name in ALL_PROMPTS_USED:
    moved = np.abs(trained["prompts"] - initial_np["prompts"]).max(axis=(1, 2))
    assert (moved > 0).all(), moved

  loss_after = float(eval_loss(frozen, state["prompt"], held_out))
  print(f"{name}: held-out loss {loss_before:.3f} -> {loss_after:.3f}")
  assert loss_after < loss_before - 0.5, (loss_before, loss_after)


def _at(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree
