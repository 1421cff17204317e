"""Rank classification of finished runs: each run's prompt picks the likeliest class label.

A recipe that names class labels for its runs' tasks (`Recipe.class_labels`, keyed by the run's
label) gets, after its job trains, a rank-classification accuracy per run: the run's exported
prompt (its best step's, else its last; the state it came from, read with
`RunDir.prompt_params`) on the recipe's own prompted model scores every label of the first
`Recipe.rank_examples` validation examples of its task (`models.EncoderDecoderModel.
classify_batch`: one encoder pass per input), and the likeliest label is the answer. Unlike
greedy decoding, every answer is a label. The accuracy (%) is saved in the run directory
(`RunDir.rank_path`, atomically) with what it was computed from, so a rerun reuses it.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np

from spot_jax import backbone as backbone_lib
from spot_jax import data as data_lib
from spot_jax import fileio
from spot_jax import models
from spot_jax import partitioning
from spot_jax import vocabulary as vocabulary_lib
from spot_jax.errors import ConfigError
from spot_jax.experiment.outcome import RunOutcome
from spot_jax.experiment.request import Recipe
from spot_jax.run_dir import RunDir

LENGTH_MULTIPLE = 8  # inputs are cut to their longest, rounded up to this (fewer compiles)


@dataclasses.dataclass(frozen=True)
class Examples:
  """The first N validation examples of a task, ready to classify.

  Attributes:
    tokens: [N, T] encoder input ids (EOS included), T the longest rounded up (at most the
      recipe's input length); valid: [N, T] bool, the tokens (a decoder's id 0 may be one).
    gold: [N] index of each example's label in `labels`.
    labels: the class labels' token rows [C, S] (EOS included), label_valid their tokens.
  """
  tokens: np.ndarray
  gold: np.ndarray
  labels: np.ndarray
  valid: np.ndarray
  label_valid: np.ndarray


@functools.lru_cache(maxsize=32)
def examples(task: str, labels: tuple[str, ...], num_examples: int, input_length: int,
             module: Optional[str]) -> Examples:
  """The first `num_examples` validation examples of `task` as the trainer's evaluation reads
  them (inputs cut to `input_length` tokens, EOS kept), with their labels' indices."""
  data_lib.import_modules(module)
  source = data_lib.get_mixture_or_task(task, "validation", "rank classification",
                                        ("Recipe.task_module", module))
  vocab = source.output_features["targets"].vocabulary
  lengths = {"inputs": input_length, "targets": max(len(vocab.encode(x)) for x in labels) + 1}
  dataset = source.get_dataset(lengths, split="validation", shuffle=False, num_epochs=1)
  rows, gold = [], []
  for ex in dataset.take(num_examples).as_numpy_iterator():
    target = ex["targets_pretokenized"].decode()
    if target not in labels:
      raise ConfigError(f"rank classification: {task}'s validation target {target!r} is not one "
                        f"of its class labels ({', '.join(labels)})")
    rows.append(ex["inputs"])
    gold.append(labels.index(target))
  if not rows:
    raise ConfigError(f"rank classification: {task} has no validation examples")
  width = min(-(-max(len(r) for r in rows) // LENGTH_MULTIPLE) * LENGTH_MULTIPLE, input_length)
  tokens, valid = vocabulary_lib.right_padded(rows, width)
  eos_id = vocab.eos_id  # the vocabulary's, as the targets carry it (seqio's: 1)
  label_rows, label_valid = vocabulary_lib.right_padded(
      [list(vocab.encode(x)) + [eos_id] for x in labels], lengths["targets"])
  return Examples(tokens, np.asarray(gold), label_rows, valid, label_valid)


def classify(predict: Callable[..., Any], params: Any, data: Examples, batch_size: int
             ) -> np.ndarray:
  """The index [N] of each example's likeliest label, in batches of `batch_size` (at most N; the
  last padded, so every batch has one shape)."""
  n = len(data.tokens)
  batch_size = min(batch_size, n)  # fewer examples than a batch: no padding rows to score
  picks = []
  for lo in range(0, n, batch_size):
    rows, valid = data.tokens[lo:lo + batch_size], data.valid[lo:lo + batch_size]
    count = len(rows)
    if count < batch_size:  # padding rows repeat the first (their scores are dropped)
      rows = np.concatenate([rows, np.repeat(rows[:1], batch_size - count, axis=0)])
      valid = np.concatenate([valid, np.repeat(valid[:1], batch_size - count, axis=0)])
    scores = np.asarray(predict(params, rows, data.labels, valid, data.label_valid))
    picks.append(np.argmax(scores[:count], axis=-1))
  return np.concatenate(picks)


def _key(recipe: Recipe, run: RunDir, labels: Sequence[str]) -> dict:
  """What a saved accuracy was computed from: the prompt file (and its bytes), the examples."""
  prompt, _ = run.exported_prompt()
  return {"prompt": prompt.name, "prompt_sha256": hashlib.sha256(prompt.read_bytes()).hexdigest(),
          "examples": int(recipe.rank_examples), "labels": list(labels),
          "input_length": int(recipe.lengths["inputs"])}


def saved_accuracy(run: RunDir, key: dict) -> Optional[float]:
  """The accuracy saved for exactly `key`, or None."""
  try:
    doc = json.loads(run.rank_path.read_text())
  except (OSError, ValueError):
    return None
  if not isinstance(doc, dict) or {k: doc.get(k) for k in key} != key:
    return None
  return float(doc["accuracy"])


class _Scorer:
  """The job's frozen backbone, jitted classifier and tasks' examples, made on first use."""

  def __init__(self, recipe: Recipe):
    self.recipe = recipe
    self._backbones: dict[int, Any] = {}
    self._examples: dict[tuple[str, tuple[str, ...]], Examples] = {}
    model = recipe.model
    if isinstance(model, models.DecoderOnlyModel):  # masks: every id a token
      self.predict = jax.jit(lambda p, x, labels, valid, label_valid: model.classify_batch(
          p, x, labels, input_valid=valid, label_valid=label_valid))
    else:  # T5 reads its padding id 0
      self.predict = jax.jit(lambda p, x, labels, valid, label_valid: model.classify_batch(
          p, x, labels))
    self.mesh = partitioning.create_mesh(1)
    self.rules = partitioning.logical_rules()

  def backbone(self, seed: int) -> Any:
    """The frozen weights the runs trained on (a random backbone: the job's seed)."""
    if self.recipe.initial_checkpoint_path:
      seed = 0
    if seed not in self._backbones:
      lengths = self.recipe.lengths
      dummy = self.recipe.model.dummy_batch(lengths["inputs"], lengths["targets"])
      self._backbones[seed], _ = backbone_lib.load_backbone(
          self.recipe.model, dummy, self.recipe.initial_checkpoint_path, seed, self.mesh,
          self.rules, info=lambda line: None)
    return self._backbones[seed]

  def accuracy(self, run: RunDir, task: str, labels: tuple[str, ...], seed: int) -> float:
    r = self.recipe
    try:
      prompt = run.prompt_params(warn=lambda line: print(line, file=sys.stderr))
    except ConfigError as e:
      raise ConfigError(f"method {r.name!r} cannot be scored by rank classification: {e}") \
          from None
    if (task, labels) not in self._examples:  # read once per task, not once per run
      self._examples[task, labels] = examples(task, labels, int(r.rank_examples),
                                              int(r.lengths["inputs"]), r.task_module)
    data = self._examples[task, labels]
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(list(self.rules)):
      params = models.merge_params(self.backbone(seed), {models.PROMPT_KEY: prompt})
      picks = classify(self.predict, params, data, int(r.rank_batch_size))
    return round(100.0 * float(np.mean(picks == data.gold)), 2)


def score(recipe: Recipe, outcomes: Sequence[RunOutcome], seeds: Sequence[int]
          ) -> tuple[list[RunOutcome], int]:
  """(`outcomes` with the rank-classification accuracy of every run whose label has class
  labels in `recipe.class_labels`, how many were computed; saved ones are reused).

  Args:
    recipe: the job's recipe (its model, backbone, lengths and class labels).
    outcomes: the job's finished runs.
    seeds: each run's backbone seed (used only when the backbone is random).
  """
  if not recipe.class_labels:
    return list(outcomes), 0
  scorer, out, computed = None, [], 0
  for outcome, seed in zip(outcomes, seeds):
    labels = recipe.class_labels.get(outcome.label)
    if not labels:
      out.append(outcome)
      continue
    labels = tuple(labels)
    run = RunDir(outcome.run_dir)
    key = _key(recipe, run, labels)
    accuracy = saved_accuracy(run, key)
    if accuracy is None:
      scorer = scorer or _Scorer(recipe)
      accuracy = scorer.accuracy(run, outcome.task, labels, seed)
      computed += 1
      doc = {**key, "task": outcome.task, "accuracy": accuracy}
      fileio.atomic_write_bytes(run.rank_path, json.dumps(doc, indent=1).encode())
    out.append(dataclasses.replace(outcome, rank_accuracy=accuracy))
  return out, computed
