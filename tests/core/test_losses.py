"""The token loss against a NumPy double-precision reference;
the accuracy's argmax against NumPy's."""
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import losses


def test_first_argmax_equals_argmax_with_ties():
  rng = np.random.RandomState(0)
  x = rng.randint(-3, 4, size=(6, 5, 40)).astype(np.float32)  # many ties
  x[0, 0] = 0.0  # a row of equal values: the first index
  x[1, 1, :] = -np.inf
  x[1, 1, 7] = 2.0
  x[2, 2, [3, 30]] = np.inf  # two maxima at +inf: the first
  x[3] = rng.randn(5, 40)
  np.testing.assert_array_equal(losses.first_argmax(jnp.asarray(x)), np.argmax(x, -1))


@pytest.mark.parametrize("normalizer",
                         [losses.NUM_REAL_TARGET_TOKENS, losses.NUM_EXAMPLES, 5.0, None])
def test_loss_and_metrics_equal_numpy(normalizer):
  rng = np.random.RandomState(1)
  logits = rng.randn(3, 4, 11).astype(np.float32) * 3
  targets = rng.randint(0, 11, size=(3, 4))
  targets[0, :2] = np.argmax(logits[0, :2], -1)  # some correct tokens
  weights = np.ones((3, 4), np.float32)
  weights[2, 2:] = 0.0
  loss, m = losses.cross_entropy_with_z_loss(jnp.asarray(logits), jnp.asarray(targets),
                                             jnp.asarray(weights), z_loss=1e-2,
                                             loss_normalizing_factor=normalizer)
  x = logits.astype(np.float64)
  log_z = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
  ce = log_z - np.take_along_axis(x, targets[..., None], -1)[..., 0]
  ce_sum, z_sum = (ce * weights).sum(), (1e-2 * log_z ** 2 * weights).sum()
  norm = {losses.NUM_REAL_TARGET_TOKENS: weights.sum(), losses.NUM_EXAMPLES: 3.0, 5.0: 5.0,
          None: 1.0}[normalizer]
  np.testing.assert_allclose(float(loss), (ce_sum + z_sum) / norm, rtol=1e-5)
  np.testing.assert_allclose(float(m["cross_entropy_sum"]), ce_sum, rtol=1e-5)
  np.testing.assert_allclose(float(m["z_loss_sum"]), z_sum, rtol=1e-5)
  assert float(m["num_tokens"]) == weights.sum()
  assert float(m["correct_tokens"]) == ((np.argmax(logits, -1) == targets) * weights).sum() >= 2
