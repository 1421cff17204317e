"""Length buckets of decoder-only batches: each row is cut to its bucket plus the target length."""
from __future__ import annotations

import numpy as np

from spot_jax.data import bucketing

INPUTS, TARGETS, BATCH = 16, 4, 2


def _window(lengths):
  """Rows of `n` input tokens then 2 target tokens + EOS, in the decoder-only layout."""
  rows, weights = [], []
  for n in lengths:
    seq = list(range(10, 10 + n)) + [7, 8, 1]
    rows.append(seq + [0] * (INPUTS + TARGETS - len(seq)))
    weights.append([0] * n + [1, 1, 1] + [0] * (INPUTS + TARGETS - len(seq)))
  tokens = np.asarray(rows, np.int32)
  return {"decoder_target_tokens": tokens,
          "decoder_input_tokens": np.pad(tokens[:, :-1], ((0, 0), (1, 0))),
          "decoder_loss_weights": np.asarray(weights, np.int32),
          "inputs_truncated": np.zeros(len(rows), bool)}


def test_rows_keep_their_targets_and_every_example_appears_once():
  window = _window([3, 4, 12, 16, 2, 5])
  batches = bucketing.bucket_batches(window, BATCH, (4, 8, INPUTS), np.random.RandomState(0))
  seen = []
  for batch in batches:
    width = batch["decoder_target_tokens"].shape[1]
    assert width - TARGETS in (4, 8, INPUTS)
    for name in ("decoder_input_tokens", "decoder_loss_weights"):
      assert batch[name].shape[1] == width
    for row, weights in zip(batch["decoder_target_tokens"], batch["decoder_loss_weights"]):
      assert row[weights == 1].tolist() == [7, 8, 1]  # the targets were not cut
      seen.append(int(np.sum(row > 0)))
  assert sorted(seen) == sorted(n + 3 for n in [3, 4, 12, 16, 2, 5])
