"""ATTEMPT: the paper's equations against NumPy, the one-source limit, the multi-task variant,
frozen sources, parameter count, bucketing."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import models, prompts
from spot_jax.errors import ConfigError
from spot_jax.prompts import attempt as attempt_lib
from spot_jax.backbones.t5 import Transformer
from tests.helpers import prompt_train as util

S, M, E, R = 3, 4, 8, 5
TOKENS = np.array([[5, 6, 1, 0, 0], [7, 8, 9, 2, 1], [4, 1, 0, 0, 0]], np.int32)


def _sources(seed: int = 0) -> np.ndarray:
  return np.random.RandomState(seed).normal(0, 1, (S, M, E)).astype(np.float32)


def _params(k: int = 1, seed: int = 1) -> dict:
  rs = np.random.RandomState(seed)
  f = lambda *shape, s=0.5: rs.normal(0, s, shape).astype(np.float32)
  return {"prompts": f(k, M, E, s=1.0),
          "attention": {"down_kernel": f(E, R), "up_kernel": f(R, E),
                        "layer_norm_scale": 1.0 + f(E), "layer_norm_bias": f(E)}}


def _embedded(seed: int = 3) -> np.ndarray:
  return np.random.RandomState(seed).normal(0, 1, TOKENS.shape + (E,)).astype(np.float32)


def _reference(embedded, tokens, sources, target, net, temperature):
  """The paper's equations in float64, one row at a time: (attention [S + 1], prompt [m, E])."""
  f = lambda a: np.asarray(a, np.float64)
  x = f(embedded)[tokens > 0].max(axis=0)  # max-pool over the input's tokens
  hidden = x @ f(net["down_kernel"])
  hidden = hidden / (1 + np.exp(-hidden))  # SiLU
  h = hidden @ f(net["up_kernel"])
  h = ((h - h.mean()) / np.sqrt(h.var() + 1e-5) * f(net["layer_norm_scale"])
       + f(net["layer_norm_bias"]))
  candidates = list(f(sources)) + [f(target)]
  scores = np.array([c.max(axis=0) @ h for c in candidates]) / temperature
  a = np.exp(scores - scores.max())
  a /= a.sum()
  return a, f(target) + sum(w * c for w, c in zip(a, candidates))


def _apply(module, params, embedded, task_index=None):
  (x, valid), state = module.apply(
      {"params": params}, jnp.asarray(embedded), jnp.asarray(TOKENS), embedding=jnp.zeros((10, E)),
      deterministic=True, task_index=task_index, mutable=["intermediates"])
  return np.asarray(x), np.asarray(valid), state["intermediates"]


@pytest.mark.parametrize("temperature", [None, 0.7])
def test_attention_and_mixed_prompt_equal_the_papers_equations(temperature):
  sources, params, embedded = _sources(), _params(), _embedded()
  module = prompts.Attempt(sources, bottleneck=R, temperature=temperature)
  t = E * math.e if temperature is None else temperature
  assert module.resolved_temperature() == pytest.approx(t)
  x, valid, inter = _apply(module, params, embedded)
  net = params["attention"]
  weights = np.asarray(attempt_lib.mixture_weights(
      prompts.common.max_pool(jnp.asarray(embedded), jnp.asarray(TOKENS > 0)), jnp.asarray(sources),
      jnp.broadcast_to(params["prompts"][0], (len(TOKENS), M, E)), net["down_kernel"],
      net["up_kernel"], net["layer_norm_scale"], net["layer_norm_bias"], t))
  means = []
  for b in range(len(TOKENS)):
    a, prompt = _reference(embedded[b], TOKENS[b], sources, params["prompts"][0], net, t)
    np.testing.assert_allclose(weights[b], a, rtol=0, atol=1e-6)
    np.testing.assert_allclose(x[b, :M], prompt, rtol=0, atol=1e-6)  # prefix placement
    np.testing.assert_allclose(x[b, M:], embedded[b], rtol=0, atol=0)
    means.append(a)
  assert np.ptp(weights) > 1e-3  # the attention is not uniform: the comparison is not vacuous
  np.testing.assert_allclose(np.asarray(inter["attention_weights"][0]),
                             np.mean(means, axis=0), atol=1e-6)
  assert valid[:, :M].all() and (valid[:, M:] == (TOKENS > 0)).all()


