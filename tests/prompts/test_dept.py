"""DePT: rank 0 / B = 0 is Prompt Tuning, the offset against NumPy and only at real positions
(padded and bucketed), the parameter count, axes, the two learning rates and bad settings."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from spot_jax import prompts
from spot_jax.errors import ConfigError
from spot_jax.prompts import placement as placement_lib
from spot_jax.backbones.t5 import Transformer
from spot_jax.train import optimizers
from tests.helpers import bucketing, prompt_train as util
from tests.helpers.bucketing_task import BUCKETS, WINDOW, _cfg

M, S, R, E = 3, 12, 4, util.TEST_CONFIG.emb_dim
TOKENS = np.array([[5, 6, 7, 1, 0, 0, 0, 0],
                   [9, 8, 7, 6, 5, 4, 3, 1],
                   [4, 1, 0, 0, 0, 0, 0, 0]], np.int32)


def _random_params(rank: int, seed: int = 0) -> dict:
  """Trained-looking parameters: nothing is at its initial value (B is not zero)."""
  rs = np.random.RandomState(seed)
  params = {"prompt": rs.normal(0, 1, (M, E)).astype(np.float32)}
  if rank:
    params["offset"] = {"a": rs.normal(0, 1, (S, rank)).astype(np.float32),
                        "b": rs.normal(0, 1, (rank, E)).astype(np.float32)}
  return params


def _logits(module, params, tokens=TOKENS):
  frozen = util.frozen_backbone()
  decoder = np.array([[0, 5, 6]] * len(tokens), np.int32)
  return np.asarray(Transformer(util.TEST_CONFIG, prompt=module).apply(
      {"params": {**frozen, "prompt": params}}, jnp.asarray(tokens), jnp.asarray(decoder),
      enable_dropout=False))


def _embed(module, params, tokens, embedded):
  x, valid = module.apply({"params": params}, jnp.asarray(embedded), jnp.asarray(tokens),
                          embedding=jnp.zeros((10, E)), deterministic=True)
  return np.asarray(x), np.asarray(valid)


def test_rank_zero_and_zero_b_are_prompt_tuning_exactly():
  pt = prompts.PromptTuning(M)
  params = _random_params(rank=R)
  want = _logits(pt, {"prompt": params["prompt"]})
  assert np.array_equal(_logits(prompts.DePT(M, max_length=S, rank=0),
                                {"prompt": params["prompt"]}),
                        want)
  zero_b = {"prompt": params["prompt"], "offset": {"a": params["offset"]["a"],
                                                   "b": np.zeros((R, E), np.float32)}}
  assert np.array_equal(_logits(prompts.DePT(M, max_length=S, rank=R), zero_b), want)
  # the offset is really used: a nonzero B changes the logits
  assert np.abs(_logits(prompts.DePT(M, max_length=S, rank=R), params) - want).max() > 1e-3
  # and the initialiser starts at B = 0: a fresh DePT model is Prompt Tuning of length m
  module = prompts.DePT(M, max_length=S, rank=R)
  fresh = util.create_prompt_params(Transformer(util.TEST_CONFIG, prompt=module),
                                    util.frozen_backbone())
  assert np.all(np.asarray(fresh["offset"]["b"]) == 0) and np.abs(fresh["offset"]["a"]).max() > 0
  assert np.abs(fresh["offset"]["a"]).max() <= 1 / np.sqrt(R)
  assert np.array_equal(_logits(module, fresh), _logits(pt, {"prompt": fresh["prompt"]}))


@pytest.mark.parametrize("placement", ["prefix", "suffix"])
@pytest.mark.parametrize("alpha", [8.0, 2.5])
def test_offset_is_the_formula_at_real_positions_only_padded_and_bucketed(placement, alpha):
  """x' - x = (alpha / sqrt(r)) (A B)_t at each real token t, 0 at padding and prompt positions,
  and a narrower (bucketed) batch of the same rows gets the same values."""
  module = prompts.DePT(M, max_length=S, rank=R, alpha=alpha, placement=placement)
  params = _random_params(R)
  p = {k: np.asarray(v, np.float64) for k, v in params["offset"].items()}
  offset = alpha / np.sqrt(R) * p["a"] @ p["b"]  # [S, E] in float64
  embedded = np.random.RandomState(1).normal(0, 1, TOKENS.shape + (E,)).astype(np.float32)
  x, valid = _embed(module, params, TOKENS, embedded)
  # the same combination without the offset: the difference is the offset, where it belongs
  plain, plain_valid = placement_lib.combine(jnp.asarray(params["prompt"]), jnp.asarray(embedded),
                                             jnp.asarray(TOKENS > 0), placement)
  np.testing.assert_array_equal(valid, np.asarray(plain_valid))
  diff = x - np.asarray(plain)
  for b, row in enumerate(TOKENS):
    n = int(np.sum(row > 0))
    start = M if placement == "prefix" else 0  # suffix: the inputs come first, P after them
    np.testing.assert_allclose(diff[b, start:start + n], offset[:n], rtol=0, atol=2e-5)
    assert np.all(diff[b, start + n:] == 0) and np.all(diff[b, :start] == 0)  # padding, prompt
  # bucketed: the rows padded to 4 (the longest real row here) instead of 8
  short = TOKENS[[0, 2], :4]
  x_short, _ = _embed(module, params, short, embedded[[0, 2], :4])
  x_long, _ = _embed(module, params, TOKENS[[0, 2]], embedded[[0, 2]])
  real = (short > 0).sum(1)
  for b in range(2):
    start = M if placement == "prefix" else 0
    np.testing.assert_array_equal(x_short[b, start:start + real[b]],
                                  x_long[b, start:start + real[b]])


def test_per_example_losses_equal_fixed_and_bucketed(task_name):  # pylint: disable=redefined-outer-name
  """The trainer's loss of each example is the same padded to 64 or to its length bucket."""
  got, want = bucketing.losses_fixed_and_bucketed(
      _cfg(task_name), prompts.DePT(4, max_length=64, rank=6), WINDOW, BUCKETS)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_parameter_count_is_the_papers():
  """m E + s r + r E (DePT, Sec. 2): with T5-Base's width and the paper's budget, PT-100's."""
  for m, s, r in ((3, 12, 4), (5, 8, 1), (2, 9, 0)):
    module = prompts.DePT(m, max_length=s, rank=r)
    params = util.create_prompt_params(Transformer(util.TEST_CONFIG, prompt=module),
                                       util.frozen_backbone())
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    assert count == m * E + s * r + r * E
  assert 40 * 768 + 256 * 45 + 45 * 768 == 60 * 768 + 256 * 30 + 30 * 768 == 100 * 768


