"""The shared check of one registered task against hand-made examples in T5's format."""
from __future__ import annotations

import pytest

from tasks import names, scoring


def check_task_case(name: str, taskless: bool, case: tuple, vocab, sequence_length: dict) -> None:
  """Exact strings, real-vocabulary tokens (+ EOS) and metric values of one task.

  Args:
    name: the registered task name (its taskless variant is checked when `taskless`).
    taskless: check `names.taskless_name(name)`, whose inputs lack the leading task name.
    case: (split, [(inputs, targets)], predictions, expected metrics).
    vocab: the real T5 vocabulary.
    sequence_length: feature lengths for building the dataset.
  """
  split, expected, predictions, expected_metrics = case
  task_name = names.taskless_name(name) if taskless else name
  examples = scoring.dataset_examples(task_name, split, sequence_length)
  assert len(examples) == len(predictions)
  for example, (inputs, targets) in zip(examples, expected):
    inputs = inputs.split(" ", 1)[1] if taskless else inputs
    assert example["inputs_pretokenized"].decode() == inputs
    assert example["targets_pretokenized"].decode() == targets
    assert example["inputs"].tolist() == vocab.encode(inputs) + [1]
    assert example["targets"].tolist() == vocab.encode(targets) + [1]
  assert (scoring.score(task_name, examples, predictions) == pytest.approx(expected_metrics,
                                                                           rel=1e-6, abs=1e-9))
