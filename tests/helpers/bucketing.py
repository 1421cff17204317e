"""The per-example loss of a prompt method on fixed-length and on length-bucketed batches.

Shared by tests/data/test_bucketing.py and the prompt-method tests: every method must give each
example the same loss whether its batch is padded to the task's input length or to its bucket.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import data, models
from spot_jax.data import bucketing
from spot_jax.backbones.t5 import Transformer, config_by_name
from tests.helpers.prompt_train import frozen_backbone


def losses_fixed_and_bucketed(cfg: data.DatasetConfig, prompt: nn.Module, window: int,
                              buckets: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
  """(bucketed, fixed): the trainer's loss of each example of the narrowest bucketed batches of
  the first window, padded to their bucket and to the task's full input length."""
  full = cfg.task_feature_lengths["inputs"]
  config = config_by_name("t5_1_1_byte_tiny")
  model = models.EncoderDecoderModel(Transformer(config, prompt=prompt))
  dummy = model.dummy_batch(full, 4)
  # one random backbone for every method (NumPy-drawn: a jitted Flax init compiles for seconds)
  backbone = frozen_backbone(config)
  # a trained-looking prompt: random, not the initialiser's
  shapes = jax.eval_shape(lambda r, f: models.unbox(model.init_prompt(r, f, dummy)),
                          jax.random.PRNGKey(2), backbone)
  leaves, tree = jax.tree.flatten(shapes)
  rs = np.random.RandomState(1)
  values = [(0.5 * rs.standard_normal(x.shape)).astype(x.dtype) for x in leaves]
  params = models.merge_params(backbone, jax.tree.unflatten(tree, values))

  @jax.jit
  def per_example(batch):
    def one(row):
      return model.loss_fn(params, jax.tree.map(lambda v: v[None], row), None,
                           enable_dropout=False)[0]
    return jax.vmap(one)(batch)

  features = data.MODEL_FEATURES
  stream = data.train_batches(cfg)
  batches = [next(stream) for _ in range(window)]
  width = min(b["encoder_input_tokens"].shape[1] for b in batches)
  narrow = [b for b in batches if b["encoder_input_tokens"].shape[1] == width]
  bucketed = {k: np.concatenate([b[k] for b in narrow]) for k in features}
  fixed = dict(bucketed, encoder_input_tokens=np.pad(bucketed["encoder_input_tokens"],
                                                     [(0, 0), (0, full - width)]))
  assert (width == buckets[0]
          and bucketing.input_lengths(bucketed["encoder_input_tokens"]).min() < width)
  got = np.asarray(per_example({k: jnp.asarray(bucketed[k]) for k in features}))
  want = np.asarray(per_example({k: jnp.asarray(fixed[k]) for k in features}))
  assert np.all(np.isfinite(want)) and np.ptp(want) > 0
  return got, want
