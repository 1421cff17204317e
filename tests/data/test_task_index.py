"""The optional task_index feature: each example's task in a mixture, nothing else changed."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from spot_jax import data
from spot_jax.data import task_index
from spot_jax.errors import ConfigError

MIX = "spot_synthetic_mix_v100"
PARITY, SENTIMENT = "spot_synthetic_parity_v100", "spot_synthetic_sentiment_v100"


def _cfg(**kw) -> data.DatasetConfig:
  return data.DatasetConfig(MIX, {"inputs": 32, "targets": 8}, batch_size=8, seed=3,
                            module="tasks.synthetic", **kw)


def _take(it, n):
  return [next(it) for _ in range(n)]


def _true_task(batch, names):
  """The task of each row, read from its text: parity inputs start with 'p', sentiment with 's'."""
  first = batch["encoder_input_tokens"][:, 0] - 3  # byte vocabulary: id = byte + 3
  return np.array([names.index(PARITY if c == ord("p") else SENTIMENT) for c in first])


@pytest.mark.parametrize("buckets", [None, (16,)])
@pytest.mark.parametrize("names", [[PARITY, SENTIMENT], [SENTIMENT, "other_task", PARITY]])
def test_same_batches_plus_each_rows_task(names, buckets):
  plain = _take(data.train_batches(_cfg(length_buckets=buckets, bucket_window=2)), 6)
  tagged = _take(data.train_batches(_cfg(length_buckets=buckets, bucket_window=2,
                                         task_names=names)), 6)
  seen = set()
  for x, y in zip(plain, tagged):
    assert set(y) - set(x) == {"task_index"}
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)
    assert y["task_index"].dtype == np.int32 and y["task_index"].shape == (8,)
    np.testing.assert_array_equal(y["task_index"], _true_task(y, names))
    seen |= set(y["task_index"].tolist())
  assert seen == {names.index(PARITY), names.index(SENTIMENT)}  # both tasks were drawn


def test_a_single_task_gets_a_constant_index_and_resumes():
  cfg = dataclasses.replace(_cfg(), mixture_or_task_name=SENTIMENT, task_names=[PARITY, SENTIMENT])
  batches = _take(data.train_batches(cfg), 3)
  assert all((b["task_index"] == 1).all() for b in batches)
  resumed = next(data.train_batches(cfg, start_position=2))
  for k in resumed:
    np.testing.assert_array_equal(resumed[k], batches[2][k])


@pytest.mark.parametrize("names, message", [
    ([PARITY], "reads tasks ['spot_synthetic_sentiment_v100'] that TASK_NAMES does not list"),
    ([PARITY, PARITY, SENTIMENT], "must list distinct seqio task names"),
    ([], "must list distinct seqio task names"),
])
def test_unlisted_or_repeated_tasks_are_one_line_errors(names, message):
  with pytest.raises(ConfigError) as e:
    next(data.train_batches(_cfg(task_names=names)))
  assert message in str(e.value) and "\n" not in str(e.value)


def test_task_names_must_be_a_list_of_names():
  with pytest.raises(ConfigError, match="give a list of seqio task names"):
    data.validate(_cfg(task_names=PARITY))


def test_leaf_task_names_follow_seqio():
  import seqio  # pylint: disable=g-import-not-at-top
  data.import_modules("tasks.synthetic")
  assert task_index.leaf_task_names(seqio.get_mixture_or_task(MIX), "train") == [PARITY, SENTIMENT]
  assert task_index.leaf_task_names(seqio.get_mixture_or_task(PARITY), "train") == [PARITY]
