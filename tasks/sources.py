"""seqio data sources that never reach the network.

* `TfdsSource`: a TFDS dataset already prepared under the TFDS data_dir. Before
  TFDS is asked for anything, the prepared `dataset_info.json` is looked for with
  a plain `os.path.exists`; when it is absent a `DataNotFoundError` names the path
  and the `tfds build` command that prepares it. Reads use `as_dataset` only
  (`read_only=True`), never `tfds.load(download=True)`.
* `FileSource`: local jsonl / csv / tsv files, `<dir>/<dataset>/<split>.<ext>`.
* `HfSource`: a Hugging Face `datasets` dataset (optional, imported lazily).

`FileSource` and `HfSource` yield examples shaped like the TFDS features of the
same dataset (given by a `Schema`), so a task's preprocessors work on any source.

Attributes:
  Schema: maps a feature key (nested keys joined by "/") to one of FIELD_TYPES.
  FIELD_TYPES: the value types a `Schema` may name, with their tf signatures.
  FILE_EXTENSIONS: local file formats, in the order they are looked for.
"""
from __future__ import annotations

import csv
import functools
import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import seqio
import tensorflow as tf

from tasks import data_dirs
from tasks.data_dirs import DataNotFoundError

from spot_jax.errors import ConfigError

Schema = Mapping[str, str]
FIELD_TYPES = {
    "str": tf.TensorSpec([], tf.string),
    "int": tf.TensorSpec([], tf.int64),
    "float": tf.TensorSpec([], tf.float32),
    "str_list": tf.TensorSpec([None], tf.string),
    "str_list_list": tf.TensorSpec([None, None], tf.string),
}
FILE_EXTENSIONS = ("jsonl", "csv", "tsv")
# Columns that may be left out of local files: idx defaults to the row number,
# label to -1 (unlabelled, as TFDS test splits).
_DEFAULTS = {"idx": "row", "label": -1}


def parse_tfds_name(tfds_name: str) -> Tuple[str, Optional[str], str]:
  """Splits "name/config:version" into (name, config or None, version)."""
  if ":" not in tfds_name:
    raise ValueError(f"TFDS name {tfds_name!r} must pin a version, e.g. 'glue/rte:2.0.0'")
  name_config, version = tfds_name.split(":", 1)
  name, _, config = name_config.partition("/")
  return name, config or None, version


def tfds_prepared_path(tfds_name: str, data_dir: str) -> str:
  """Path of the `dataset_info.json` that TFDS writes when it prepares `tfds_name`."""
  name, config, version = parse_tfds_name(tfds_name)
  parts = [data_dir, name] + ([config] if config else []) + [version, "dataset_info.json"]
  return os.path.join(*parts)


def tfds_build_command(tfds_name: str, data_dir: str) -> str:
  name, config, _ = parse_tfds_name(tfds_name)
  config_flag = f" --config={config}" if config else ""
  return f"tfds build {name}{config_flag} --data_dir={data_dir}"


class TfdsSource(seqio.TfdsDataSource):
  """A prepared TFDS dataset, checked locally before TFDS is touched.

  Attributes:
    tfds_name: "name/config:version" (the version is always pinned).
    split_map: canonical split -> TFDS split (e.g. "validation" -> "validation_matched").
  """

  def __init__(self, tfds_name: str, splits: Mapping[str, str],
               data_dir: Optional[str] = None,
               train_filter: Optional[Callable[[Mapping[str, tf.Tensor]], tf.Tensor]] = None):
    """Creates the source.

    Args:
      tfds_name: "name/config:version".
      splits: canonical split -> TFDS split name.
      data_dir: fixed TFDS data_dir; None uses `data_dirs.tfds_data_dir()` at read time.
      train_filter: optional predicate applied to the "train" split only (T5 trains
        WSC on correct referents only but evaluates on all examples).
    """
    parse_tfds_name(tfds_name)
    super().__init__(tfds_name=tfds_name, splits=dict(splits), read_only=True)
    self.tfds_name = tfds_name
    self.split_map = dict(splits)
    self._fixed_data_dir = data_dir
    self.train_filter = train_filter
    self._loaders: Dict[str, seqio.LazyTfdsLoader] = {}

  @property
  def data_dir(self) -> str:
    return self._fixed_data_dir or data_dirs.tfds_data_dir()

  def _loader(self) -> seqio.LazyTfdsLoader:
    data_dir = self.data_dir
    if data_dir not in self._loaders:
      self._loaders[data_dir] = seqio.LazyTfdsLoader(
          self.tfds_name, data_dir=data_dir, split_map=self.split_map, read_only=True)
    return self._loaders[data_dir]

  def is_present(self) -> bool:
    """Whether the prepared files exist locally (a file-system check only)."""
    return os.path.exists(tfds_prepared_path(self.tfds_name, self._loader().data_dir))

  def check_present(self) -> None:
    """Raises `DataNotFoundError` (one line) when the dataset is not prepared."""
    data_dir = self._loader().data_dir
    path = tfds_prepared_path(self.tfds_name, data_dir)
    if not os.path.exists(path):
      raise DataNotFoundError(
          f"TFDS dataset {self.tfds_name} is not prepared in data_dir {data_dir} "
          f"(missing {path}); on a machine with internet run "
          f"`{tfds_build_command(self.tfds_name, data_dir)}` and copy the folder here, "
          f"or point $TFDS_DATA_DIR / tasks.set_tfds_data_dir() at a prepared data_dir")

  @property
  def tfds_dataset(self) -> seqio.LazyTfdsLoader:
    self.check_present()
    return self._loader()

  def get_dataset(self, split: Optional[str] = None, shuffle: bool = True,
                  seed: Optional[int] = None, shard_info=None, **kwargs) -> tf.data.Dataset:
    split = split or "train"
    if split not in self.split_map:
      raise ConfigError(f"split {split!r} is not one of {sorted(self.split_map)} for "
                        f"{self.tfds_name}")
    ds = super().get_dataset(split, shuffle=shuffle, seed=seed, shard_info=shard_info, **kwargs)
    if split == "train" and self.train_filter is not None:
      ds = ds.filter(self.train_filter)
    return ds

  def describe(self) -> str:
    return f"tfds:{self.tfds_name}"


