"""The skewed-length task and dataset settings of the bucketing tests.

Shared by tests/data/test_bucketing.py, tests/prompts/test_dept.py,
tests/prompts/test_residual_smop.py.
"""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from spot_jax import data
from tests.helpers import local_tasks

LENGTHS = {"inputs": 64, "targets": 4}
BUCKETS = (20, 32)  # + 64
NUM_TRAIN = 96  # 6 windows of 4 batches of 4
BATCH, WINDOW = 4, 4


@pytest.fixture(scope="module")
def task_name(tmp_path_factory) -> str:
  """Inputs "polarity: <i> w w ..." with mostly few words and a long tail (some truncated)."""
  folder = tmp_path_factory.mktemp("skewed")
  rng = np.random.RandomState(0)
  paths = {}
  for split, n in (("train", NUM_TRAIN), ("validation", 8)):
    lines = []
    for i in range(n):
      words = rng.choice(local_tasks.WORDS_POS + local_tasks.WORDS_NEG, min(rng.geometric(0.3), 14))
      lines.append(f"{i} {' '.join(words)}\t{'yes' if i % 2 else 'no'}")
    paths[split] = str(folder / f"{split}.tsv")
    pathlib.Path(paths[split]).write_text("\n".join(lines) + "\n")
  return local_tasks.register_tsv_task("test_skewed_polarity", paths)


def _cfg(task_name, **kw) -> data.DatasetConfig:
  kw = dict(dict(batch_size=BATCH, bucket_window=WINDOW, length_buckets=BUCKETS), **kw)
  return data.DatasetConfig(task_name, LENGTHS, seed=3, **kw)
