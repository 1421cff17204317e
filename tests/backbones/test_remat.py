"""Rematerialisation (REMAT) changes what a layer keeps, never a loss or a gradient.

Each policy that runs on this backend is compared with "none" on both backbones, float32: the
prompt's gradient within 1e-6 (max abs), the loss equal, the parameter tree the same, and on T5
the dropout masks the same (a training step with dropout on). A deep prompt (prefix tuning)
checks gradients that reach every layer through its traced prefixes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import models
from spot_jax.backbones import memory
from spot_jax.backbones.decoder import config as decoder_config
from spot_jax.backbones.decoder.network import DecoderLM
from spot_jax.backbones.t5 import config as t5_config
from spot_jax.backbones.t5.network import Transformer
from spot_jax.prompts import initializers
from spot_jax.prompts.prefix_tuning import PrefixTuning
from spot_jax.prompts.prompt_tuning import PromptTuning

POLICIES = [p for p in memory.REMAT_POLICIES
            if p != "none" and (p != "offload" or memory.host_offload_supported())]
ATOL = 1e-6


def _batch(model, inputs: int = 7, targets: int = 4, batch: int = 3) -> dict:
  rs = np.random.RandomState(0)
  vocab = 100
  if model.kind == "decoder":
    tokens = rs.randint(3, vocab, (batch, inputs + targets)).astype(np.int32)
    tokens[1, -3:] = 0  # a padded row
    weights = np.zeros_like(tokens)
    weights[:, inputs:] = tokens[:, inputs:] > 0
    return {"decoder_target_tokens": tokens,
            "decoder_input_tokens": np.concatenate([np.zeros((batch, 1), np.int32),
                                                    tokens[:, :-1]], axis=1),
            "decoder_loss_weights": weights}
  enc = rs.randint(3, vocab, (batch, inputs)).astype(np.int32)
  enc[1, -2:] = 0
  tgt = rs.randint(3, vocab, (batch, targets)).astype(np.int32)
  dec = np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], axis=1)
  return {"encoder_input_tokens": enc, "decoder_input_tokens": dec,
          "decoder_target_tokens": tgt, "decoder_loss_weights": np.ones_like(tgt)}


def _model(kind: str, prompt, remat: str = "none", dropout: float = 0.0):
  if kind == "t5":
    config = t5_config.config_by_name("t5_1_1_test", dropout_rate=dropout, remat_policy=remat)
    return models.EncoderDecoderModel(Transformer(config, prompt))
  config = decoder_config.config_by_name(kind, remat_policy=remat)
  return models.DecoderOnlyModel(DecoderLM(config, prompt), eos_id=1)


def _prompt(method: str, kind: str = "t5"):
  if method == "prompt_tuning":
    return PromptTuning(5, prompt_init=initializers.uniform(0.5))
  return PrefixTuning(3) if kind == "t5" else PrefixTuning(3, attention=("decoder",))


def _loss_and_grad(model, params, batch, enable_dropout: bool):
  frozen = {k: v for k, v in params.items() if k != models.PROMPT_KEY}

  def loss(prompt):
    full = models.merge_params(frozen, {models.PROMPT_KEY: prompt})
    return model.loss_fn(full, batch, jax.random.PRNGKey(7), enable_dropout=enable_dropout)[0]

  return jax.jit(jax.value_and_grad(loss))(params[models.PROMPT_KEY])


CASES = [("t5", "prompt_tuning"), ("t5", "prefix_tuning"), ("decoder_tiny_llama", "prompt_tuning"),
         ("decoder_tiny_gemma3", "prompt_tuning"), ("decoder_tiny_llama", "prefix_tuning")]


@pytest.mark.parametrize("kind,method", CASES)
def test_remat_changes_no_gradient(kind, method):
  batch = _batch(_model(kind, None))
  base = _model(kind, _prompt(method, kind))
  rng = jax.random.PRNGKey(0)
  params = models.unbox({**base.init_backbone(rng, batch),
                         **base.init_prompt(rng, models.unbox(base.init_backbone(rng, batch)),
                                            batch)})
  want_loss, want_grad = _loss_and_grad(base, params, batch, enable_dropout=False)
  for policy in POLICIES:
    model = _model(kind, _prompt(method, kind), policy)
    # the same tree (names and shapes) under remat
    shapes = jax.eval_shape(model.init_backbone, rng, batch)
    assert (jax.tree.structure(shapes) == jax.tree.structure(base.init_backbone(rng, batch)))
    loss, grad = _loss_and_grad(model, params, batch, enable_dropout=False)
    assert float(loss) == pytest.approx(float(want_loss), abs=ATOL), policy
    diffs = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), grad, want_grad))
    assert max(float(d) for d in diffs) <= ATOL, (policy, diffs)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grad)) > 1e-4  # not vacuous


def test_remat_keeps_t5_dropout_masks():
  """With dropout on, remat draws the same masks: the same loss and gradient as none."""
  prompt = _prompt("prompt_tuning")
  base = _model("t5", prompt, dropout=0.3)
  batch = _batch(base)
  rng = jax.random.PRNGKey(1)
  frozen = models.unbox(base.init_backbone(rng, batch))
  params = {**frozen, **models.unbox(base.init_prompt(rng, frozen, batch))}
  want_loss, want_grad = _loss_and_grad(base, params, batch, enable_dropout=True)
  off_loss, _ = _loss_and_grad(base, params, batch, enable_dropout=False)
  assert abs(float(want_loss) - float(off_loss)) > 1e-3  # dropout is on
  loss, grad = _loss_and_grad(_model("t5", prompt, "full", dropout=0.3), params, batch, True)
  assert float(loss) == pytest.approx(float(want_loss), abs=ATOL)
  diffs = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), grad, want_grad))
  assert max(float(d) for d in diffs) <= ATOL


def test_offload_refused_or_runs():
  """"offload" either compiles here (a pinned host memory space) or is one line naming the
  policies this backend can run."""
  if memory.host_offload_supported():
    assert memory.policy("offload") is not None
    return
  with pytest.raises(Exception, match="valid here: none, full, save_dots"):
    memory.policy("offload")