def test_padding_never_enters_the_pool():
  """A row's prompt is the same padded to 5 or to 9 positions (the paper's code pools padding)."""
  sources, params, embedded = _sources(), _params(), _embedded()
  module = prompts.Attempt(sources, bottleneck=R)
  wide = np.concatenate([embedded, np.full(embedded.shape[:1] + (4, E), 50.0, np.float32)], 1)
  wide_tokens = np.pad(TOKENS, [(0, 0), (0, 4)])
  x_narrow, _, _ = _apply(module, params, embedded)
  (x_wide, _), _ = module.apply({"params": params}, jnp.asarray(wide), jnp.asarray(wide_tokens),
                                embedding=jnp.zeros((10, E)), deterministic=True,
                                mutable=["intermediates"])
  np.testing.assert_allclose(np.asarray(x_wide)[:, :M], x_narrow[:, :M], atol=0)


def test_one_source_with_all_attention_and_a_zero_target_serves_that_source():
  """Target zeroed, the attention saturated on source 1: the logits of prompt tuning with P_1."""
  config = util.TEST_CONFIG
  sources = np.zeros((S, M, config.emb_dim), np.float32)
  for j in range(S):  # distinct, positive max-pooled keys: key_j = e_j + 0.1
    sources[j] = np.random.RandomState(j).uniform(-1, 0.1, (M, config.emb_dim))
    sources[j, j % M, j] = 1.0
  module = prompts.Attempt(sources, bottleneck=R, prompt_init=lambda r, s, e: jnp.zeros(s))
  backbone = util.frozen_backbone(config)
  params = util.create_prompt_params(Transformer(config, prompt=module), backbone)
  assert not np.any(np.asarray(params["prompts"]))
  key = sources[1].max(axis=0)
  net = dict(params["attention"], layer_norm_scale=jnp.zeros(config.emb_dim),
             layer_norm_bias=jnp.asarray(1e4 * module.resolved_temperature() * key / (key @ key)))
  params = dict(params, attention=net)
  batch = util.synthetic_batch(5, batch=4)
  args = (batch["encoder_input_tokens"], batch["decoder_input_tokens"],
          batch["decoder_target_tokens"])
  mixed, state = Transformer(config, prompt=module).apply(
      {"params": {**backbone, "prompt": params}}, *args, enable_dropout=False,
      mutable=["intermediates"])
  np.testing.assert_array_equal(np.asarray(state["intermediates"]["prompt"]["attention_weights"][0]),
                                np.eye(S + 1)[1])
  alone = Transformer(config, prompt=prompts.PromptTuning(M)).apply(
      {"params": {**backbone, "prompt": {"prompt": sources[1]}}}, *args, enable_dropout=False)
  np.testing.assert_allclose(np.asarray(mixed), np.asarray(alone), rtol=0, atol=1e-6)


def test_multitask_rows_use_their_own_target_and_the_shared_attention():
  sources, params, embedded = _sources(), _params(k=3), _embedded()
  module = prompts.Attempt(sources, num_targets=3, bottleneck=R, default_task=2)
  task_index = jnp.asarray([1, 0, 1], jnp.int32)
  x, _, _ = _apply(module, params, embedded, task_index)
  t = E * math.e
  for b, task in enumerate([1, 0, 1]):
    _, prompt = _reference(embedded[b], TOKENS[b], sources, params["prompts"][task],
                           params["attention"], t)
    np.testing.assert_allclose(x[b, :M], prompt, atol=1e-6)
  # No task index (batches without the feature): every row uses default_task.
  x_default, _, _ = _apply(module, params, embedded)
  for b in range(len(TOKENS)):
    _, prompt = _reference(embedded[b], TOKENS[b], sources, params["prompts"][2],
                           params["attention"], t)
    np.testing.assert_allclose(x_default[b, :M], prompt, atol=1e-6)


