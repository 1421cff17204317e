"""The attention layer equals t5x's formula: softmax(q.k + bias + mask_bias) . v.

t5x/flaxformer turn the mask into an additive bias (0 where visible, -1e10 elsewhere) and add
it to the position bias. The layer computes heads-major batched matmuls and adds that combined
bias; these tests pin it to the textbook [B, T, H, D] einsum layout, in values and input
gradients, with padded keys, fully masked query rows and without a position bias, and check
that the values also equal the select form where(mask, logits, -1e10).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax.backbones.t5 import layers

H, D, E = 3, 4, 10


def _reference(params, x_q, x_kv, mask, bias, select_form=False):
  p = {k: params[k]["kernel"] for k in ("query", "key", "value", "out")}
  q = (x_q @ p["query"]).reshape(x_q.shape[:2] + (H, D))
  k = (x_kv @ p["key"]).reshape(x_kv.shape[:2] + (H, D))
  v = (x_kv @ p["value"]).reshape(x_kv.shape[:2] + (H, D))
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k)
  if bias is not None:
    logits = logits + bias
  if mask is not None:
    logits = (jnp.where(mask, logits, layers.NEG_INF) if select_form
              else logits + jnp.where(mask, 0.0, layers.NEG_INF))
  out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits), v)
  return out.reshape(out.shape[:2] + (H * D,)) @ p["out"]


def _inputs(seed, b, q, k):
  rng = np.random.RandomState(seed)
  x_q = jnp.asarray(rng.randn(b, q, E), jnp.float32)
  x_kv = jnp.asarray(rng.randn(b, k, E), jnp.float32)
  valid_k = np.ones((b, k), bool)
  valid_k[0, k - 3:] = False  # padded keys
  valid_q = np.ones((b, q), bool)
  valid_q[1, q - 2:] = False  # fully masked query rows
  mask = jnp.asarray(valid_q[:, None, :, None] & valid_k[:, None, None, :])
  bias = jnp.asarray(rng.randn(1, H, q, k), jnp.float32)
  return x_q, x_kv, mask, bias


@pytest.mark.parametrize("self_attention", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_matches_t5x_formula_values_and_gradients(self_attention, with_bias):
  x_q, x_kv, mask, bias = _inputs(0, 2, 7, 7 if self_attention else 9)
  if self_attention:
    x_kv = x_q
  bias = bias if with_bias else None
  attn = layers.MultiHeadDotProductAttention(H, D, dropout_rate=0.0)
  params = attn.init(jax.random.PRNGKey(0), x_q, x_kv, mask, bias, deterministic=True)["params"]
  params = jax.tree.map(lambda a: a.unbox() if hasattr(a, "unbox") else a, params,
                        is_leaf=lambda a: hasattr(a, "unbox"))

  def ours(xq, xkv):
    xkv = xq if self_attention else xkv
    return attn.apply({"params": params}, xq, xkv, mask, bias, deterministic=True)

  def ref(xq, xkv):
    xkv = xq if self_attention else xkv
    return _reference(params, xq, xkv, mask, bias)

  np.testing.assert_allclose(ours(x_q, x_kv), ref(x_q, x_kv), atol=1e-6, rtol=1e-6)
  np.testing.assert_allclose(ours(x_q, x_kv), _reference(
      params, x_q, x_q if self_attention else x_kv, mask, bias, select_form=True),
                             atol=1e-6, rtol=1e-6)
  probe = jnp.asarray(np.random.RandomState(1).randn(*x_q.shape), jnp.float32)
  grad = lambda f: jax.grad(lambda a, b: jnp.sum(f(a, b) * probe), argnums=(0, 1))(x_q, x_kv)
  for got, want in zip(grad(ours), grad(ref)):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_mask_bias_is_computed_once_per_stack():
  """The layer-independent where(mask, bias, -1e10) is shared by every layer after XLA's CSE."""
  from spot_jax import models  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.t5 import Transformer, config_by_name  # pylint: disable=g-import-not-at-top
  cfg = config_by_name("t5_1_1_test", dropout_rate=0.0)
  model = models.EncoderDecoderModel(Transformer(cfg))
  batch = model.dummy_batch(12, 6)
  # shapes are all the compiler needs (an eager init would compile op by op)
  params = jax.eval_shape(lambda: models.unbox(model.init_backbone(jax.random.PRNGKey(0), batch)))
  hlo = jax.jit(lambda p, b: model.loss_fn(p, b, None, enable_dropout=False)[0]).lower(
      params, batch).compile().as_text()
  where_ops = [l for l in hlo.splitlines() if " select(" in l and "attention/jit(_where)" in l]
  assert cfg.num_encoder_layers > 1 and cfg.num_decoder_layers > 1
  assert where_ops and all("/layers_0/" in l for l in where_ops), where_ops


