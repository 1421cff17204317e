"""SMoP: routing against a NumPy reference, padding invariance, perturbation, statistics."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import prompts
from spot_jax.backbones.t5 import Transformer
from tests.helpers import prompt_train as util

K, LEN, E = 3, 2, 4
# A hand-set router: each of the first three embedding directions votes for one prompt.
ROUTER = np.array([[3.0, 0.0, -1.0], [0.0, 3.0, 0.0], [-1.0, 0.0, 3.0], [0.5, 0.5, 0.5]],
                  np.float32)
TOKENS = np.array([[5, 6, 1, 0, 0, 0], [7, 1, 0, 0, 0, 0], [8, 9, 10, 11, 1, 0],
                   [12, 13, 14, 15, 16, 1]], np.int32)
TABLE = np.zeros((20, E), np.float32)  # unused by hand-set params, required by the hook


def _embedded(tokens: np.ndarray, seed: int = 0) -> np.ndarray:
  """Inputs whose real-token means point at prompts 0, 1, 2, 0; padding rows are noise."""
  rs = np.random.RandomState(seed)
  x = rs.normal(0, 3.0, tokens.shape + (E,)).astype(np.float32)  # padding: large noise
  directions = [0, 1, 2, 0]
  for b, row in enumerate(tokens):
    n = int((row > 0).sum())
    real = rs.normal(0, 0.3, (n, E)).astype(np.float32)
    real[:, directions[b]] += 1.0
    x[b, :n] = real
  return x


def _params(seed: int = 1) -> dict:
  prompts_ = np.random.RandomState(seed).normal(0, 1, (K, LEN, E)).astype(np.float32)
  return {"prompts": prompts_, "router": {"kernel": ROUTER}}


def _reference_logits(embedded: np.ndarray, tokens: np.ndarray) -> np.ndarray:
  valid = (tokens > 0).astype(np.float64)
  mean = (embedded * valid[..., None]).sum(1) / np.maximum(valid.sum(1), 1)[:, None]
  return mean @ ROUTER.astype(np.float64)


def _reference_probs(embedded: np.ndarray, tokens: np.ndarray) -> np.ndarray:
  logits = _reference_logits(embedded, tokens)
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _run(module: prompts.SMoP, params: dict, embedded: np.ndarray, tokens: np.ndarray, *,
         deterministic: bool, seed: int = 0):
  """-> (x, valid, sown intermediates, aux losses); the router's unperturbed logits, when
  there is a router, are captured as inter["router"]["__call__"][0]."""
  (x, valid), state = module.apply(
      {"params": params}, jnp.asarray(embedded), jnp.asarray(tokens), embedding=TABLE,
      deterministic=deterministic, rngs={"dropout": jax.random.PRNGKey(seed)},
      mutable=["intermediates", "aux_loss"],
      capture_intermediates=lambda mdl, method: isinstance(mdl, nn.Dense))
  inter = jax.tree_util.tree_map(np.asarray, state["intermediates"])
  return np.asarray(x), np.asarray(valid), inter, state.get("aux_loss", {})


def test_linear_routing_matches_numpy_reference():
  params, embedded = _params(), _embedded(TOKENS)
  x, valid, inter, _ = _run(prompts.SMoP(K, LEN), params, embedded, TOKENS, deterministic=True)
  probs = _reference_probs(embedded, TOKENS)
  choice = probs.argmax(-1)
  assert choice.tolist() == [0, 1, 2, 0]  # the hand-set router separates the examples
  np.testing.assert_allclose(inter["router"]["__call__"][0],
                             _reference_logits(embedded, TOKENS), rtol=0, atol=1e-5)
  for b in range(len(TOKENS)):
    want = probs[b, choice[b]] * params["prompts"][choice[b]]
    np.testing.assert_allclose(x[b, :LEN], want, rtol=0, atol=1e-6)
  assert x.shape == (4, LEN + TOKENS.shape[1], E)  # l prompt tokens, not k*l
  np.testing.assert_array_equal(x[:, LEN:], embedded)
  np.testing.assert_array_equal(valid, np.concatenate([np.ones((4, LEN), bool), TOKENS > 0], 1))
  np.testing.assert_array_equal(inter["router_load"][0], [2, 1, 1])
  entropy = -(probs * np.log(probs)).sum(-1).mean()
  np.testing.assert_allclose(inter["router_entropy"][0], entropy, rtol=1e-5)


def test_top2_routing_matches_numpy_reference():
  params, embedded = _params(), _embedded(TOKENS)
  x, _, inter, _ = _run(prompts.SMoP(K, LEN, routing="top2"), params, embedded, TOKENS,
                        deterministic=True)
  probs = _reference_probs(embedded, TOKENS)
  for b in range(len(TOKENS)):
    i1, i2 = np.argsort(-probs[b])[:2]
    want = probs[b, i1] * params["prompts"][i1] + probs[b, i2] * params["prompts"][i2]
    np.testing.assert_allclose(x[b, :LEN], want, rtol=0, atol=1e-6)
  assert inter["router_load"][0].sum() == len(TOKENS)


def test_padding_does_not_change_routing():
  params = _params()
  short = TOKENS
  long = np.pad(TOKENS, ((0, 0), (0, 5)))
  emb_short = _embedded(short)
  emb_long = np.random.RandomState(9).normal(0, 5.0, long.shape + (E,)).astype(np.float32)
  emb_long[:, :short.shape[1]] = np.where((short > 0)[..., None], emb_short,
                                          emb_long[:, :short.shape[1]])
  for routing in ("linear", "top2", "gumbel"):
    module = prompts.SMoP(K, LEN, routing=routing)
    xs, _, inter_s, _ = _run(module, params, emb_short, short, deterministic=True)
    xl, _, inter_l, _ = _run(module, params, emb_long, long, deterministic=True)
    np.testing.assert_allclose(inter_s["router"]["__call__"][0],
                               inter_l["router"]["__call__"][0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(xs[:, :LEN], xl[:, :LEN], rtol=0, atol=1e-6)


def test_perturbation_only_in_training():
  params, embedded = _params(), _embedded(TOKENS)
  perturbed = prompts.SMoP(K, LEN, perturbation_std=1.0)
  plain = prompts.SMoP(K, LEN, perturbation_std=0.0)
  eval_a = _run(perturbed, params, embedded, TOKENS, deterministic=True, seed=0)
  eval_b = _run(perturbed, params, embedded, TOKENS, deterministic=True, seed=1)
  eval_plain = _run(plain, params, embedded, TOKENS, deterministic=True)
  np.testing.assert_array_equal(eval_a[0], eval_b[0])
  np.testing.assert_array_equal(eval_a[0], eval_plain[0])
  train_plain = _run(plain, params, embedded, TOKENS, deterministic=False, seed=3)
  np.testing.assert_array_equal(train_plain[0], eval_plain[0])  # sigma = 0: no noise at all
  train = [_run(perturbed, params, embedded, TOKENS, deterministic=False, seed=s)
           for s in range(3)]
  for out in train:  # the perturbed probabilities rescale (or re-pick) the prompts
    assert np.abs(out[0][:, :LEN] - eval_a[0][:, :LEN]).max() > 1e-3
    assert out[2]["router_load"][0].sum() == len(TOKENS)
  assert not np.array_equal(train[0][0], train[1][0])


def test_gumbel_straight_through():
  params, embedded = _params(), _embedded(TOKENS)
  module = prompts.SMoP(K, LEN, routing="gumbel", perturbation_std=0.0, gumbel_temperature=0.5)
  x, _, inter, _ = _run(module, params, embedded, TOKENS, deterministic=True)
  choice = _reference_probs(embedded, TOKENS).argmax(-1)
  np.testing.assert_allclose(x[:, :LEN], params["prompts"][choice], rtol=0, atol=1e-6)
  x, _, inter, _ = _run(module, params, embedded, TOKENS, deterministic=False, seed=4)
  for b in range(len(TOKENS)):  # the forward pass uses one whole prompt, weight 1
    dist = np.abs(x[b, :LEN][None] - params["prompts"]).max(axis=(1, 2))
    assert dist.min() < 1e-6
  assert inter["router_load"][0].sum() == len(TOKENS)

  def out_sum(kernel):
    p = {"prompts": params["prompts"], "router": {"kernel": kernel}}
    (x, _), _ = module.apply({"params": p}, jnp.asarray(embedded), jnp.asarray(TOKENS),
                             embedding=TABLE, deterministic=False,
                             rngs={"dropout": jax.random.PRNGKey(4)}, mutable=["intermediates"])
    return jnp.sum(x[:, :LEN] * jnp.arange(1.0, E + 1.0))

  assert np.abs(np.asarray(jax.grad(out_sum)(jnp.asarray(ROUTER)))).max() > 1e-4


def test_stochastic_and_single_routing():
  params, embedded = _params(), _embedded(TOKENS)
  module = prompts.SMoP(K, LEN, routing="stochastic")
  x, _, inter, _ = _run(module, {"prompts": params["prompts"]}, embedded, TOKENS,
                        deterministic=True)
  np.testing.assert_allclose(x[:, :LEN], np.broadcast_to(params["prompts"].mean(0), (4, LEN, E)),
                             rtol=0, atol=1e-6)
  np.testing.assert_allclose(inter["router_load"][0].sum(), len(TOKENS))
  many = np.tile(TOKENS, (16, 1))
  x, _, inter, _ = _run(module, {"prompts": params["prompts"]}, np.tile(embedded, (16, 1, 1)),
                        many, deterministic=False)
  dist = np.abs(x[:, None, :LEN] - params["prompts"][None]).max(axis=(2, 3))  # [B, K]
  assert dist.min(axis=1).max() < 1e-6  # every example gets one prompt, unscaled
  assert set(dist.argmin(axis=1).tolist()) == set(range(K))  # and all prompts get used
  assert inter["router_load"][0].sum() == len(many)

  single = prompts.SMoP(1, LEN, routing="single")
  one = params["prompts"][:1]
  for deterministic in (True, False):
    x, _, inter, _ = _run(single, {"prompts": one}, embedded, TOKENS, deterministic=deterministic)
    np.testing.assert_array_equal(x[:, :LEN], np.broadcast_to(one[0], (4, LEN, E)))
    np.testing.assert_array_equal(inter["router_load"][0], [4.0])


def test_load_balancing_loss_matches_switch_formula():
  params, embedded = _params(), _embedded(TOKENS)
  module = prompts.SMoP(K, LEN, load_balancing_weight=0.01)
  _, _, inter, aux = _run(module, params, embedded, TOKENS, deterministic=True)
  probs = _reference_probs(embedded, TOKENS)
  fraction = np.bincount(probs.argmax(-1), minlength=K) / len(TOKENS)
  want = 0.01 * K * np.sum(fraction * probs.mean(0))
  np.testing.assert_allclose(np.asarray(aux["load_balancing"][0]), want, rtol=1e-5)
  _, _, _, none = _run(prompts.SMoP(K, LEN), params, embedded, TOKENS, deterministic=True)
  assert not none  # no loss sown when the weight is 0


def test_router_parameters_and_axes_in_the_backbone():
  model = Transformer(util.TEST_CONFIG, prompt=prompts.SMoP(4, 5))
  batch, frozen = util.synthetic_batch(0, batch=2), util.frozen_backbone()
  boxed = jax.eval_shape(lambda: model.apply(
      {"params": frozen}, batch["encoder_input_tokens"],
      method=Transformer.embed_encoder_input,
      rngs={"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(0)},
      mutable=["params"])[1]["params"]["prompt"])
  assert boxed["prompts"].names == ("prompts", "prompt", "prompt_embed")
  assert boxed["prompts"].value.shape == (4, 5, 32)
  assert boxed["router"]["kernel"].names == ("prompt_embed", "prompts")
  assert boxed["router"]["kernel"].value.shape == (32, 4)
  assert set(boxed["router"]) == {"kernel"}  # no bias
  stochastic = Transformer(util.TEST_CONFIG, prompt=prompts.SMoP(4, 5, routing="stochastic"))
  params = util.create_prompt_params(stochastic, util.frozen_backbone())
  assert set(params) == {"prompts"}
  x, valid = stochastic.apply({"params": {**util.frozen_backbone(), "prompt": params}},
                              batch["encoder_input_tokens"], enable_dropout=False,
                              method=Transformer.encode)
  assert x.shape == (2, 5 + batch["encoder_input_tokens"].shape[1], 32)  # l + T


def test_invalid_smop_settings_name_the_problem():
  with pytest.raises(ValueError, match="SMoP.routing='soft' is unknown"):
    prompts.SMoP(routing="soft")
  with pytest.raises(ValueError, match="routing='top2' needs num_prompts >= 2, got 1"):
    prompts.SMoP(1, routing="top2")
  with pytest.raises(ValueError, match="routing='single' needs num_prompts == 1, got 4"):
    prompts.SMoP(4, routing="single")
  with pytest.raises(ValueError, match="load_balancing_weight needs a learned router"):
    prompts.SMoP(4, routing="stochastic", load_balancing_weight=0.1)
  with pytest.raises(ValueError, match="SMoP.perturbation_std=-1.0 must be a number >= 0"):
    prompts.SMoP(perturbation_std=-1.0)
  with pytest.raises(ValueError, match="SMoP.gumbel_temperature=0.0 must be a number > 0"):
    prompts.SMoP(routing="gumbel", gumbel_temperature=0.0)
  with pytest.raises(ValueError, match="SMoP.num_prompts=0 must be a positive integer"):
    prompts.SMoP(0)
