"""Your own task from a file: `register_file_task` registers a seqio task reading TSV or JSONL.

A file per split (train, and usually validation; test optional), each example one row:
  * TSV: a header row naming the columns, then one example per line, fields separated by tabs
    (no quoting: a field holds any text but a tab or a newline);
  * JSONL: one JSON object per line (`{"inputs": "...", "targets": "..."}`);
  * CSV: a header row, comma-separated, with CSV quoting.
The input column (default "inputs") becomes the model's input text and the target column
(default "targets") the text it learns to write.

  import tasks
  tasks.register_file_task("my_sentiment_v1", train="train.tsv", validation="validation.tsv",
                           labels=("positive", "negative"), vocabulary="embedded")

With `labels` (classification) every target must be one of the label words; predictions are
mapped to the label's index (-1 for text that is no label, counted wrong) and the metric is
accuracy, or "f1" (two labels; the second is the positive class), "matthews_corrcoef" or
"mean_f1". Without `labels` (text to text) predictions are compared as stripped text:
"accuracy" is exact match; with `answer=` (`tasks.answers`: "gsm8k" or a regular expression)
the answers extracted from both are compared instead ("exact_match"). Any seqio metric function
`(targets, predictions) -> dict` may be given instead of a name.

The vocabulary follows the model the prompt is trained on: "embedded" for the embedded toy T5
(`spot_jax.embedded.VOCAB_PATH`, 100 sentinel ids), "t5" for T5 checkpoints (`tasks.vocab`,
`$SPOT_JAX_VOCAB` or the public cc_all.32000 model), or a `seqio.Vocabulary`.

Files are read (and checked) when the task is registered: a problem is one `ConfigError` line
naming the file and row. Relative paths are relative to the working directory at that moment.
Registering the same name with the same arguments again does nothing (modules may be imported
once per process); with other arguments it replaces the earlier definition. Names carry a
version as every task here does (`<name>_v<N>`): bump it when the data or the format changes.
"""
from __future__ import annotations

import csv
import functools
import json
import os
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import seqio

from spot_jax.errors import ConfigError
from tasks import answers
from tasks import metrics as metrics_lib
from tasks import postprocessors, sources, vocab

PathLike = Union[str, "os.PathLike[str]"]
FILE_TYPES = (".tsv", ".jsonl", ".csv")
VOCABULARIES = ("embedded", "t5")
CLASS_METRICS = ("accuracy", "f1", "matthews_corrcoef", "mean_f1")
TEXT_METRICS = ("accuracy",)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*_v[0-9]+$")
# name -> the arguments it was registered with (equal arguments: registering again is a no-op).
_REGISTERED: Dict[str, tuple] = {}


class _UserFileSource(sources._ExamplesSource):  # pylint: disable=protected-access
  """The checked examples of one user task, held in memory ({"inputs", "targets"} strings)."""

  def __init__(self, examples: Mapping[str, List[Dict[str, str]]], files: Mapping[str, str]):
    super().__init__(splits=tuple(examples), schema={"inputs": "str", "targets": "str"})
    self._by_split = dict(examples)
    self._files = dict(files)

  def _examples(self, split: str) -> List[Dict[str, str]]:
    return self._by_split[split]

  def describe(self) -> str:
    return "files:" + ",".join(f"{s}={p}" for s, p in self._files.items())


def _cell(value: Any, where: str, column: str) -> str:
  """A JSON value or TSV field as text (numbers and booleans as written); lists are refused."""
  if value is None:
    raise ConfigError(f"{where}: column {column!r} is empty; give every row a value")
  if isinstance(value, (dict, list)):
    raise ConfigError(f"{where}: column {column!r} holds a JSON {type(value).__name__}; give text "
                      f"(or a number)")
  return value if isinstance(value, str) else json.dumps(value)


