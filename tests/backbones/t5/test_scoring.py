"""Label scores from one encoder pass per input (C labels as segments of one decoder row) equal
each label scored alone by the whole prompted model, for an input prompt and for deep prompts
in all three attentions (whose decoder prefix biases the segments must repeat)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spot_jax import models
from spot_jax.prompts import PrefixTuning, PromptTuning, initializers
from spot_jax.backbones.t5 import Transformer, config_by_name
from tests.helpers.prompt_train import create_prompt_params, frozen_backbone

CONFIG = config_by_name("t5_1_1_test", dropout_rate=0.0)
# Labels of several lengths (EOS = 1, then padding), as class labels are.
LABELS = np.array([[5, 1, 0, 0], [9, 12, 7, 1], [3, 1, 0, 0], [9, 12, 1, 0], [40, 2, 8, 1]],
                  np.int32)


def _direct(module: Transformer, params, tokens: np.ndarray) -> np.ndarray:
  """[B, C]: for each label, the whole model's teacher-forced log-likelihood of that label."""
  out = []
  for label in LABELS:
    targets = np.tile(label, (len(tokens), 1))
    inputs = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
    logits = module.apply({"params": params}, tokens, inputs, targets, enable_dropout=False)
    log_probs = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float64), axis=-1))
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    out.append(np.sum(picked * (targets > 0), axis=-1))
  return np.stack(out, axis=1)


@pytest.mark.parametrize("prompt", [
    PromptTuning(4, prompt_init=initializers.uniform(2.0)),
    PrefixTuning(3),
], ids=["prompt_tuning", "prefix_tuning"])
def test_label_scores_equal_each_label_scored_alone(prompt):
  backbone = frozen_backbone(CONFIG, 0)
  model = models.EncoderDecoderModel(module=Transformer(CONFIG, prompt=prompt))
  params = {**backbone,
            "prompt": create_prompt_params(model.module, backbone, 1, full_model=True)}
  tokens = np.random.RandomState(0).randint(2, CONFIG.vocab_size, size=(6, 9)).astype(np.int32)
  tokens[1, 4:] = tokens[4, 7:] = 0
  got = np.asarray(jax.jit(model.classify_batch)(params, jnp.asarray(tokens),
                                                 jnp.asarray(LABELS)))
  want = _direct(model.module, params, tokens)
  assert got.shape == (6, len(LABELS)) and np.all(got < 0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