def test_parameter_axes():
  model = Transformer(util.TEST_CONFIG, prompt=prompts.DePT(M, max_length=S, rank=R))
  batch = util.synthetic_batch(0, batch=2)
  boxed = jax.eval_shape(lambda: model.apply(
      {"params": util.frozen_backbone()}, batch["encoder_input_tokens"],
      method=Transformer.embed_encoder_input, rngs={"params": jax.random.PRNGKey(0)},
      mutable=["params"])[1]["params"]["prompt"])
  assert boxed["prompt"].names == ("prompt", "prompt_embed")
  assert boxed["offset"]["a"].names == ("prompt", "prompt_mlp")
  assert boxed["offset"]["b"].names == ("prompt_mlp", "prompt_embed")


def test_two_learning_rates_update_each_group_at_its_rate():
  """The multi-transform gives the prompt optimizer(lr1) and the offset optimizer(lr2), each with
  its own state: the same updates as the two optimizers run on their subtrees alone."""
  params = {"prompt": _random_params(R, seed=3)}
  rs = np.random.RandomState(4)
  grads = jax.tree.map(lambda x: jnp.asarray(rs.normal(0, 1, x.shape), jnp.float32), params)
  for make in (optimizers.adam, optimizers.adafactor):
    tx = optimizers.two_learning_rates(make, learning_rate=0.3, second_learning_rate=1e-3)
    state = tx.init(params)
    prompt_tx, offset_tx = make(learning_rate=0.3), make(learning_rate=1e-3)
    prompt_state = prompt_tx.init(params["prompt"]["prompt"])
    offset_state = offset_tx.init(params["prompt"]["offset"])
    for _ in range(2):
      updates, state = tx.update(grads, state, params)
      want_p, prompt_state = prompt_tx.update(grads["prompt"]["prompt"], prompt_state,
                                              params["prompt"]["prompt"])
      want_o, offset_state = offset_tx.update(grads["prompt"]["offset"], offset_state,
                                              params["prompt"]["offset"])
      np.testing.assert_allclose(updates["prompt"]["prompt"], want_p, rtol=1e-6, atol=1e-9)
      for k in ("a", "b"):
        np.testing.assert_allclose(updates["prompt"]["offset"][k], want_o[k], rtol=1e-6, atol=1e-12)
      params = optax.apply_updates(params, updates)
    assert float(optimizers.current_learning_rate(state)) == pytest.approx(0.3)
  ratio = (np.abs(np.asarray(updates["prompt"]["prompt"])).mean()
           / np.abs(np.asarray(updates["prompt"]["offset"]["b"])).mean())
  assert ratio > 30  # 0.3 against 1e-3: the rates really differ


