"""Replayed training streams: the same batches as the pipeline, read once per process."""
from __future__ import annotations

import numpy as np
import pytest

from spot_jax import data
from spot_jax.data import pipeline, replay
from tests.helpers import local_tasks

LENGTHS = {"inputs": 24, "targets": 4}


@pytest.fixture(scope="module")
def task_name(tmp_path_factory) -> str:
  paths = local_tasks.write_tsv_task_files(tmp_path_factory.mktemp("replay"), n_train=64, n_val=8)
  return local_tasks.register_tsv_task("test_replay_polarity", paths)


@pytest.fixture(autouse=True)
def _fresh():
  replay.clear()
  yield
  replay.clear()


def _take(it, n):
  return [next(it) for _ in range(n)]


def _same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert sorted(x) == sorted(y)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.fixture
def counted(monkeypatch):
  """How many pipelines were opened, and at which positions."""
  opened = []
  real = pipeline.train_batches

  def spy(cfg, *, start_position=0, **kw):
    opened.append(start_position)
    return real(cfg, start_position=start_position, **kw)
  monkeypatch.setattr(pipeline, "train_batches", spy)
  return opened


@pytest.mark.parametrize("buckets", [None, (12,)])
def test_a_replayed_stream_is_the_stream(task_name, counted, buckets):
  cfg = data.DatasetConfig(task_name, LENGTHS, batch_size=4, seed=5, length_buckets=buckets,
                           bucket_window=2)
  direct = _take(data.train_batches(cfg), 20)  # 20 batches of 4: past one epoch of 64 examples
  first = _take(replay.replayed_train_batches(cfg), 18)
  again = _take(replay.replayed_train_batches(cfg), 20)  # 18 replayed, 2 read on
  resumed = _take(replay.replayed_train_batches(cfg, start_position=15), 5)
  _same(first, direct[:18])
  _same(again, direct)
  _same(resumed, direct[15:])
  # The first reader opened the pipeline at 0; the second only at 18, past what was kept; the
  # resumed reader none (batches 15-19 are kept).
  assert counted == [0, 18]


def test_readers_get_their_own_dicts(task_name):
  cfg = data.DatasetConfig(task_name, LENGTHS, batch_size=4, seed=1)
  first = next(replay.replayed_train_batches(cfg))
  first.pop("inputs_truncated")  # what the trainer's stream does with every batch
  second = next(replay.replayed_train_batches(cfg))
  assert "inputs_truncated" in second


def test_other_seeds_and_tasks_are_other_streams(task_name, tmp_path, counted):
  cfg = data.DatasetConfig(task_name, LENGTHS, batch_size=4, seed=1)
  a = _take(replay.replayed_train_batches(cfg), 2)
  b = _take(replay.replayed_train_batches(
      data.DatasetConfig(task_name, LENGTHS, batch_size=4, seed=2)), 2)
  assert not np.array_equal(a[0]["encoder_input_tokens"], b[0]["encoder_input_tokens"])
  # The same name registered again (other examples) is another stream, not a replay.
  paths = local_tasks.write_tsv_task_files(tmp_path, n_train=32, n_val=8)
  local_tasks.register_tsv_task(task_name, paths)
  try:
    _take(replay.replayed_train_batches(cfg), 2)
    assert counted == [0, 0, 0]
  finally:  # the module's task back, for the other tests
    local_tasks.register_tsv_task(task_name, local_tasks.write_tsv_task_files(
        tmp_path / "again", n_train=64, n_val=8))


def test_the_budget_bounds_what_is_kept(task_name, monkeypatch):
  cfg = data.DatasetConfig(task_name, LENGTHS, batch_size=4, seed=1)
  one = sum(v.nbytes for v in next(data.train_batches(cfg)).values())
  monkeypatch.setattr(replay, "BUDGET_BYTES", 3 * one)
  direct = _take(data.train_batches(cfg), 6)
  _same(_take(replay.replayed_train_batches(cfg), 6), direct)
  assert replay.kept_bytes() == 3 * one
  _same(_take(replay.replayed_train_batches(cfg), 6), direct)