def _rows(path: str) -> List[tuple[int, Mapping[str, Any]]]:
  """(line number, row) of a TSV/CSV (header row first) or JSONL file."""
  name = os.path.basename(path)
  rows = []
  with open(path, encoding="utf-8", newline="") as f:
    if path.endswith(".jsonl"):
      for number, line in enumerate(f, start=1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise ConfigError(f"{name} line {number} is not JSON ({e.msg}); write one JSON object "
                            f"per line") from None
        if not isinstance(row, dict):
          raise ConfigError(f"{name} line {number} is a JSON {type(row).__name__}, not an object; "
                            f"write one object per line, e.g. {{\"inputs\": \"...\", "
                            f"\"targets\": \"...\"}}")
        rows.append((number, row))
      return rows
    tsv = path.endswith(".tsv")
    reader = csv.DictReader(f, delimiter="\t" if tsv else ",",
                            quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
    header = reader.fieldnames or []
    for row in reader:
      number = reader.line_num
      if None in row or None in row.values():
        fields = len(header) + len(row.get(None, [])) - sum(v is None for v in row.values())
        raise ConfigError(f"{name} line {number} has {fields} fields but the header has "
                          f"{len(header)} ({', '.join(header)}); separate fields with "
                          f"{'tabs' if tsv else 'commas'}")
      if any(v.strip() for v in row.values()):
        rows.append((number, row))
  return rows


def _read_split(path: str, inputs: str, targets: str,
                labels: Optional[Sequence[str]]) -> List[Dict[str, str]]:
  """The checked {"inputs", "targets"} examples of one file."""
  name = os.path.basename(path)
  rows = _rows(path)
  if not rows:
    raise ConfigError(f"{path} has no examples; write a header row and one example per line "
                      f"(or one JSON object per line)")
  examples = []
  for number, row in rows:
    for column in (inputs, targets):
      if column not in row:
        raise ConfigError(f"{name} line {number} has no column {column!r} (its columns: "
                          f"{', '.join(map(str, row))}); name the columns with inputs=/targets=")
    where = f"{name} line {number}"
    text, target = _cell(row[inputs], where, inputs), _cell(row[targets], where, targets).strip()
    if not target:
      raise ConfigError(f"{where}: the target ({targets!r}) is empty; every example needs one")
    if labels is not None and target not in labels:
      raise ConfigError(f"{where}: target {target!r} is not one of the label words "
                        f"({', '.join(map(repr, labels))}); fix the row or add the word to labels")
    examples.append({"inputs": text, "targets": target})
  return examples


def _features(vocabulary: Union[str, seqio.Vocabulary]) -> Mapping[str, seqio.Feature]:
  if isinstance(vocabulary, seqio.Vocabulary):
    return {"inputs": seqio.Feature(vocabulary, add_eos=True, required=False),
            "targets": seqio.Feature(vocabulary, add_eos=True)}
  if vocabulary == "t5":
    return vocab.output_features()
  if vocabulary == "embedded":
    from spot_jax import embedded  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(embedded.VOCAB_PATH):
      raise ConfigError(f"the embedded model's vocabulary {embedded.VOCAB_PATH} does not exist; "
                        f"unset ${embedded.TOY_DIR_ENV} or point it at a folder made by "
                        f"spot_jax.embedded.pretrain")
    return _features(seqio.SentencePieceVocabulary(embedded.VOCAB_PATH, extra_ids=vocab.EXTRA_IDS))
  raise ConfigError(f"vocabulary={vocabulary!r}; give the model's: 'embedded' (the embedded toy "
                    f"T5), 't5' (T5 checkpoints) or a seqio.Vocabulary")


def _metric(metric: Union[None, str, Callable[..., Any]],
            labels: Optional[Sequence[str]]) -> Callable[..., Any]:
  if callable(metric):
    return metric
  valid = CLASS_METRICS if labels is not None else TEXT_METRICS
  if metric is None or metric == "accuracy":
    return metrics_lib.accuracy
  if metric not in valid:
    kind = "classification (labels=...)" if labels is not None else "text-to-text tasks (no labels)"
    raise ConfigError(f"metric={metric!r}; valid for {kind}: {', '.join(map(repr, valid))}, or a "
                      f"function (targets, predictions) -> dict")
  if metric == "f1":
    if len(labels) != 2:
      raise ConfigError(f"metric='f1' is binary and needs 2 labels, got {len(labels)}; use "
                        f"'mean_f1' for more")
    return metrics_lib.f1_score_with_invalid
  if metric == "matthews_corrcoef":
    return metrics_lib.matthews_corrcoef
  return metrics_lib.mean_multiclass_f1(len(labels))


def _strip_text(output, example=None, is_target=False) -> str:
  del example, is_target
  return postprocessors.as_text(output).strip()


def _check_labels(labels: Optional[Sequence[str]]) -> Optional[tuple[str, ...]]:
  if labels is None:
    return None
  if (isinstance(labels, str)
      or not all(isinstance(w, str) and w.strip() == w and w for w in labels)):
    raise ConfigError(f"labels={labels!r}; give the label words as a list of non-empty strings "
                      f"without surrounding spaces, e.g. ('positive', 'negative')")
  labels = tuple(labels)
  if len(labels) < 2 or len(set(labels)) != len(labels):
    raise ConfigError(f"labels={labels!r}; give at least 2 distinct label words")
  return labels


def _check_file(split: str, path: PathLike) -> str:
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if not path.endswith(FILE_TYPES):
    raise ConfigError(f"{split} file {path!r} is not a .tsv, .jsonl or .csv file; give "
                      "one of those")
  if not os.path.isfile(path):
    raise ConfigError(f"{split} file {path} does not exist; give the path of a .tsv or .jsonl file "
                      f"(relative paths start at the working directory, {os.getcwd()})")
  return path


def register_file_task(name: str, train: PathLike, validation: Optional[PathLike] = None,
                       test: Optional[PathLike] = None, *, inputs: str = "inputs",
                       targets: str = "targets", labels: Optional[Sequence[str]] = None,
                       vocabulary: Union[None, str, seqio.Vocabulary] = None,
                       metric: Union[None, str, Callable[..., Any]] = None,
                       answer: Optional[str] = None) -> str:
  """Registers seqio task `name` reading the given files; returns `name`.

  Args:
    name: the task's name, versioned: `<name>_v<N>`, e.g. "my_sentiment_v1".
    train: the training file (.tsv, .jsonl or .csv).
    validation: the evaluation file (what EVAL_SPLIT='validation' reads); None: no such split.
    test: a test file, or None.
    inputs: the column holding the input text.
    targets: the column holding the target text (the label word for classification).
    labels: the label words of a classification task, or None for text to text.
    vocabulary: the model's: "embedded", "t5" or a `seqio.Vocabulary` (required).
    metric: a metric name (see the module docstring; default accuracy) or a seqio metric function.
    answer: text to text only: an answer extractor ("gsm8k" or a regular expression); the
      metric is then exact match of the extracted answers.

  Returns:
    `name`, registered in `seqio.TaskRegistry`.

  Raises:
    ConfigError: one line naming what is wrong (name, file, column, row, label, ...).
  """
  if not isinstance(name, str) or not _NAME.match(name):
    raise ConfigError(f"task name {name!r} must be a word ending with a version, e.g. 'my_task_v1' "
                      f"(letters, digits, underscores)")
  if vocabulary is None:
    raise ConfigError(f"register_file_task({name!r}) needs vocabulary=: 'embedded' for the "
                      "embedded toy T5, 't5' for T5 checkpoints, or a seqio.Vocabulary")
  labels = _check_labels(labels)
  given = {"train": train, "validation": validation, "test": test}
  files = {split: _check_file(split, path) for split, path in given.items() if path is not None}
  key = (tuple((s, p, os.path.getmtime(p)) for s, p in files.items()), inputs, targets, labels,
         vocabulary if isinstance(vocabulary, str) else id(vocabulary),
         metric if isinstance(metric, str) or metric is None else id(metric), answer)
  if name in seqio.TaskRegistry.names():
    if _REGISTERED.get(name) == key:
      return name
    if name not in _REGISTERED:
      raise ConfigError(f"a task named {name!r} is already registered by another module; choose "
                        f"another name")
  features = _features(vocabulary)
  metric_fn = _metric(metric, labels)
  if answer is not None:
    if labels is not None or metric is not None:
      raise ConfigError(f"answer={answer!r} scores text-to-text tasks by their extracted answers; "
                        "give it without labels= and metric=")
    metric_fn = answers.exact_match
  examples = {split: _read_split(path, inputs, targets, labels) for split, path in files.items()}
  postprocess = (_strip_text if labels is None else
                 functools.partial(postprocessors.string_label_to_class_id, label_classes=labels))
  if answer is not None:
    postprocess = answers.postprocessor(answer)
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)  # ours, redefined (e.g. an edited file)
  seqio.TaskRegistry.add(
      name, source=_UserFileSource(examples, files),
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
      output_features=features, postprocess_fn=postprocess, metric_fns=[metric_fn])
  _REGISTERED[name] = key
  return name
