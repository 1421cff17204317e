"""seqio evaluation of a (prompted) model: greedy decoding, the task's postprocessors and metrics."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Any, Callable, Iterator, Mapping, Optional

import jax
import numpy as np

from spot_jax import data as data_lib
from spot_jax import models


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Which split to evaluate and how.

  Attributes:
    mixture_or_task_name: task or mixture to evaluate (default: the training one).
    task_feature_lengths: {"inputs": T, "targets": S}; S is also the decode length.
    split: evaluation split.
    batch_size: examples per inference batch (the last batch is padded, not recompiled).
    num_examples: evaluate on at most this many examples per task (None: all).
    module: python module(s) registering the task.
    use_cached: read seqio's offline cache.
  """
  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  split: str = "validation"
  batch_size: int = 32
  num_examples: Optional[int] = None
  module: Optional[str] = None
  use_cached: bool = False


def _scalar(value: Any) -> float:
  value = getattr(value, "value", value)
  return float(np.asarray(value))


def _batches(ds, batch_size: int, feature: str):
  """(indices, padded [batch_size, L] array, real count) from an enumerated seqio dataset."""
  indices, rows = [], []
  for index, ex in ds.as_numpy_iterator():
    indices.append(int(index))
    rows.append(ex[feature])
    if len(rows) == batch_size:
      yield indices, np.stack(rows), len(rows)
      indices, rows = [], []
  if rows:
    pad = [np.zeros_like(rows[0])] * (batch_size - len(rows))
    yield indices, np.stack(rows + pad), len(rows)


class _SeqioNotes(logging.Filter):
  """Drops the absl records of seqio that start with one of `prefixes`."""

  def __init__(self, prefixes: tuple[str, ...]):
    super().__init__()
    self.prefixes = prefixes

  def filter(self, record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and record.msg.startswith(self.prefixes))


# seqio warns (absl, on stderr) whenever TASK_FEATURE_LENGTHS is not exactly the longest evaluation
# example; the lengths are fixed on purpose (one compiled shape).
_LENGTH_NOTES = ("Given sequence lengths",)
# ... and when an evaluation has no training step (spot_jax.eval of a finished run): -1 it is.
_NO_STEP_NOTES = ("Step number for the logging session is not provided",)


@contextlib.contextmanager
def _without(prefixes: tuple[str, ...]) -> Iterator[None]:
  """seqio's absl warnings starting with `prefixes` are not printed inside the block."""
  quiet, logger = _SeqioNotes(prefixes), logging.getLogger("absl")
  logger.addFilter(quiet)
  try:
    yield
  finally:
    logger.removeFilter(quiet)


class Evaluator:
  """Evaluates parameter trees of one model on one task or mixture.

  Attributes:
    model: the `EncoderDecoderModel`.
    config: the `EvalConfig`.
  """

  def __init__(self, model: models.EncoderDecoderModel, config: EvalConfig,
               log_dir: Optional[str] = None):
    import seqio  # pylint: disable=g-import-not-at-top
    self.model, self.config = model, config
    data_lib.import_modules(config.module)
    data_lib.get_mixture_or_task(config.mixture_or_task_name)  # clear error for unknown names
    if log_dir:
      os.makedirs(log_dir, exist_ok=True)
    loggers = (seqio.JSONLogger,) if log_dir else ()
    with _without(_LENGTH_NOTES):
      self._evaluator = seqio.Evaluator(
          mixture_or_task_name=config.mixture_or_task_name,
          feature_converter=seqio.EncDecFeatureConverter(pack=False),
          eval_split=config.split, use_cached=config.use_cached, seed=42,
          sequence_length=dict(config.task_feature_lengths), num_examples=config.num_examples,
          logger_cls=loggers, log_dir=log_dir, async_compute_metrics=False)
    decode_length = int(config.task_feature_lengths["targets"])
    self._predict = jax.jit(lambda params, tokens: model.predict_batch(params, tokens, decode_length))
    self._score = jax.jit(model.score_batch)

  @property
  def num_examples(self) -> int:
    return sum(int(ds.cardinality()) for ds in self._evaluator.cached_model_datasets.values())

  def _predict_fn(self, params) -> Callable:
    def predict(ds):
      out = []
      for indices, tokens, n in _batches(ds, self.config.batch_size, "encoder_input_tokens"):
        decoded = np.asarray(jax.device_get(self._predict(params, tokens)))[:n]
        # Fixed-length rows (0 after EOS): seqio stacks them and its vocabularies stop at EOS.
        out.extend(zip(indices, decoded))
      return out
    return predict

  def _score_fn(self, params) -> Callable:
    def score(ds):
      out = []
      rows: list = []
      for index, ex in ds.as_numpy_iterator():
        rows.append((int(index), ex))
      for start in range(0, len(rows), self.config.batch_size):
        chunk = rows[start:start + self.config.batch_size]
        batch = {k: np.stack([ex[k] for _, ex in chunk]) for k in
                 ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")}
        pad = self.config.batch_size - len(chunk)
        if pad:
          batch = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for k, v in batch.items()}
        scores = np.asarray(jax.device_get(self._score(params, batch)))[:len(chunk)]
        out.extend((i, float(s)) for (i, _), s in zip(chunk, scores))
      return out
    return score

  def evaluate(self, params, step: Optional[int] = None) -> dict[str, dict[str, float]]:
    """Metrics {task name: {metric: value}} of the full parameter tree `params`."""
    with _without(_NO_STEP_NOTES if step is None else ()):
      metrics, _ = self._evaluator.evaluate(compute_metrics=True, step=step,
                                            predict_fn=self._predict_fn(params),
                                            score_fn=self._score_fn(params))
    result = metrics.result() if hasattr(metrics, "result") else metrics
    return {task: {name: _scalar(v) for name, v in task_metrics.items()}
            for task, task_metrics in (result or {}).items()}


def lookup_metric(metrics: Mapping[str, Mapping[str, float]], name: str) -> float:
  """`name` is "task/metric" or, when one task was evaluated, just "metric"."""
  if "/" in name:
    task, metric = name.rsplit("/", 1)
    if task in metrics and metric in metrics[task]:
      return metrics[task][metric]
  else:
    found = [m[name] for m in metrics.values() if name in m]
    if len(found) == 1:
      return found[0]
  available = sorted(f"{t}/{m}" for t, ms in metrics.items() for m in ms)
  raise KeyError(f"metric {name!r} not among the evaluation results; valid: {', '.join(available)}")

