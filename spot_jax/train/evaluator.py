"""seqio evaluation of a (prompted) model: greedy decoding, the task's postprocessors and metrics.

Batches are global arrays on the run's mesh: every process builds the same padded batch of the
evaluation split, the jitted prediction runs over the whole mesh (each process's devices decode
their rows), and the predictions are gathered back to every process, which computes the same
metrics. One process or several give the same results. K stacked runs (`evaluate_stacked`) are
decoded in one vmapped pass per batch; each run's metrics and logs are its own.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import jax
import numpy as np

from spot_jax import data as data_lib
from spot_jax import models
from spot_jax import partitioning
from spot_jax.backbones import kinds
from spot_jax.data import eval_features
from spot_jax.errors import ConfigError

# The features every evaluation row has (a decoder-only model's also their validity).
_KEYS = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Which split to evaluate and how.

  Attributes:
    mixture_or_task_name: task or mixture to evaluate (default: the training one).
    task_feature_lengths: {"inputs": T, "targets": S}; S is also the decode length.
    split: evaluation split.
    batch_size: examples per inference batch (the last batch is padded, not recompiled;
      rounded up to a multiple of the mesh's data-parallel size).
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


class _RoutedLogs:
  """A seqio logger forwarding to the loggers of the run being evaluated (see `Evaluator`)."""

  def __init__(self):
    self.targets: Sequence[Callable[..., None]] = ()

  def __call__(self, **kwargs) -> None:
    for logger in self.targets:
      logger(**kwargs)


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


# seqio evaluators built in this process, by what they read: one evaluator tokenises and keeps
# its examples once, and every later job of the process evaluating the same split reuses it,
# with the model-input rows read from its datasets (by dataset id; the evaluator holds them).
_SEQIO_EVALUATORS: dict[tuple, tuple[Any, Any, _RoutedLogs, dict]] = {}
_MAX_SEQIO_EVALUATORS = 64


def _seqio_evaluator(config: EvalConfig, decoder_only: bool) -> tuple[Any, _RoutedLogs, dict]:
  """(seqio.Evaluator, its routed logger, its rows cache) for `config` and a model of that kind
  (a decoder-only model's rows carry their validity), built once per process and task object."""
  import seqio  # pylint: disable=g-import-not-at-top
  data_lib.import_modules(config.module)
  source = data_lib.get_mixture_or_task(config.mixture_or_task_name, config.split, "EVAL_SPLIT",
                                        ("MIXTURE_OR_TASK_MODULE", config.module))
  key = (id(source), decoder_only, config.mixture_or_task_name, config.split, config.use_cached,
         config.num_examples,
         tuple(sorted((k, int(v)) for k, v in config.task_feature_lengths.items())))
  if key not in _SEQIO_EVALUATORS:
    routes = _RoutedLogs()
    with _without(_LENGTH_NOTES):
      evaluator = seqio.Evaluator(
          mixture_or_task_name=config.mixture_or_task_name,
          feature_converter=eval_features.feature_converter(decoder_only),
          eval_split=config.split, use_cached=config.use_cached, seed=42,
          sequence_length=dict(config.task_feature_lengths), num_examples=config.num_examples,
          # seqio wants a folder with its loggers; the routed logger writes to each run's own.
          logger_cls=(lambda output_dir: routes,), log_dir="routed", async_compute_metrics=False)
    if len(_SEQIO_EVALUATORS) >= _MAX_SEQIO_EVALUATORS:
      _SEQIO_EVALUATORS.pop(next(iter(_SEQIO_EVALUATORS)))
    # The task object is kept with its evaluator, so its id names it while the entry lives.
    _SEQIO_EVALUATORS[key] = (source, evaluator, routes, {})
  return _SEQIO_EVALUATORS[key][1:]


class ModelOutputs:
  """The jitted decoding and scoring of one model at one decode length.

  Evaluators of the same model and decode length (one per task of a K-run job) share one
  instance, so each function is traced and compiled once for all of them, not once per task.
  """

  def __init__(self, model: models.Model, decode_length: int):
    self.key = (id(model), int(decode_length))
    def predict(params, batch):  # a decoder-only model reads the validity, T5 its padding 0
      valid = ({"input_valid": batch["encoder_input_valid"]}
               if "encoder_input_valid" in batch else {})
      return model.predict_batch(params, batch["encoder_input_tokens"], int(decode_length),
                                 **valid)
    self.predict = jax.jit(predict)
    self.score = jax.jit(model.score_batch)

    def merged(fn):
      return lambda frozen, prompt, *args: fn(models.merge_params(frozen, prompt), *args)
    self.predict_stacked = jax.jit(jax.vmap(merged(predict), in_axes=(None, 0, None)))
    self.score_stacked = jax.jit(jax.vmap(merged(model.score_batch), in_axes=(None, 0, None)))


class Evaluator:
  """Evaluates the parameters of one model, or of K stacked runs, on one task or mixture.

  Attributes:
    model: the prompted model (`models.Model`, either kind).
    config: the `EvalConfig`.
    mesh: the device mesh the parameters live on.
  """

  def __init__(self, model: models.Model, config: EvalConfig,
               log_dir: Optional[str] = None, mesh: Optional[jax.sharding.Mesh] = None,
               outputs: Optional[ModelOutputs] = None):
    self.model, self.config = model, config
    self.mesh = mesh if mesh is not None else partitioning.create_mesh(1)
    self._log_dir = log_dir
    self._evaluator, self._routes, self._rows_cache = _seqio_evaluator(
        config, kinds.kind_of(model.config) == "decoder")
    data_size = self.mesh.shape[partitioning.DATA]
    self._batch_size = -(-int(config.batch_size) // data_size) * data_size
    decode_length = int(config.task_feature_lengths["targets"])
    if outputs is not None and outputs.key != (id(model), decode_length):
      raise ValueError("the shared ModelOutputs were made for another model or decode length")
    self._outputs = outputs or ModelOutputs(model, decode_length)

  @property
  def num_examples(self) -> int:
    return sum(int(ds.cardinality()) for ds in self._evaluator.cached_model_datasets.values())

  # --- batches --------------------------------------------------------------------------------

  def _rows(self, ds) -> tuple[list[int], dict[str, np.ndarray]]:
    """(example indices, {feature: [N, L]}) of an enumerated seqio dataset, in order.

    Read once per dataset of the shared seqio evaluator, then kept with it (read-only).
    """
    if id(ds) not in self._rows_cache:
      indices, rows = [], []
      for index, ex in ds.as_numpy_iterator():
        indices.append(int(index))
        rows.append(ex)
      keys = _KEYS + tuple(k for k in eval_features.VALID_FEATURES if rows and k in rows[0])
      features = {k: np.stack([ex[k] for ex in rows]) for k in keys} if rows else {}
      for array in features.values():
        array.flags.writeable = False
      self._rows_cache[id(ds)] = (ds, indices, features)  # ds kept: its id names the entry
    _, indices, features = self._rows_cache[id(ds)]
    return list(indices), features

  def _batches(self, features: Mapping[str, np.ndarray], keys: Sequence[str]):
    """Global batches of `batch_size` rows (the last padded with zeros) and their real count."""
    n, b = len(features[keys[0]]), self._batch_size
    sharding = partitioning.batch_sharding(self.mesh)
    for lo in range(0, n, b):
      count = min(b, n - lo)
      batch = {}
      for k in keys:
        rows = features[k][lo:lo + count]
        if count < b:
          rows = np.concatenate([rows, np.zeros((b - count,) + rows.shape[1:], rows.dtype)])
        batch[k] = partitioning.global_batch(rows, sharding)
      yield batch, count

  # --- model outputs ---------------------------------------------------------------------------

  def _predictions(self, ds, run_params: Callable[[dict], Any], stacked: bool) -> list:
    indices, features = self._rows(ds)
    if not indices:
      return []
    outs = []
    keys = [k for k in ("encoder_input_tokens", "encoder_input_valid") if k in features]
    for batch, count in self._batches(features, keys):
      out = partitioning.fetch(run_params(batch))
      outs.append(out[..., :count, :])
    decoded = np.concatenate(outs, axis=-2)  # [(K,) N, S]; 0 after EOS
    if stacked:
      return [list(zip(indices, run)) for run in decoded]
    return list(zip(indices, decoded))

  def _scores(self, ds, run_params: Callable[[dict], Any], stacked: bool) -> list:
    indices, features = self._rows(ds)
    if not indices:
      return []
    outs = []
    for batch, count in self._batches(features, list(features)):
      outs.append(partitioning.fetch(run_params(batch))[..., :count])
    scores = np.concatenate(outs, axis=-1)
    if stacked:
      return [[(i, float(s)) for i, s in zip(indices, run)] for run in scores]
    return [(i, float(s)) for i, s in zip(indices, scores)]

  # --- evaluation --------------------------------------------------------------------------------

  def _loggers(self, log_dir: Optional[str]) -> tuple:
    from spot_jax.train import eval_log  # pylint: disable=g-import-not-at-top
    if not log_dir or jax.process_index() != 0:
      return ()
    os.makedirs(log_dir, exist_ok=True)
    return (eval_log.JSONLogger(output_dir=log_dir),)

  def _metrics(self, predict_fn, score_fn, step: Optional[int], log_dir: Optional[str]) -> dict:
    self._routes.targets = self._loggers(log_dir)
    try:
      with _without(_NO_STEP_NOTES if step is None else ()):
        metrics, _ = self._evaluator.evaluate(compute_metrics=True, step=step,
                                              predict_fn=predict_fn, score_fn=score_fn)
      result = metrics.result() if hasattr(metrics, "result") else metrics
    finally:
      self._routes.targets = ()
    return {task: {name: _scalar(v) for name, v in task_metrics.items()}
            for task, task_metrics in (result or {}).items()}

  def evaluate(self, params, step: Optional[int] = None,
               log_dir: Optional[str] = None) -> dict[str, dict[str, float]]:
    """Metrics {task name: {metric: value}} of the full parameter tree `params`.

    `log_dir` (default: the constructor's) receives seqio's per-example outputs (process 0).
    """
    predict = lambda ds: self._predictions(ds, lambda b: self._outputs.predict(params, b),
                                           stacked=False)
    score = lambda ds: self._scores(ds, lambda b: self._outputs.score(params, b), stacked=False)
    return self._metrics(predict, score, step, log_dir or self._log_dir)

  def evaluate_stacked(self, frozen, prompt, step: Optional[int] = None,
                       log_dirs: Optional[Sequence[Optional[str]]] = None
                       ) -> list[dict[str, dict[str, float]]]:
    """Metrics of K stacked runs: `prompt` is {"prompt": ...} with a leading runs axis.

    Each batch is decoded once for all K runs (vmapped); each run's metrics and seqio logs
    (`log_dirs[k]`) are its own.
    """
    k = int(jax.tree.leaves(prompt)[0].shape[0])
    log_dirs = list(log_dirs) if log_dirs is not None else [None] * k
    cache: dict[tuple[str, int], list] = {}

    def outputs(kind: str, ds) -> list:
      key = (kind, id(ds))
      if key not in cache:
        if kind == "predict":
          cache[key] = self._predictions(
              ds, lambda b: self._outputs.predict_stacked(frozen, prompt, b), stacked=True)
        else:
          cache[key] = self._scores(ds, lambda b: self._outputs.score_stacked(frozen, prompt, b),
                                    stacked=True)
      return cache[key]

    results = []
    for run in range(k):
      results.append(self._metrics(lambda ds, r=run: outputs("predict", ds)[r],
                                   lambda ds, r=run: outputs("score", ds)[r], step, log_dirs[run]))
    return results


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
  raise ConfigError(f"BEST_METRIC {name!r} is not among the evaluation results; valid: "
                    f"{', '.join(available)}")
