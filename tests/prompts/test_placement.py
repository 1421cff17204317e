"""Prompt placement: positions and masks on padded batches, and padding-invariance in the model."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import prompts
from spot_jax.backbones.t5 import Transformer
from tests.helpers import prompt_train as util

# Row lengths 3, 5 (full), 1 and 0 (an all-padding row) on T = 5.
TOKENS = np.array([[7, 8, 1, 0, 0], [4, 5, 6, 9, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.int32)
L, E = 2, 3


def _inputs():
  batch, length = TOKENS.shape
  # embedded[b, t] = 100 b + t + 1 (every entry distinct and positive); prompt rows negative.
  embedded = (100 * np.arange(batch)[:, None] + np.arange(length)[None] + 1).astype(np.float32)
  embedded = np.repeat(embedded[..., None], E, axis=-1)
  prompt = -np.repeat(np.arange(1, L + 1, dtype=np.float32)[:, None], E, axis=-1)
  return embedded, prompt


def _expected(placement: str):
  embedded, prompt = _inputs()
  rows, masks = [], []
  for b, tokens in enumerate(TOKENS):
    valid = list(tokens > 0)
    x = list(embedded[b])
    n = max([t + 1 for t, v in enumerate(valid) if v], default=0)
    at = {"prefix": 0, "after_bos": 1, "suffix": n}[placement]
    rows.append(np.stack(x[:at] + list(prompt) + x[at:]))
    masks.append(valid[:at] + [True] * L + valid[at:])
  return np.stack(rows), np.array(masks)


@pytest.mark.parametrize("placement", prompts.PLACEMENTS)
def test_combine_positions_and_masks(placement):
  embedded, prompt = _inputs()
  x, valid = jax.jit(prompts.combine, static_argnums=3)(
      jnp.asarray(prompt), jnp.asarray(embedded), jnp.asarray(TOKENS > 0), placement)
  want_x, want_valid = _expected(placement)
  np.testing.assert_array_equal(np.asarray(x), want_x)
  np.testing.assert_array_equal(np.asarray(valid), want_valid)
  assert valid.dtype == jnp.bool_ and x.dtype == jnp.float32


def test_combine_per_example_prompts_and_dtype():
  embedded, prompt = _inputs()
  per_example = np.stack([prompt * (b + 1) for b in range(TOKENS.shape[0])])
  x, _ = prompts.combine(jnp.asarray(per_example), jnp.asarray(embedded, jnp.bfloat16),
                         jnp.asarray(TOKENS > 0), "suffix")
  assert x.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(x[0, 3:5], np.float32), per_example[0])
  np.testing.assert_array_equal(np.asarray(x[1, 5:7], np.float32), per_example[1])


def test_combine_rejects_bad_shapes_and_placements():
  embedded, prompt = _inputs()
  with pytest.raises(ValueError, match="does not fit an input of shape"):
    prompts.combine(jnp.zeros((L, E + 1)), jnp.asarray(embedded), jnp.asarray(TOKENS > 0))
  with pytest.raises(ValueError,
                     match="placement='infix' is unknown; valid: prefix, after_bos, suffix"):
    prompts.combine(jnp.asarray(prompt), jnp.asarray(embedded), jnp.asarray(TOKENS > 0), "infix")


def _pad(tokens: np.ndarray, length: int) -> np.ndarray:
  return np.pad(tokens, ((0, 0), (0, length - tokens.shape[1])))


@pytest.mark.parametrize("placement", prompts.PLACEMENTS)
def test_backbone_outputs_at_real_positions_do_not_depend_on_padding(placement):
  """Encoder outputs at valid positions and decoder logits are the same for any padding."""
  module = prompts.PromptTuning(3, placement=placement)
  model = Transformer(util.TEST_CONFIG, prompt=module)
  frozen = util.frozen_backbone()
  params = {**frozen, "prompt": util.create_prompt_params(model, frozen)}
  batch = util.synthetic_batch(5, batch=4, length=6)

  def run(m, tokens, decoder_tokens):
    return m.encode(tokens, enable_dropout=False), m(tokens, decoder_tokens, enable_dropout=False)

  apply = jax.jit(lambda p, t, d: model.apply({"params": p}, t, d, method=run))
  short, long = batch["encoder_input_tokens"], _pad(batch["encoder_input_tokens"], 11)
  (enc_s, valid_s), out_s = apply(params, short, batch["decoder_input_tokens"])
  (enc_l, valid_l), out_l = apply(params, long, batch["decoder_input_tokens"])
  assert enc_s.shape == (4, 3 + 6, 32) and enc_l.shape == (4, 3 + 11, 32)
  for b in range(4):
    real_s = np.asarray(enc_s[b])[np.asarray(valid_s[b])]
    real_l = np.asarray(enc_l[b])[np.asarray(valid_l[b])]
    assert real_s.shape[0] == 3 + int((short[b] > 0).sum())
    np.testing.assert_allclose(real_s, real_l, rtol=0, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out_s), np.asarray(out_l), rtol=0, atol=1e-5)


def test_prompt_dtype_follows_the_backbone():
  config = util.TEST_CONFIG.replace(dtype="bfloat16")
  module = prompts.PromptTuning(2)
  model = Transformer(config, prompt=module)
  frozen = util.frozen_backbone()
  params = util.create_prompt_params(model, frozen)
  assert params["prompt"].dtype == jnp.float32  # parameters stay float32
  x, _ = model.apply({"params": {**frozen, "prompt": params}},
                     jnp.asarray(TOKENS), method=Transformer.embed_encoder_input)
  assert x.dtype == jnp.bfloat16
  mismatched = Transformer(config, prompt=prompts.PromptTuning(2, dtype="float32"))
  with pytest.raises(ValueError,
                     match="PromptTuning.dtype=float32 but the backbone embeds in bfloat16"):
    util.create_prompt_params(mismatched, frozen)
