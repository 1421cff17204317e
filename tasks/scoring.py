"""Score decoded predictions with a task's postprocessor and metrics, as seqio.Evaluator does.

Targets are postprocessed from each example's "targets_pretokenized" with
`is_target=True` and the full example; predictions with the example too. Handy
for offline scoring of saved predictions and for the task tests.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
import seqio


def dataset_examples(task: Union[str, seqio.Task], split: str = "validation",
                     sequence_length: Optional[Mapping[str, int]] = None) -> List[Dict[str, Any]]:
  """Every example of a task's split, in order, as numpy dicts (tokens and strings)."""
  task = seqio.get_mixture_or_task(task) if isinstance(task, str) else task
  sequence_length = sequence_length or {"inputs": 512, "targets": 128}
  ds = task.get_dataset(sequence_length, split=split, shuffle=False, seed=0)
  return list(ds.as_numpy_iterator())


def score(task: Union[str, seqio.Task], examples: Sequence[Mapping[str, Any]],
          predictions: Sequence[str]) -> Dict[str, float]:
  """Applies the task's postprocess_fn and every metric_fn; returns the merged metric dict.

  Args:
    task: a task or its registered name.
    examples: the task's preprocessed examples (with "targets_pretokenized").
    predictions: one decoded prediction string per example.
  """
  task = seqio.get_mixture_or_task(task) if isinstance(task, str) else task
  if len(examples) != len(predictions):
    raise ValueError(f"got {len(examples)} examples but {len(predictions)} predictions; they "
                     "must match")
  post = task.postprocess_fn or (lambda output, **_: output)
  targets = [post(ex["targets_pretokenized"].decode("utf-8")
                  if isinstance(ex["targets_pretokenized"], bytes)
                  else ex["targets_pretokenized"], example=ex, is_target=True) for ex in examples]
  outputs = [post(p, example=ex, is_target=False) for p, ex in zip(predictions, examples)]
  results: Dict[str, float] = {}
  for metric_fn in task.predict_metric_fns:
    for key, value in metric_fn(targets, outputs).items():
      results[key] = float(np.asarray(value))
  return results
