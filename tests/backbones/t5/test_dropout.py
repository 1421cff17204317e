"""Dropout keeps t5x's rate, scaling and mask layout; without randomness nothing changes."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import models, prompts
from spot_jax.backbones.t5 import Transformer, config_by_name, layers
from tests.helpers.prompt_train import create_prompt_params, frozen_backbone


def _model(rate):
  cfg = config_by_name("t5_1_1_test", dropout_rate=rate)
  return models.EncoderDecoderModel(Transformer(cfg, prompt=prompts.PromptTuning(length=4)))


def _batch(seed=0, b=2, t=12, s=6):
  rng = np.random.RandomState(seed)
  tgt = rng.randint(2, 128, size=(b, s)).astype(np.int32)
  tgt[0, -2:] = 0
  return {"encoder_input_tokens": jnp.asarray(rng.randint(2, 128, size=(b, t)), jnp.int32),
          "decoder_target_tokens": jnp.asarray(tgt),
          "decoder_input_tokens": jnp.asarray(np.concatenate([np.zeros((b, 1), np.int32),
                                                              tgt[:, :-1]], 1))}


@pytest.fixture(scope="module")
def params():
  """Random backbone (NumPy-drawn: Flax's eager init compiles op by op) and a fresh prompt."""
  model = _model(0.1)
  backbone = frozen_backbone(config_by_name("t5_1_1_test", dropout_rate=0.0))
  prompt = create_prompt_params(model.module, backbone)
  return models.merge_params(backbone, {"prompt": prompt})


@functools.lru_cache(maxsize=None)
def _jitted_loss_and_grad(rate, enable):
  """One jitted value-and-gradient per (rate, enable): calls with other keys reuse it."""
  model = _model(rate)
  fn = lambda p, b, rng: model.loss_fn(p, b, rng, enable_dropout=enable)[0]
  return jax.jit(jax.value_and_grad(fn))


def _loss_and_grad(model, params, batch, rng, enable):
  rate = model.module.config.dropout_rate
  return _jitted_loss_and_grad(rate, enable)(params, batch, rng)


def test_rate_zero_equals_deterministic(params):
  batch, rng = _batch(), jax.random.PRNGKey(7)
  loss0, grad0 = _loss_and_grad(_model(0.0), params, batch, rng, True)
  loss_det, grad_det = _loss_and_grad(_model(0.1), params, batch, None, False)
  np.testing.assert_allclose(loss0, loss_det, rtol=1e-6, atol=0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), grad0, grad_det)


def test_same_key_same_loss_other_key_other_loss(params):
  model, batch = _model(0.1), _batch()
  a = _loss_and_grad(model, params, batch, jax.random.PRNGKey(3), True)[0]
  b = _loss_and_grad(model, params, batch, jax.random.PRNGKey(3), True)[0]
  c = _loss_and_grad(model, params, batch, jax.random.fold_in(jax.random.PRNGKey(3), 1), True)[0]
  det = _loss_and_grad(model, params, batch, None, False)[0]
  assert float(a) == float(b)
  assert float(a) != float(c) and float(a) != float(det)


def test_every_site_shares_its_mask_along_the_length_axis(params):
  """Like t5x/flaxformer: masks [B, 1, E], [B, 1, F] and [B, H, 1, K] broadcast over positions.

  The attention sites mask heads-major values [B, H, K, D] with [B, H, K, 1]: one draw per key,
  shared by every query (t5x's [B, H, 1, K] on the weights; see the test below).
  """
  model, batch, seen = _model(0.5), _batch(), []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, nn.Dropout) and context.method_name == "__call__":
      seen.append((context.module.path, np.asarray(args[0]), np.asarray(out)))
    return out

  with nn.intercept_methods(record):
    model.loss_fn(params, batch, jax.random.PRNGKey(5), enable_dropout=True)
  paths = {"/".join(p) for p, _, _ in seen}
  assert any("mlp" in p for p in paths) and any("attention" in p for p in paths)
  for path, x, y in seen:
    live = x != 0
    kept, dropped = live & (y != 0), live & (y == 0)
    shared = -1 if "attention" in "/".join(path) else -2
    assert not (kept.any(axis=shared) & dropped.any(axis=shared)).any(), path
    np.testing.assert_allclose(y[kept], x[kept] * 2.0, rtol=1e-6)
    assert dropped.any() and kept.any(), path


@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_keep_fraction_and_scaling(rate):
  x = jnp.ones((64, 3, 4096), jnp.float32)
  y = np.asarray(layers.Dropout(rate).apply({}, x, deterministic=False,
                                              rngs={"dropout": jax.random.PRNGKey(0)}))
  assert (y == y[:, :1]).all()
  keep = (y[:, 0] != 0).mean()
  assert abs(keep - (1 - rate)) < 4 * np.sqrt(rate * (1 - rate) / y[:, 0].size)
  np.testing.assert_allclose(y[y != 0], 1 / (1 - rate), rtol=1e-6)
  np.testing.assert_allclose(y.mean(), 1.0, atol=0.02)


