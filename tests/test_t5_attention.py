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

from spot_jax.t5 import layers

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
      params, x_q, x_q if self_attention else x_kv, mask, bias, select_form=True), atol=1e-6, rtol=1e-6)
  probe = jnp.asarray(np.random.RandomState(1).randn(*x_q.shape), jnp.float32)
  grad = lambda f: jax.grad(lambda a, b: jnp.sum(f(a, b) * probe), argnums=(0, 1))(x_q, x_kv)
  for got, want in zip(grad(ours), grad(ref)):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_mask_bias_is_computed_once_per_stack():
  """The layer-independent where(mask, bias, -1e10) is shared by every layer after XLA's CSE."""
  from spot_jax import models  # pylint: disable=g-import-not-at-top
  from spot_jax.t5 import Transformer, config_by_name  # pylint: disable=g-import-not-at-top
  cfg = config_by_name("t5_1_1_test", dropout_rate=0.0)
  model = models.EncoderDecoderModel(Transformer(cfg))
  batch = model.dummy_batch(12, 6)
  params = models.unbox(model.init_backbone(jax.random.PRNGKey(0), batch))
  hlo = jax.jit(lambda p, b: model.loss_fn(p, b, None, enable_dropout=False)[0]).lower(
      params, batch).compile().as_text()
  where_ops = [l for l in hlo.splitlines() if " select(" in l and "attention/jit(_where)" in l]
  assert cfg.num_encoder_layers > 1 and cfg.num_decoder_layers > 1
  assert where_ops and all("/layers_0/" in l for l in where_ops), where_ops