def _convert(value: Any, kind: str, key: str, where: str):
  """Converts one raw value (json or csv cell) to the Python value of `kind`."""
  try:
    if kind == "str":
      return "" if value is None else str(value)
    if kind == "int":
      return int(value)
    if kind == "float":
      return float(value)
    if isinstance(value, str):  # list-valued csv/tsv cells hold JSON
      value = json.loads(value)
    if kind == "str_list":
      return [str(v) for v in value]
    if kind == "str_list_list":
      return [[str(v) for v in row] for row in value]
  except (TypeError, ValueError) as e:
    raise ConfigError(f"{where}: column {key!r} value {value!r} is not a valid {kind} ({e})") from e
  raise ValueError(f"unknown field type {kind!r} for {key!r}; valid: {sorted(FIELD_TYPES)}")


def _lookup(row: Mapping[str, Any], key: str) -> Tuple[bool, Any]:
  """Finds `key` in a row as a flat column ("idx/question") or nested json ({"idx": {...}})."""
  if key in row:
    return True, row[key]
  node: Any = row
  for part in key.split("/"):
    if not isinstance(node, Mapping) or part not in node:
      return False, None
    node = node[part]
  return True, node


def _nest(flat: Mapping[str, Any]) -> Dict[str, Any]:
  out: Dict[str, Any] = {}
  for key, value in flat.items():
    node = out
    parts = key.split("/")
    for part in parts[:-1]:
      node = node.setdefault(part, {})
    node[parts[-1]] = value
  return out


def rows_to_examples(rows: Sequence[Mapping[str, Any]], schema: Schema,
                     where: str) -> List[Dict[str, Any]]:
  """Converts raw rows to examples shaped like the schema (nested at "/")."""
  examples = []
  for i, row in enumerate(rows):
    flat = {}
    for key, kind in schema.items():
      found, value = _lookup(row, key)
      if not found:
        if key not in _DEFAULTS:
          raise ConfigError(f"{where}: row {i} has no column {key!r}; required columns: "
                            f"{sorted(schema)}")
        value = i if _DEFAULTS[key] == "row" else _DEFAULTS[key]
      flat[key] = _convert(value, kind, key, f"{where} row {i}")
    examples.append(_nest(flat))
  return examples


def _signature(schema: Schema) -> Dict[str, Any]:
  return _nest({key: FIELD_TYPES[kind] for key, kind in schema.items()})


def examples_dataset(examples: List[Dict[str, Any]], schema: Schema) -> tf.data.Dataset:
  """A tf.data.Dataset yielding the given examples with the schema's signature."""
  return tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=_signature(schema))


def read_rows(path: str) -> List[Dict[str, Any]]:
  """Reads a jsonl (one object per line), csv or tsv (header row) file."""
  if path.endswith(".jsonl"):
    with open(path, encoding="utf-8") as f:
      return [json.loads(line) for line in f if line.strip()]
  delimiter = "\t" if path.endswith(".tsv") else ","
  with open(path, encoding="utf-8", newline="") as f:
    return list(csv.DictReader(f, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL))


@functools.lru_cache(maxsize=64)
def _read_examples(path: str, mtime: float,
                   schema_items: Tuple[Tuple[str, str], ...]) -> List[Dict[str, Any]]:
  del mtime  # part of the cache key only: an edited file is read again
  return rows_to_examples(read_rows(path), dict(schema_items), path)