def test_dropout_rng_choices_keep_rate_and_determinism(params):
  """DROPOUT_RNG: RngBitGenerator keys keep the rate and scaling, differ from threefry's masks,
  are a pure function of the step key, and change nothing without dropout."""
  from spot_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  step_key = jax.random.fold_in(jax.random.PRNGKey(5), 3)
  ones = jnp.ones((512, 1024))
  drop = lambda key: nn.Dropout(0.1).apply({}, ones, deterministic=False, rngs={"dropout": key})
  masks = {}
  for impl in train_lib.DROPOUT_RNGS:
    out = drop(train_lib.dropout_key(step_key, impl))
    kept = np.asarray(out != 0)
    assert abs(kept.mean() - 0.9) < 0.003, (impl, kept.mean())
    np.testing.assert_allclose(np.asarray(out)[kept], 1 / 0.9, rtol=1e-6)
    np.testing.assert_array_equal(drop(train_lib.dropout_key(step_key, impl)), out)
    masks[impl] = kept
  assert (masks["unsafe_rbg"] != masks["threefry"]).mean() > 0.1
  model, batch = _model(0.1), _batch()
  off = _loss_and_grad(model, params, batch, None, False)[0]  # a key is unused without dropout
  for impl in ("threefry", "unsafe_rbg"):
    key = train_lib.dropout_key(step_key, impl)
    on = _loss_and_grad(model, params, batch, key, True)[0]
    assert np.isfinite(on) and abs(float(on) - float(off)) > 1e-4
  zero = _model(0.0)
  same = [_loss_and_grad(zero, params, batch, train_lib.dropout_key(step_key, i), True) for i in
          ("threefry", "unsafe_rbg")]
  np.testing.assert_allclose(same[0][0], same[1][0], rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), same[0][1], same[1][1])
  with pytest.raises(ValueError,
                     match="DROPOUT_RNG='philox' is unknown; valid: threefry, rbg, unsafe_rbg"):
    train_lib.make_train_step(model, None, "philox")


class _WeightsDropoutAttention(nn.Module):
  """t5x/flaxformer's placement: the [B, H, 1, K] mask on the softmax weights (same names)."""
  heads: int
  depth: int
  rate: float

  @nn.compact
  def __call__(self, x_q, x_kv, mask, bias, deterministic):
    init = nn.initializers.zeros
    proj = lambda name, x: layers.Dense((self.heads, self.depth), ("embed", "joined_kv"), init,
                                        name=name)(x)
    q, k, v = proj("query", x_q), proj("key", x_kv), proj("value", x_kv)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) + jnp.where(mask, bias, layers.NEG_INF)
    weights = nn.Dropout(self.rate, broadcast_dims=(-2,))(jax.nn.softmax(logits),
                                                          deterministic=deterministic)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    return layers.Dense((x_q.shape[-1],), ("joined_kv", "embed"), init, in_axes=2, name="out")(out)


@pytest.mark.parametrize("impl", ["threefry", "rbg", "unsafe_rbg"])
def test_attention_dropout_on_values_is_t5x_dropout_on_weights(impl):
  """Masking the values' rows is the same product as t5x's mask on the weights, with the very
  same mask: same module path, and bits drawn as [B, H, K, 1] equal those drawn as [B, H, 1, K]."""
  from spot_jax import train as train_lib  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  b, t, e, heads, depth = 2, 9, 12, 3, 4
  x = jnp.asarray(rng.randn(b, t, e), jnp.float32)
  mask = jnp.asarray(np.tril(np.ones((t, t), bool))[None, None].repeat(b, 0))
  bias = jnp.asarray(rng.randn(1, heads, t, t), jnp.float32)
  ours = layers.MultiHeadDotProductAttention(heads, depth, dropout_rate=0.3)
  params = ours.init(jax.random.PRNGKey(0), x, x, mask, bias, deterministic=True)
  key = train_lib.dropout_key(jax.random.PRNGKey(9), impl)
  shape = (b, heads, 1, t)
  np.testing.assert_array_equal(
      jax.random.bernoulli(key, 0.7, shape).reshape(-1),
      jax.random.bernoulli(key, 0.7, (b, heads, t, 1)).reshape(-1))
  t5x_like = _WeightsDropoutAttention(heads, depth, 0.3)
  probe = jnp.asarray(rng.randn(b, t, e), jnp.float32)

  def loss(module, inputs):
    out = module.apply(params, inputs, inputs, mask, bias, deterministic=False,
                       rngs={"dropout": key})
    return jnp.sum(out * probe), out

  (l_ours, out_ours), g_ours = jax.value_and_grad(lambda a: loss(ours, a), has_aux=True)(x)
  (l_ref, out_ref), g_ref = jax.value_and_grad(lambda a: loss(t5x_like, a), has_aux=True)(x)
  det = ours.apply(params, x, x, mask, bias, deterministic=True)
  assert float(jnp.max(jnp.abs(out_ours - det))) > 1e-3  # dropout did something
  np.testing.assert_allclose(out_ours, out_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g_ours, g_ref, rtol=1e-5, atol=1e-5)
