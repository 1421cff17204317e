"""Residual SMoP: the reparameterised prompts against NumPy, folding to plain SMoP (logits within
1e-6, shared and per-prompt MLPs), bucketing, the parameter count, axes and bad settings."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import prompts
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import Transformer
from tests.helpers import bucketing, prompt_train as util
from tests.helpers.bucketing_task import BUCKETS, WINDOW, _cfg
from tests.helpers.residual import _reference as residual_reference
from tests.helpers.residual import random_mlp

K, L, M, E = 3, 2, 6, util.TEST_CONFIG.emb_dim


def _params(shared: bool, seed: int = 0) -> dict:
  """Trained-looking parameters (LayerNorm away from (1, 0), a router that routes)."""
  rs = np.random.RandomState(seed)
  mlp = random_mlp(rs, () if shared else (K,), E, M)
  return {"prompts": rs.normal(0, 1, (K, L, E)).astype(np.float32), "mlp": mlp,
          "router": {"kernel": rs.normal(0, 3, (E, K)).astype(np.float32)}}


def _reference(params: dict, shared: bool, skip: bool = True) -> np.ndarray:
  """P'_j = LayerNorm(W_up ReLU(W_down P_j + b) + b') + P_j per prompt j, in float64."""
  out = []
  for j in range(K):
    mlp = params["mlp"] if shared else {k: v[j] for k, v in params["mlp"].items()}
    out.append(residual_reference({"prompt": params["prompts"][j], "mlp": mlp}, True, skip, "relu"))
  return np.stack(out)


@pytest.mark.parametrize("shared", [True, False])
def test_reparameterised_prompts_match_numpy(shared):
  module = prompts.ResidualSMoP(K, L, bottleneck=M, shared_mlp=shared)
  params = _params(shared)
  folded = module.fold(params)
  np.testing.assert_allclose(folded["prompts"], _reference(params, shared), rtol=0, atol=1e-5)
  np.testing.assert_array_equal(folded["router"]["kernel"], params["router"]["kernel"])
  assert "mlp" not in folded
  # without the skip connection the result really differs (the "+ P" is there)
  no_skip = prompts.ResidualSMoP(K, L, bottleneck=M, shared_mlp=shared, skip=False).fold(params)
  np.testing.assert_allclose(no_skip["prompts"], _reference(params, shared, skip=False), atol=1e-5)
  assert np.abs(np.asarray(no_skip["prompts"]) - np.asarray(folded["prompts"])).max() > 0.1


def test_per_prompt_mlps_differ_and_tied_ones_equal_the_shared_mlp():
  free = _params(shared=False)
  shared = dict(free, mlp={k: v[0] for k, v in free["mlp"].items()})
  tied = dict(free, mlp={k: np.broadcast_to(v[0], v.shape).copy() for k, v in free["mlp"].items()})
  per_prompt = prompts.ResidualSMoP(K, L, bottleneck=M, shared_mlp=False)
  want = prompts.ResidualSMoP(K, L, bottleneck=M).fold(shared)["prompts"]
  np.testing.assert_allclose(per_prompt.fold(tied)["prompts"], want, rtol=0, atol=1e-6)
  assert np.abs(np.asarray(per_prompt.fold(free)["prompts"]) - np.asarray(want)).max() > 0.1
  # a fresh per-prompt model draws k different MLPs
  fresh = util.create_prompt_params(Transformer(util.TEST_CONFIG, prompt=per_prompt),
                                    util.frozen_backbone())
  kernels = np.asarray(fresh["mlp"]["down_kernel"])
  assert kernels.shape == (K, E, M) and np.abs(kernels[0] - kernels[1]).max() > 0


@pytest.mark.parametrize("shared,placement,routing", [
    (True, "prefix", "linear"), (False, "prefix", "linear"), (False, "suffix", "top2")])
def test_folded_smop_logits_equal_the_unfolded_model(shared, placement, routing):
  module = prompts.ResidualSMoP(K, L, bottleneck=M, shared_mlp=shared, placement=placement,
                                routing=routing)
  params = _params(shared, seed=1)
  frozen = util.frozen_backbone()
  batch = util.synthetic_batch(3, batch=6)

  def logits(m, prompt_params):
    return np.asarray(Transformer(util.TEST_CONFIG, prompt=m).apply(
        {"params": {**frozen, "prompt": prompt_params}}, batch["encoder_input_tokens"],
        batch["decoder_input_tokens"], enable_dropout=False))

  folded_module = module.folded_module()
  assert type(folded_module) is prompts.SMoP and folded_module.placement == placement
  unfolded, folded = logits(module, params), logits(folded_module, module.fold(params))
  assert np.abs(unfolded).max() > 1.0
  np.testing.assert_allclose(folded, unfolded, rtol=0, atol=1e-6)
  # the rows really take different prompts, so the parity covers routing
  embedded = np.asarray(frozen["token_embedder"]["embedding"])[batch["encoder_input_tokens"]]
  from spot_jax.prompts import common  # pylint: disable=g-import-not-at-top
  features = common.mean_embedding(jnp.asarray(embedded),
                                   jnp.asarray(batch["encoder_input_tokens"] > 0))
  assert len(set(np.argmax(np.asarray(features) @ params["router"]["kernel"], 1).tolist())) >= 2
  # what a run exports is the folded prompts
  np.testing.assert_array_equal(prompts.effective_prompt(module, params),
                                np.asarray(module.fold(params)["prompts"]))


def test_dropout_only_in_training():
  module = prompts.ResidualSMoP(K, L, bottleneck=M, dropout=0.5, routing="stochastic")
  params = {k: v for k, v in _params(True).items() if k != "router"}
  tokens = jnp.asarray(np.array([[5, 6, 1, 0]], np.int32))
  embedded = jnp.ones((1, 4, E))

  def run(deterministic, seed):
    x, _ = module.apply({"params": params}, embedded, tokens, embedding=jnp.zeros((10, E)),
                        deterministic=deterministic, rngs={"dropout": jax.random.PRNGKey(seed)})
    return np.asarray(x)

  np.testing.assert_allclose(run(True, 0)[0, :L], _reference(params, True).mean(0), atol=1e-5)
  assert np.abs(run(False, 0) - run(False, 1)).max() > 1e-3


def test_per_example_losses_equal_fixed_and_bucketed(task_name):  # pylint: disable=redefined-outer-name
  """Per-prompt MLPs (the shared MLP differs only by a reshape before the same code)."""
  got, want = bucketing.losses_fixed_and_bucketed(
      _cfg(task_name), prompts.ResidualSMoP(3, 2, bottleneck=8, shared_mlp=False), WINDOW, BUCKETS)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("shared,routing",
                         [(True, "linear"), (False, "linear"), (True, "stochastic")])
def test_parameter_count_is_the_papers(shared, routing):
  """SMoP's k l E prompts and E k router (none without one) plus Residual's MLP,
  2 E m + m + 3 E (down and up kernels and biases, LayerNorm scale and bias), once or k times."""
  module = prompts.ResidualSMoP(K, L, bottleneck=M, shared_mlp=shared, routing=routing)
  params = util.create_prompt_params(Transformer(util.TEST_CONFIG, prompt=module),
                                     util.frozen_backbone())
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  mlp = 2 * E * M + M + 3 * E
  router = E * K if routing == "linear" else 0
  assert count == K * L * E + router + mlp * (1 if shared else K)


def test_parameter_axes():
  batch = util.synthetic_batch(0, batch=2)
  for shared in (True, False):
    model = Transformer(util.TEST_CONFIG,
                        prompt=prompts.ResidualSMoP(K, L, bottleneck=M, shared_mlp=shared))
    boxed = jax.eval_shape(lambda m=model: m.apply(
        {"params": util.frozen_backbone()}, batch["encoder_input_tokens"],
        method=Transformer.embed_encoder_input,
        rngs={"params": jax.random.PRNGKey(0)}, mutable=["params"])[1]["params"]["prompt"])
    lead = () if shared else ("prompts",)
    assert boxed["prompts"].names == ("prompts", "prompt", "prompt_embed")
    assert boxed["router"]["kernel"].names == ("prompt_embed", "prompts")
    assert boxed["mlp"]["down_kernel"].names == lead + ("prompt_embed", "prompt_mlp")
    assert boxed["mlp"]["up_kernel"].names == lead + ("prompt_mlp", "prompt_embed")
    assert boxed["mlp"]["layer_norm_bias"].names == lead + ("prompt_embed",)


def test_bad_settings_are_one_line_errors():
  for kwargs, message in [(dict(bottleneck=0), "ResidualSMoP.bottleneck=0 must be a positive"),
                          (dict(activation="swish"), "ResidualSMoP.activation='swish' is unknown"),
                          (dict(dropout=1.0), r"ResidualSMoP.dropout=1.0 must be in \[0, 1\)"),
                          (dict(routing="top2", num_prompts=1), "needs num_prompts >= 2")]:
    with pytest.raises(ValueError, match=message) as e:
      prompts.ResidualSMoP(**kwargs)
    assert "\n" not in str(e.value)
  with pytest.raises(ConfigError, match=r"lacks \['mlp'\]"):
    prompts.ResidualSMoP(K, L).fold({"prompts": np.zeros((K, L, E), np.float32)})
