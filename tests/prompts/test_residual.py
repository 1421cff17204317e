"""Residual Prompt Tuning: the formula against NumPy, folding, variants, axes."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import prompts
from spot_jax.backbones.t5 import Transformer
from tests.helpers import prompt_train as util
from tests.helpers.residual import _reference, random_mlp

L, E, M = 5, 8, 6
TOKENS = np.array([[5, 6, 1, 0], [7, 8, 9, 1]], np.int32)


def _params(shared: bool, seed: int = 0) -> dict:
  rs = np.random.RandomState(seed)
  mlp = random_mlp(rs, () if shared else (L,), E, M)
  return {"prompt": rs.normal(0, 1, (L, E)).astype(np.float32), "mlp": mlp}


def _apply(module, params, *, deterministic=True, seed=0):
  embedded = jnp.asarray(np.random.RandomState(3).normal(0, 1, TOKENS.shape + (E,)), jnp.float32)
  x, valid = module.apply({"params": params}, embedded, jnp.asarray(TOKENS),
                          embedding=jnp.zeros((10, E)), deterministic=deterministic,
                          rngs={"dropout": jax.random.PRNGKey(seed)})
  return np.asarray(x), np.asarray(valid)


@pytest.mark.parametrize("shared,skip,activation", [
    (True, True, "relu"), (False, True, "relu"), (True, False, "relu"), (False, False, "tanh"),
    (True, True, "sigmoid")])
def test_forward_matches_numpy_formula(shared, skip, activation):
  params = _params(shared)
  module = prompts.ResidualPrompt(L, bottleneck=M, shared_mlp=shared, skip=skip,
                                  activation=activation)
  x, valid = _apply(module, params)
  want = _reference(params, shared, skip, activation)
  for b in range(len(TOKENS)):
    np.testing.assert_allclose(x[b, :L], want, rtol=0, atol=1e-5)
  assert valid[:, :L].all() and x.shape == (2, L + TOKENS.shape[1], E)
  if skip:  # the skip connection really is there: removing it changes the result
    assert np.abs(want - _reference(params, shared, False, activation)).max() > 0.1


def test_per_token_mlps_differ_from_a_shared_one():
  per_token = _params(shared=False)
  shared = {"prompt": per_token["prompt"],
            "mlp": {k: v[0].copy() for k, v in per_token["mlp"].items()}}
  tied = {"prompt": per_token["prompt"],
          "mlp": {k: np.broadcast_to(v[0], v.shape).copy() for k, v in per_token["mlp"].items()}}
  x_shared, _ = _apply(prompts.ResidualPrompt(L, bottleneck=M), shared)
  x_tied, _ = _apply(prompts.ResidualPrompt(L, bottleneck=M, shared_mlp=False), tied)
  x_free, _ = _apply(prompts.ResidualPrompt(L, bottleneck=M, shared_mlp=False), per_token)
  np.testing.assert_allclose(x_tied, x_shared, rtol=0, atol=1e-5)  # identical MLPs: same
  assert np.abs(x_free[:, :L] - x_shared[:, :L]).max() > 0.1


def test_dropout_only_in_training():
  params = _params(True)
  module = prompts.ResidualPrompt(L, bottleneck=M, dropout=0.5)
  x_eval, _ = _apply(module, params, deterministic=True)
  np.testing.assert_allclose(x_eval[0, :L], _reference(params, True, True, "relu"), atol=1e-5)
  x_a, _ = _apply(module, params, deterministic=False, seed=0)
  x_b, _ = _apply(module, params, deterministic=False, seed=1)
  assert np.abs(x_a - x_eval).max() > 1e-3 and np.abs(x_a - x_b).max() > 1e-3


@pytest.mark.parametrize("shared,placement", [(True, "prefix"), (False, "suffix")])
def test_fold_preserves_logits(shared, placement, tmp_path):
  module = prompts.ResidualPrompt(4, bottleneck=16, shared_mlp=shared, placement=placement)
  model = Transformer(util.TEST_CONFIG, prompt=module)
  frozen = util.frozen_backbone()
  params = util.create_prompt_params(model, frozen)
  rs = np.random.RandomState(7)  # move the MLP away from its initial LayerNorm (1, 0)
  params = jax.tree_util.tree_map(lambda v: v + rs.normal(0, 0.3, v.shape).astype(np.float32),
                                  params)
  folded = module.fold(params)
  assert set(folded) == {"prompt"} and folded["prompt"].shape == (4, 32)
  folded_model = Transformer(util.TEST_CONFIG, prompt=module.folded_module())
  assert module.folded_module().placement == placement
  batch = util.synthetic_batch(3, batch=4)

  def logits(m, prompt_params):
    return m.apply({"params": {**frozen, "prompt": prompt_params}},
                   batch["encoder_input_tokens"], batch["decoder_input_tokens"],
                   enable_dropout=False)

  original, refolded = logits(model, params), logits(folded_model, folded)
  diff = float(jnp.max(jnp.abs(original - refolded)))
  assert diff <= 1e-5, diff
  exported = prompts.effective_prompt(module, params)
  np.testing.assert_array_equal(exported, np.asarray(folded["prompt"]))

  # SPoT: the exported P' seeds a Prompt Tuning model that computes the same logits.
  (tmp_path / "prompts").mkdir()
  np.save(tmp_path / "prompts" / "prompt_step_100.npy", exported)
  transfer = prompts.PromptTuning(4, prompt_init=prompts.from_checkpoint(tmp_path),
                                  placement=placement)
  transfer_model = Transformer(util.TEST_CONFIG, prompt=transfer)
  loaded = util.create_prompt_params(transfer_model, frozen)
  diff = float(jnp.max(jnp.abs(original - logits(transfer_model, loaded))))
  assert diff <= 1e-5, diff


def test_parameter_axes():
  batch = util.synthetic_batch(0, batch=2)
  frozen = util.frozen_backbone()
  for shared in (True, False):
    model = Transformer(util.TEST_CONFIG,
                        prompt=prompts.ResidualPrompt(3, bottleneck=16, shared_mlp=shared))
    boxed = jax.eval_shape(lambda: model.apply(
        {"params": frozen}, batch["encoder_input_tokens"],
        method=Transformer.embed_encoder_input,
        rngs={"params": jax.random.PRNGKey(0)}, mutable=["params"])[1]["params"]["prompt"])
    lead = () if shared else ("prompt",)
    assert boxed["prompt"].names == ("prompt", "prompt_embed")
    assert boxed["mlp"]["down_kernel"].names == lead + ("prompt_embed", "prompt_mlp")
    assert boxed["mlp"]["up_kernel"].names == lead + ("prompt_mlp", "prompt_embed")
    assert boxed["mlp"]["down_bias"].names == lead + ("prompt_mlp",)
    assert boxed["mlp"]["layer_norm_scale"].names == lead + ("prompt_embed",)
    assert boxed["mlp"]["down_kernel"].value.shape == (3,) * (not shared) + (32, 16)


def test_invalid_settings_name_the_problem():
  with pytest.raises(ValueError, match="ResidualPrompt.activation='swish' is unknown"):
    prompts.ResidualPrompt(4, activation="swish")
  with pytest.raises(ValueError, match=r"ResidualPrompt.dropout=1.0 must be in \[0, 1\)"):
    prompts.ResidualPrompt(4, dropout=1.0)
  with pytest.raises(ValueError, match="ResidualPrompt.length=0 must be a positive integer"):
    prompts.ResidualPrompt(0)
  with pytest.raises(ValueError, match=r"lacks \['mlp'\]"):
    prompts.ResidualPrompt(4, bottleneck=M).fold({"prompt": np.zeros((4, E), np.float32)})
  with pytest.raises(TypeError, match="not a prompt method"):
    prompts.effective_prompt(Transformer(util.TEST_CONFIG), {})