class _ExamplesSource(seqio.DataSource):
  """Shared logic of sources that load a split as a list of examples in memory."""

  def __init__(self, splits: Sequence[str], schema: Schema,
               train_filter: Optional[Callable[[Mapping[str, tf.Tensor]], tf.Tensor]] = None):
    super().__init__(splits=splits)
    self.schema = dict(schema)
    self.train_filter = train_filter
    for key, kind in self.schema.items():
      if kind not in FIELD_TYPES:
        raise ValueError(f"schema field {key!r} has type {kind!r}; valid: {sorted(FIELD_TYPES)}")

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return False

  def _examples(self, split: str) -> List[Dict[str, Any]]:
    raise NotImplementedError

  def list_shards(self, split: str) -> Sequence[str]:
    return [split]

  def num_input_examples(self, split: str) -> int:
    return len(self._examples(split))

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: Optional[int] = None,
                  shard_info=None, **unused_kwargs) -> tf.data.Dataset:
    if split not in self.splits:
      raise ConfigError(f"split {split!r} is not one of {list(self.splits)} for {self.describe()}")
    examples = self._examples(split)
    ds = examples_dataset(examples, self.schema)
    if shard_info is not None:
      ds = ds.shard(shard_info.num_shards, shard_info.index)
    if shuffle:
      ds = ds.shuffle(max(len(examples), 1), seed=seed)
    if split == "train" and self.train_filter is not None:
      ds = ds.filter(self.train_filter)
    return ds

  def describe(self) -> str:
    raise NotImplementedError


class FileSource(_ExamplesSource):
  """Local jsonl / csv / tsv files laid out as `<dir>/<dataset>/<split>.<ext>`.

  Attributes:
    dataset: the sub-folder name (e.g. "cr", "glue_rte").
    schema: column -> type; nested keys ("idx/question") are flat csv columns or
      nested json objects.
  """

  def __init__(self, dataset: str, schema: Schema, splits: Sequence[str] = ("train", "validation"),
               data_dir: Optional[str] = None,
               train_filter: Optional[Callable[[Mapping[str, tf.Tensor]], tf.Tensor]] = None):
    super().__init__(splits=splits, schema=schema, train_filter=train_filter)
    self.dataset = dataset
    self._fixed_data_dir = data_dir

  @property
  def data_dir(self) -> Optional[str]:
    return self._fixed_data_dir or data_dirs.files_dir()

  def split_path(self, split: str) -> Optional[str]:
    """The existing file for `split` (first of jsonl, csv, tsv), or None."""
    if not self.data_dir:
      return None
    for ext in FILE_EXTENSIONS:
      path = os.path.join(self.data_dir, self.dataset, f"{split}.{ext}")
      if os.path.exists(path):
        return path
    return None

  def is_present(self) -> bool:
    return all(self.split_path(s) for s in self.splits if s != "test")

  def _examples(self, split: str) -> List[Dict[str, Any]]:
    if not self.data_dir:
      raise DataNotFoundError(
          f"local dataset {self.dataset!r} needs a files directory: set ${data_dirs.FILES_ENV} "
          f"or tasks.set_files_dir() to a folder holding {self.dataset}/{split}.jsonl (or "
          ".csv/.tsv)")
    path = self.split_path(split)
    if path is None:
      expected = os.path.join(self.data_dir, self.dataset, f"{split}.jsonl")
      raise DataNotFoundError(
          f"local data file not found: {expected} (nor .csv/.tsv); write split {split!r} of "
          f"{self.dataset!r} there with columns {sorted(self.schema)} (see docs/tasks.md)")
    return _read_examples(path, os.path.getmtime(path), tuple(sorted(self.schema.items())))

  def describe(self) -> str:
    return (
        f"files:{self.data_dir or '$' + data_dirs.FILES_ENV}/{self.dataset}/<split>.jsonl|csv|tsv")


class HfSource(_ExamplesSource):
  """A Hugging Face `datasets` dataset, converted to the TFDS-shaped schema.

  `datasets` is optional and imported only when data is read. Set
  HF_DATASETS_OFFLINE=1 to use only the local Hugging Face cache.

  Attributes:
    path, name: arguments of `datasets.load_dataset`.
    split_map: canonical split -> Hugging Face split.
    row_fn: optional function mapping a Hugging Face row to the schema's columns.
  """

  def __init__(self, path: str, schema: Schema, split_map: Mapping[str, str],
               name: Optional[str] = None,
               row_fn: Optional[Callable[[Mapping[str, Any]], Mapping[str, Any]]] = None,
               train_filter: Optional[Callable[[Mapping[str, tf.Tensor]], tf.Tensor]] = None):
    super().__init__(splits=tuple(split_map), schema=schema, train_filter=train_filter)
    self.path, self.name, self.split_map, self.row_fn = path, name, dict(split_map), row_fn
    self._cache: Dict[str, List[Dict[str, Any]]] = {}

  def is_present(self) -> bool:
    try:
      import datasets  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
      return False
    return True

  def _examples(self, split: str) -> List[Dict[str, Any]]:
    if split not in self._cache:
      try:
        import datasets  # pylint: disable=import-outside-toplevel
      except ImportError as e:
        raise ImportError(
            f"Hugging Face source {self.path}/{self.name} needs the optional `datasets` package; "
            "install it with `pip install datasets` or use the TFDS / local-files source") from e
      hf = datasets.load_dataset(self.path, self.name, split=self.split_map[split])
      rows = [self.row_fn(r) if self.row_fn else r for r in hf]
      self._cache[split] = rows_to_examples(rows, self.schema,
                                            f"hf:{self.path}/{self.name}:{split}")
    return self._cache[split]

  def describe(self) -> str:
    return f"hf:{self.path}" + (f"/{self.name}" if self.name else "")
