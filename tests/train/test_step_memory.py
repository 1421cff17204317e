"""What REMAT and FROZEN_DTYPE do to a train step's memory, by XLA's analysis of the compiled
step (`train.footprint.step_inputs`: abstract weights, nothing allocated or read).

A Llama-shaped decoder at two depths, Prompt Tuning, AdamW: remat=full holds less temporary
memory than none, and each extra layer costs it at most a quarter of what it costs none (the
layer's input, not its activations); bfloat16 frozen weights take half the argument bytes of
float32 ones, and the prompt's state stays float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from spot_jax import models, prompts
from spot_jax.backbones.decoder.config import DecoderConfig
from spot_jax.backbones.decoder.network import DecoderLM
from spot_jax.train import footprint, optimizers
from spot_jax.train import step as step_lib

LENGTHS = {"inputs": 96, "targets": 32}
BATCH = 4


def _config(layers: int, **changes) -> DecoderConfig:
  return DecoderConfig(vocab_size=2048, emb_dim=256, num_heads=4, num_kv_heads=2,
                       num_layers=layers, head_dim=64, mlp_dim=1024, bos_id=1, eos_id=2,
                       **changes)


def _compiled(config: DecoderConfig):
  model = models.DecoderOnlyModel(DecoderLM(config, prompts.PromptTuning(length=8)), z_loss=0.0)
  tx = optimizers.adamw(learning_rate=1e-3)
  inputs = footprint.step_inputs(model, tx, LENGTHS, BATCH)
  step = jax.jit(step_lib.make_train_step(inputs.model, tx), donate_argnums=(0,))
  return inputs, step.lower(inputs.state, inputs.frozen, inputs.batch).compile().memory_analysis()


@pytest.fixture(scope="module")
def temps():
  """{(remat, layers): temp bytes}."""
  return {(remat, layers): _compiled(_config(layers, remat_policy=remat))[1].temp_size_in_bytes
          for remat in ("none", "full") for layers in (2, 4)}


def test_full_remat_holds_less_than_none(temps):
  assert temps["full", 4] < temps["none", 4]
  per_layer_none = (temps["none", 4] - temps["none", 2]) / 2
  per_layer_full = (temps["full", 4] - temps["full", 2]) / 2
  assert per_layer_none > 0
  assert per_layer_full <= per_layer_none / 4, (per_layer_full, per_layer_none)


def test_bfloat16_halves_the_frozen_arguments():
  f32_inputs, f32 = _compiled(_config(2, param_dtype="float32"))
  bf16_inputs, bf16 = _compiled(_config(2, param_dtype="bfloat16"))
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
  assert {x.dtype for x in jax.tree.leaves(bf16_inputs.frozen)} == {jnp.dtype(jnp.bfloat16)}
  assert nbytes(bf16_inputs.frozen) * 2 == nbytes(f32_inputs.frozen)
  assert ({x.dtype for x in jax.tree.leaves(bf16_inputs.state.params)}
          == {jnp.dtype(jnp.float32)})
  saved = f32.argument_size_in_bytes - bf16.argument_size_in_bytes
  assert saved == nbytes(f32_inputs.frozen) // 2
