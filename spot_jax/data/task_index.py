"""Each example's task in a mixture: the optional `task_index` feature.

Multi-task prompt methods (ATTEMPT's shared attention over several targets, MPT's prompt
distillation) need to know, per example, which task it came from. With
`DatasetConfig.task_names` set, every example carries `task_index` (int32), the position of its
seqio task in that list. A mixture keeps its own sampling: the mixture is copied with a sampler
that tags each task's stream before handing the streams to the mixture's own sampler, so the
examples (their order, content and mixing) are exactly the ones the untagged mixture yields. A
single task gets a constant index. Without `task_names` nothing changes.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

from spot_jax.errors import ConfigError

FEATURE = "task_index"


def leaf_task_names(source: Any, split: str) -> list[str]:
  """The seqio tasks a task or mixture reads for `split`, in seqio's order (sorted by name)."""
  tasks = getattr(source, "tasks", None)
  if tasks is None:  # a Task
    return [source.name]
  return [t.name for t in tasks if split in t.splits]


def check_names(source: Any, task_names: Sequence[str], split: str) -> list[int]:
  """Position in `task_names` of each task `source` reads (in seqio's order), or a ConfigError."""
  names = [str(n) for n in task_names]
  if not names or len(set(names)) != len(names):
    raise ConfigError(f"TASK_NAMES={tuple(task_names)!r} must list distinct seqio task names; "
                      f"e.g. the tasks of the mixture, one per target prompt")
  leaves = leaf_task_names(source, split)
  missing = [n for n in leaves if n not in names]
  if missing:
    raise ConfigError(f"{source.name} reads tasks {missing} that TASK_NAMES does not list; valid: "
                      f"a list holding every one of {leaves}")
  return [names.index(n) for n in leaves]


def indexed_dataset(source: Any, task_names: Sequence[str], **get_dataset_kwargs: Any):
  """`source.get_dataset(**kwargs)` with an int32 `task_index` feature on every example.

  Args:
    source: a seqio Task or Mixture.
    task_names: the index order (every task `source` reads must be listed).
    **get_dataset_kwargs: seqio's get_dataset arguments (split, sequence_length, seed, ...).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  split = get_dataset_kwargs.get("split", "train")
  indices = check_names(source, task_names, split)

  def tag(ds, index: int):
    return ds.map(lambda ex: {**ex, FEATURE: tf.constant(index, tf.int32)})

  if getattr(source, "tasks", None) is None:
    return tag(source.get_dataset(**get_dataset_kwargs), indices[0])
  # seqio's Mixture.get_dataset hands one stream per task (seqio's order, tasks lacking the
  # split left out: the order `leaf_task_names` gives) to its `_sample_fn`. A shallow copy with a
  # sampler that tags the streams first keeps every other step, the seeds and the rates.
  mixture = copy.copy(source)
  sample = source._sample_fn  # pylint: disable=protected-access

  def tagged_sample(datasets, rates, seed):
    if len(datasets) != len(indices):
      raise ConfigError(f"{source.name}: seqio gave {len(datasets)} task streams for "
                        f"{len(indices)} tasks; TASK_NAMES cannot index this mixture")
    return sample([tag(d, i) for d, i in zip(datasets, indices)], rates, seed)

  mixture._sample_fn = tagged_sample  # pylint: disable=protected-access
  return mixture.get_dataset(**get_dataset_kwargs)


def count(names: Sequence[str]) -> int:
  """len(names): the number of tasks (so gin files size multi-task prompts from TASK_NAMES)."""
  if isinstance(names, str) or not names:
    raise ConfigError(f"TASK_NAMES={names!r}; give a non-empty list of seqio task names")
  return len(names)