def test_sources_are_constants_and_the_parameter_count_is_the_papers():
  """Trainable: K*m*E (targets) + 2*E*r (W_down, W_up) + 2*E (LayerNorm); sources none."""
  config = util.TEST_CONFIG
  e, m, r, k = config.emb_dim, 6, 7, 2
  sources = np.random.RandomState(0).normal(0, 1, (4, m, e)).astype(np.float32)
  module = prompts.Attempt(sources, num_targets=k, bottleneck=r)
  params = util.create_prompt_params(Transformer(config, prompt=module),
                                     util.frozen_backbone(config))
  count = sum(int(np.size(v)) for v in jax.tree_util.tree_leaves(params))
  assert count == k * m * e + 2 * e * r + 2 * e
  assert sorted(params) == ["attention", "prompts"]
  # Every target starts as the first source prompt (the paper's code).
  np.testing.assert_array_equal(np.asarray(params["prompts"]),
                                np.broadcast_to(sources[0], (k, m, e)))
  # Gradients of the prompt subtree never reach the sources: they are not in it, and changing
  # the array handed in later does not change the module (a read-only copy).
  assert module.source_prompts.value.flags.writeable is False
  sources[:] = 0
  assert np.any(module.source_prompts.value)
  assert (hash(module)
          == hash(prompts.Attempt(module.source_prompts.value, num_targets=k, bottleneck=r)))
  export = prompts.effective_prompt(module, params)
  assert export.shape == (4 + k, m, e)
  np.testing.assert_array_equal(export[:4], module.source_prompts.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"source_prompts": np.zeros((4, 8))}, "give S >= 1 source prompts as [S, m, E]"),
    ({"source_prompts": np.zeros((0, 4, 8))}, "give S >= 1 source prompts"),
    ({"source_prompts": np.full((1, 4, 8), np.nan)}, "NaN"),
    ({"temperature": 0.0}, "Attempt.temperature=0.0"),
    ({"num_targets": 2, "default_task": 2}, "valid: 0..1"),
    ({"bottleneck": 0}, "Attempt.bottleneck=0 must be a positive integer"),
])
def test_bad_settings_are_one_line_errors(kwargs, message):
  kwargs = dict({"source_prompts": np.zeros((2, 4, 8), np.float32)}, **kwargs)
  with pytest.raises(ValueError) as e:
    prompts.Attempt(**kwargs)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_wrong_source_width_is_refused():
  module = prompts.Attempt(np.zeros((2, 4, 16), np.float32))
  with pytest.raises(ConfigError, match="width 16 but the backbone's is 32"):
    util.create_prompt_params(Transformer(util.TEST_CONFIG, prompt=module),
                              util.frozen_backbone(util.TEST_CONFIG))


def test_trains_only_targets_and_attention_and_loss_falls():
  config = util.TEST_CONFIG
  sources = np.random.RandomState(0).normal(0, 1, (3, 4, config.emb_dim)).astype(np.float32)
  model = models.EncoderDecoderModel(Transformer(config,
                                                 prompt=prompts.Attempt(sources, 2, bottleneck=8)))
  backbone = util.frozen_backbone(config)
  prompt = util.create_prompt_params(model.module, backbone)
  batch = {k: jnp.asarray(v) for k, v in util.synthetic_batch(0, batch=8).items()}
  batch["task_index"] = jnp.asarray([0, 1] * 4, jnp.int32)
  losses = []
  for prompt, loss, _, grads in util.model_adam_steps(model, backbone, prompt, batch, 15):
    losses.append(float(loss))
  assert losses[-1] < losses[0] - 0.5, losses
  assert all(np.any(np.asarray(g)) for g in jax.tree_util.tree_leaves(grads))
