"""Input pipeline: seqio tasks -> unpacked, padded, deterministic, resumable training batches.

The model's kind picks the features (`DatasetConfig.feature_layout`, int32 numpy):
  "encoder_decoder" (T5): t5x's encoder-decoder features, encoder_input_tokens [B, T],
    decoder_input_tokens (targets shifted right, 0 first), decoder_target_tokens and
    decoder_loss_weights [B, S];
  "decoder_only" (Llama, Gemma): inputs and targets as one sequence of L = T + S positions,
    decoder_target_tokens (inputs ++ targets, right-padded), decoder_input_tokens (shifted
    right, 0 first: the model puts its BOS there) and decoder_loss_weights (1 on the targets'
    tokens only), as `spot_jax.models.decoder_only` documents.
Both add two [B] bool flags, inputs_truncated / targets_truncated, so the trainer can count and
warn about truncation. The examples, their order and their truncation are the same in both.

Resuming: the stream is a pure function of (task, seed, host shard) and is positioned by the
number of batches already consumed (`start_position`), which the training state records.

Length buckets (`DatasetConfig.length_buckets`, off by default): the same example stream, read
in windows of `bucket_window` batches, each regrouped by `spot_jax.data.bucketing` into batches
padded only to their input-length bucket.

Task index (`DatasetConfig.task_names`, off by default): batches also hold `task_index` [B] int32,
each example's task as a position in `task_names` (see `spot_jax.data.task_index`); the examples
are the same as without it.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import pathlib
import sys
from typing import Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from spot_jax import validate as validate_lib
from spot_jax.data import bucketing
from spot_jax.data import task_index
from spot_jax.errors import ConfigError

MODEL_FEATURES = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
                  "decoder_loss_weights")
FEATURE_LAYOUTS = ("encoder_decoder", "decoder_only")


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
  """What to read and how (names follow t5x's `utils.DatasetConfig`).

  Attributes:
    mixture_or_task_name: a registered seqio task or mixture.
    task_feature_lengths: {"inputs": T, "targets": S} in tokens, EOS included, prompt excluded.
    split: dataset split.
    batch_size: global batch size (all hosts together).
    shuffle: shuffle the examples (deterministically, from `seed`).
    seed: shuffling/sampling seed.
    use_cached: read seqio's offline cache.
    pack: must be False: soft prompts and packing do not mix.
    module: python module(s) to import first so the task is registered, e.g. "tasks"; several
      may be given separated by commas.
    length_buckets: None (fixed padding to TASK_FEATURE_LENGTHS['inputs']), increasing input
      lengths such as (32, 64, 128, 256) (TASK_FEATURE_LENGTHS['inputs'] is always the last
      bucket), or "auto" (powers of two from 16 below the input length, then the input length).
      Lengths count real input tokens, EOS included, prompt excluded.
    bucket_window: batches regrouped together when length_buckets is set (larger: fewer mixed
      batches, more memory: window * batch_size examples are held at once).
    task_names: None (no task feature), or the seqio task names that give each example's
      `task_index` (its task's position here); every task the mixture reads must be listed.
    feature_layout: "encoder_decoder" or "decoder_only" (see the module docstring); the trainer
      sets it from the model (`feature_layout` of `spot_jax.models`).
  """
  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  split: str = "train"
  batch_size: int = 32
  shuffle: bool = True
  seed: Optional[int] = 0
  use_cached: bool = False
  pack: bool = False
  module: Optional[str] = None
  length_buckets: Union[None, str, Sequence[int]] = None
  bucket_window: int = 64
  task_names: Optional[Sequence[str]] = None
  feature_layout: str = "encoder_decoder"


def import_modules(module: Optional[str]) -> None:
  """Imports the comma-separated task modules (MIXTURE_OR_TASK_MODULE).

  Each is a module name, importable from the working directory (as `python -m` puts it on
  sys.path, whatever the entry point) or from sys.path, or the path of a `.py` file (imported
  once per process under the file's stem, e.g. 'my_tasks.py' -> module my_tasks).
  """
  for name in (m.strip() for m in (module or "").split(",")):
    if not name:
      continue
    if name.endswith(".py"):
      _import_file(name)
      continue
    if os.getcwd() not in sys.path and "" not in sys.path:
      sys.path.append(os.getcwd())
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:
      if e.name and not (name == e.name or name.startswith(e.name + ".")):
        raise ConfigError(f"MIXTURE_OR_TASK_MODULE {name!r} failed to import: {e}; install the "
                          f"module it needs, or fix the import in {name!r}") from None
      raise ConfigError(f"MIXTURE_OR_TASK_MODULE {name!r} cannot be imported ({e}); give a module "
                        f"that registers seqio tasks, importable from the working directory "
                        f"({os.getcwd()}) or PYTHONPATH (e.g. 'tasks', or 'my_tasks' for "
                        f"./my_tasks.py), or the path of a .py file") from None


def _import_file(path: str) -> None:
  """Imports the task module at `path` (a .py file) as its stem, once per process."""
  file = pathlib.Path(path).expanduser().resolve()
  if not file.is_file():
    raise ConfigError(f"MIXTURE_OR_TASK_MODULE {path!r} does not exist (looked in {os.getcwd()}); "
                      f"give the path of a .py file that registers seqio tasks, or a module name")
  loaded = sys.modules.get(file.stem)
  if loaded is not None and pathlib.Path(getattr(loaded, "__file__", "") or "").resolve() == file:
    return
  if loaded is not None:
    raise ConfigError(f"MIXTURE_OR_TASK_MODULE {path!r}: a module named {file.stem!r} is already "
                      f"imported from {loaded.__file__}; rename the file")
  spec = importlib.util.spec_from_file_location(file.stem, file)
  module = importlib.util.module_from_spec(spec)
  sys.modules[file.stem] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[file.stem]
    raise


def get_mixture_or_task(name: str, split: Optional[str] = None, setting: str = "split",
                        module: tuple[str, Optional[str]] = ("MIXTURE_OR_TASK_MODULE", None)):
  """The seqio task or mixture `name`; unknown names list close registered names.

  Args:
    name: a registered task or mixture.
    split: if given, a split every task of `name` must declare (checked without reading data).
    setting: what the user set `split` with, for the message (e.g. "EVAL_SPLIT").
    module: the setting that names the modules registering tasks, as the user writes it
      ("MIXTURE_OR_TASK_MODULE", "--task_module"), and its value (imported already).

  Raises:
    ConfigError: an unknown name (with close names, else naming the module setting to give)
      or a split a task does not have.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  try:
    found = seqio.get_mixture_or_task(name)
  except ValueError:
    names = sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))
    close = validate_lib.close_names(name, names)
    if close:
      raise ConfigError(f"unknown seqio task or mixture {name!r}; did you mean "
                        f"{', '.join(repr(c) for c in close)}?") from None
    flag, value = module
    imported = (f"{flag}={value!r} registers {len(names)} others" if value
                else f"no {flag} given, {len(names)} registered")
    raise ConfigError(
        f"unknown seqio task or mixture {name!r} ({imported}); set {flag} "
        f"to the module that registers it: 'my_tasks' for ./my_tasks.py, or the path of a .py "
        f"file (`python -m tasks list` shows the registered ones)") from None
  for task in (found.tasks if isinstance(found, seqio.Mixture) else [found]):
    splits = _declared_splits(task)
    if split is not None and splits is not None and split not in splits:
      raise ConfigError(f"{setting}={split!r}: task {task.name!r} has no such split; valid: "
                        f"{', '.join(map(repr, splits))}")
  return found


def _declared_splits(task) -> Optional[list[str]]:
  """The splits a task's source declares, or None when only reading the data would tell.

  A TFDS source without a split map lists its splits from the prepared dataset's metadata,
  which may not be there (reading it would wait for a download); it is not asked.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  source = task.source
  if isinstance(source, seqio.TfdsDataSource):
    split_map = getattr(source, "split_map", None)
    return list(split_map) if split_map else None
  try:
    return list(source.splits)
  except Exception:  # pylint: disable=broad-except  (a source that cannot list them up front)
    return None


def validate(cfg: DatasetConfig, prompt_length: int = 0) -> None:
  """Checks a dataset config against the model before any data is read."""
  if cfg.pack:
    raise ConfigError("packed examples are not supported: soft prompts attach to one example per "
                      "row, so set pack=False in the DatasetConfig")
  lengths = dict(cfg.task_feature_lengths or {})
  for key in ("inputs", "targets"):
    validate_lib.positive_int(lengths.get(key), f"TASK_FEATURE_LENGTHS[{key!r}]",
                              example=512 if key == "inputs" else 16)
  if lengths["inputs"] < prompt_length:
    raise ConfigError(f"TASK_FEATURE_LENGTHS['inputs']={lengths['inputs']} is shorter than the "
                      f"prompt ({prompt_length} tokens); the input length counts real tokens only "
                      f"and must be at least the prompt length")
  validate_lib.positive_int(cfg.batch_size, "BATCH_SIZE")
  validate_lib.one_of(cfg.feature_layout, "DatasetConfig.feature_layout", FEATURE_LAYOUTS)
  if cfg.task_names is not None and (isinstance(cfg.task_names, str) or not all(
      isinstance(n, str) for n in cfg.task_names)):
    raise ConfigError(f"TASK_NAMES={cfg.task_names!r}; give a list of seqio task names, e.g. "
                      f"['task_a', 'task_b'], or None")
  bucket_boundaries(cfg)


def bucket_boundaries(cfg: DatasetConfig) -> Optional[tuple[int, ...]]:
  """The input-length buckets of `cfg` (ending with TASK_FEATURE_LENGTHS['inputs']), or None."""
  return bucketing.boundaries(cfg.length_buckets, int(cfg.task_feature_lengths["inputs"]),
                              cfg.bucket_window)


def _trim(tf, tokens, length: int, eos_id: Optional[int]):
  """Trims to `length` (keeping a final EOS when the feature has one); returns (tokens, flag)."""
  n = tf.shape(tokens)[0]
  truncated = n > length
  if eos_id is None:
    return tokens[:length], truncated
  trimmed = tf.concat([tokens[:length - 1], tf.constant([eos_id], tokens.dtype)], axis=0)
  return tf.cond(truncated, lambda: trimmed, lambda: tokens), truncated


def _pad(tf, tokens, length: int):
  tokens = tf.cast(tokens, tf.int32)
  return tf.pad(tokens, [[0, length - tf.shape(tokens)[0]]])


def _to_model_features(tf, ex, input_length: int, target_length: int, eos: dict,
                       with_valid: bool = False):
  """The encoder-decoder features; `with_valid` adds encoder_input_valid / decoder_target_valid
  (int32, 1 at the tokens), made before padding so that id 0 can be a token."""
  inputs, in_trunc = _trim(tf, ex["inputs"], input_length, eos.get("inputs"))
  targets, tgt_trunc = _trim(tf, ex["targets"], target_length, eos.get("targets"))
  valid = {"encoder_input_valid": _pad(tf, tf.ones_like(inputs), input_length),
           "decoder_target_valid": _pad(tf, tf.ones_like(targets), target_length)}
  targets = _pad(tf, targets, target_length)
  features = {
      "encoder_input_tokens": _pad(tf, inputs, input_length),
      "decoder_target_tokens": targets,
      "decoder_input_tokens": tf.concat([tf.zeros([1], tf.int32), targets[:-1]], axis=0),
      "decoder_loss_weights": tf.cast(targets > 0, tf.int32),
      "inputs_truncated": in_trunc,
      "targets_truncated": tgt_trunc,
  }
  if with_valid:
    features.update(valid)
  if task_index.FEATURE in ex:
    features[task_index.FEATURE] = tf.cast(ex[task_index.FEATURE], tf.int32)
  return features


def _to_decoder_only(tf, features: dict, length: int):
  """Encoder-decoder features (with validity) -> the decoder-only layout: one sequence of
  `length` = T + S, and decoder_target_valid (1 at its tokens; see models/decoder_only.py)."""
  inputs, targets = features.pop("encoder_input_tokens"), features["decoder_target_tokens"]
  in_valid = features.pop("encoder_input_valid") > 0
  tgt_valid = features["decoder_target_valid"] > 0
  real = tf.boolean_mask(inputs, in_valid)  # right-padded: the real tokens, in order
  target = tf.boolean_mask(targets, tgt_valid)
  sequence = _pad(tf, tf.concat([real, target], axis=0), length)
  weights = tf.concat([tf.zeros_like(real), tf.ones_like(target)], axis=0)
  features["decoder_target_tokens"] = sequence
  features["decoder_input_tokens"] = tf.concat([tf.zeros([1], tf.int32), sequence[:-1]], axis=0)
  features["decoder_loss_weights"] = _pad(tf, weights, length)
  features["decoder_target_valid"] = _pad(tf, tf.ones_like(tf.concat([real, target], 0)), length)
  return features


def train_batches(cfg: DatasetConfig, *, start_position: int = 0, shard_id: int = 0,
                  num_shards: int = 1) -> Iterator[dict[str, np.ndarray]]:
  """An endless, deterministic iterator of this host's share of each global batch.

  Every host reads the same global stream and keeps rows [shard_id * b, (shard_id + 1) * b)
  of each global batch (b = batch_size / num_shards), so the global batches, and hence the
  training run, do not depend on how many hosts share them (a job resumed on another topology
  sees the same data). Reading the whole stream on each host costs only tokenisation, which is
  small next to a T5 step for prompt-tuning batch sizes.

  Args:
    cfg: the dataset configuration.
    start_position: batches already consumed (skipped, so a resumed run sees the same data).
    shard_id: this host's index.
    num_shards: number of hosts.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  validate(cfg)
  if cfg.batch_size % num_shards:
    raise ConfigError(f"BATCH_SIZE={cfg.batch_size} must be divisible by the number of hosts "
                      f"{num_shards}")
  import_modules(cfg.module)
  source = get_mixture_or_task(cfg.mixture_or_task_name)
  lengths = {k: int(v) for k, v in cfg.task_feature_lengths.items()}
  features = source.output_features
  eos = {k: f.vocabulary.eos_id for k, f in features.items() if getattr(f, "add_eos", False)}
  # Ask seqio for one extra token: an example that fills it was longer than the feature length,
  # so it can be counted before we trim it ourselves.
  kwargs = dict(sequence_length={k: v + 1 for k, v in lengths.items()}, split=cfg.split,
                use_cached=cfg.use_cached, shuffle=cfg.shuffle, seed=cfg.seed, num_epochs=None)
  if cfg.task_names is None:
    ds = source.get_dataset(**kwargs)
  else:
    ds = task_index.indexed_dataset(source, cfg.task_names, **kwargs)
  decoder_only = cfg.feature_layout == "decoder_only"
  ds = ds.map(lambda ex: _to_model_features(tf, ex, lengths["inputs"], lengths["targets"], eos,
                                            decoder_only),
              num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if cfg.feature_layout == "decoder_only":
    total = lengths["inputs"] + lengths["targets"]
    ds = ds.map(lambda ex: _to_decoder_only(tf, ex, total), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
  rows = cfg.batch_size // num_shards
  lo = shard_id * rows
  boundaries = bucket_boundaries(cfg)
  if boundaries is not None:
    return _bucketed(ds, cfg, boundaries, start_position, lo, rows)
  ds = ds.batch(cfg.batch_size, drop_remainder=True)
  if num_shards > 1:
    ds = ds.map(lambda batch: {k: v[lo:lo + rows] for k, v in batch.items()})
  if start_position:
    ds = ds.skip(start_position)
  ds = ds.prefetch(2)
  return _without_autotune(tf, ds).as_numpy_iterator()


def _without_autotune(tf, ds):
  """The dataset with tf.data's autotuning off (the map's parallelism: the CPU count).

  Releasing an autotuned iterator waits for its optimisation thread, which sleeps up to a minute
  between rounds: a K-run job released its K training streams in 15-112 s of idle waiting, the
  third of the embedded demo's time (2.3 s against 0.1 s for 20 streams on an idle machine).
  The examples and their order do not change (the map is deterministic).
  """
  options = tf.data.Options()
  options.autotune.enabled = False
  return ds.with_options(options)


def _bucketed(ds, cfg: DatasetConfig, boundaries: Sequence[int], start_position: int, lo: int,
              rows: int) -> Iterator[dict[str, np.ndarray]]:
  """Bucketed global batches (this host's rows), positioned at `start_position` batches."""
  window = cfg.bucket_window
  first, skip = divmod(start_position, window)
  ds = ds.batch(window * cfg.batch_size, drop_remainder=True).skip(first).prefetch(1)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for index, examples in enumerate(_without_autotune(tf, ds).as_numpy_iterator(), start=first):
    rng = bucketing.window_rng(cfg.seed, index)
    for batch in bucketing.bucket_batches(examples, cfg.batch_size, boundaries, rng)[skip:]:
      yield {k: v[lo:lo + rows] for k, v in batch.items()}
    skip = 0