def _autodiff_attend(query, key, value, addend):
  """`layers.attend` without its written-out backward pass: JAX differentiates jax.nn.softmax."""
  logits = jnp.einsum("bhqd,bhkd->bhqk", query, key)
  if addend is not None:
    logits = logits + addend
  return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(logits).astype(value.dtype), value)


@pytest.mark.parametrize("addend_shape", [(2, 3, 5, 7), (1, 3, 5, 7), (2, 1, 5, 7), None])
def test_attend_backward_equals_autodiff(addend_shape):
  """The hand-written VJP equals JAX's derivative for every input, the addend's broadcast
  dimensions included (the position bias is [1, H, Q, K], a cross-attention mask [B, 1, Q, K])."""
  rng = np.random.RandomState(3)
  q, k, v = (jnp.asarray(rng.randn(*s), jnp.float32)
             for s in ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4)))
  addend = None if addend_shape is None else jnp.asarray(rng.randn(*addend_shape), jnp.float32)
  if addend is not None:
    addend = addend.at[..., -2:].set(layers.NEG_INF)  # masked keys, as the mask bias makes them
  probe = jnp.asarray(rng.randn(2, 3, 5, 4), jnp.float32)
  argnums = (0, 1, 2) if addend is None else (0, 1, 2, 3)
  grad = lambda f: jax.grad(lambda *a: jnp.sum(f(*a) * probe), argnums=argnums)(q, k, v, addend)
  np.testing.assert_allclose(layers.attend(q, k, v, addend), _autodiff_attend(q, k, v, addend),
                             rtol=1e-6, atol=1e-6)
  for got, want in zip(grad(layers.attend), grad(_autodiff_attend)):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_attend_keeps_dtypes_bfloat16_values():
  """float32 logits with bfloat16 values (float32_logits): cotangents keep each input's dtype."""
  rng = np.random.RandomState(4)
  q, k = (jnp.asarray(rng.randn(2, 3, 5, 4), jnp.float32) for _ in range(2))
  v = jnp.asarray(rng.randn(2, 3, 5, 4), jnp.bfloat16)
  loss = lambda f: lambda a, b, c: jnp.sum(f(a, b, c, None).astype(jnp.float32))
  got = jax.grad(loss(layers.attend), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(_autodiff_attend), argnums=(0, 1, 2))(q, k, v)
  assert [g.dtype for g in got] == [jnp.float32, jnp.float32, jnp.bfloat16]
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                               rtol=2e-2, atol=2e-2)


def test_position_bias_gradient_equals_reference():
  """Model tuning trains the relative position bias: its gradient passes through the addend."""
  x_q, _, mask, bias = _inputs(2, 2, 6, 6)
  attn = layers.MultiHeadDotProductAttention(H, D, dropout_rate=0.0)
  params = attn.init(jax.random.PRNGKey(0), x_q, x_q, mask, bias, deterministic=True)["params"]
  params = jax.tree.map(lambda a: a.unbox() if hasattr(a, "unbox") else a, params,
                        is_leaf=lambda a: hasattr(a, "unbox"))
  probe = np.random.RandomState(5).randn(*x_q.shape).astype(np.float32)
  # Padding queries (the fully masked rows) carry no loss, as in a model. t5x's additive form
  # would pass their gradient to the bias through -1e10 + bias == -1e10; the select does not.
  probe[np.asarray(~mask.any(axis=(1, 3)))] = 0.0
  ours = jax.grad(lambda b: jnp.sum(attn.apply({"params": params}, x_q, x_q, mask, b,
                                                deterministic=True) * probe))(bias)
  ref = jax.grad(lambda b: jnp.sum(_reference(params, x_q, x_q, mask, b) * probe))(bias)
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