def test_bad_settings_are_one_line_config_errors():
  cases = [(dict(length=0, max_length=8), "DePT.length=0"),
           (dict(length=2, max_length=0), "DePT.max_length=0"),
           (dict(length=2, max_length=8, rank=-1), "DePT.rank=-1"),
           (dict(length=2, max_length=8, alpha=0.0), "DePT.alpha=0.0"),
           (dict(length=2, max_length=8, placement="middle"), "DePT.placement='middle' is unknown")]
  for kwargs, message in cases:
    with pytest.raises(ValueError, match=message) as e:
      prompts.DePT(**kwargs)
    assert "\n" not in str(e.value)
  with pytest.raises(ConfigError, match="has 8 positions but DePT.max_length=6"):
    _embed(prompts.DePT(M, max_length=6, rank=2), _random_params(0),
           TOKENS, np.zeros(TOKENS.shape + (E,), np.float32))
  with pytest.raises(ConfigError, match="second_subtrees='offset'"):
    optimizers.two_learning_rates(second_subtrees="offset")
  with pytest.raises(ConfigError, match="pass the `prompt` subtree of a DePT model of rank 4"):
    prompts.DePT(M, max_length=S, rank=4).fold({"prompt": np.zeros((M, E))})


def test_export_and_fold():
  module = prompts.DePT(M, max_length=S, rank=R)
  params = _random_params(R)
  np.testing.assert_array_equal(prompts.effective_prompt(module, params), params["prompt"])
  extra = prompts.export_arrays(module, params)
  offset = module.fold(params)["offset"]
  assert set(extra) == {"offset"} and offset.shape == (S, E)
  np.testing.assert_allclose(extra["offset"], 8.0 / np.sqrt(R) * params["offset"]["a"].astype(
      np.float64) @ params["offset"]["b"], rtol=0, atol=2e-5)
  assert prompts.export_arrays(prompts.DePT(M, max_length=S, rank=0), _random_params(0)) == {}
  assert prompts.export_arrays(prompts.PromptTuning(M), {"prompt": params["prompt"]}) == {}
  boxed = nn.meta.unbox(params)
  assert module.fold(boxed)["prompt"].shape == (M, E)


def test_trainer_refuses_inputs_longer_than_the_offset_before_any_work(tmp_path):
  from spot_jax import data, models  # pylint: disable=g-import-not-at-top
  from spot_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  model = models.EncoderDecoderModel(Transformer(util.TEST_CONFIG,
                                                 prompt=prompts.DePT(M, max_length=32, rank=R)))
  cfg = data.DatasetConfig("spot_synthetic_sentiment_v100", {"inputs": 48, "targets": 12},
                           module="tasks.synthetic")
  with pytest.raises(ConfigError, match=r"TASK_FEATURE_LENGTHS\['inputs'\]=48 is longer than the "
                                        r"prompt method's max input length 32") as e:
    train_lib.train(model=model, train_dataset_cfg=cfg, total_steps=1,
                    model_dir=str(tmp_path / "run"))
  assert "\n" not in str(e.value) and not (tmp_path / "run").exists()
