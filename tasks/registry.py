"""Idempotent seqio registration of spot-jax tasks and their source variants.

A `TaskSpec` holds everything that defines a task except where its data comes
from; `register(spec)` adds the task (and its taskless variant) to
`seqio.TaskRegistry`. `register_file_variant` / `register_hf_variant` add the
same task reading local files or Hugging Face `datasets` instead.

Attributes:
  SPECS: registered task name -> its `TaskSpec` (taskless variants included).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import seqio

from tasks import names, sources, vocab
from tasks import preprocessors as pp


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One task's definition.

  Attributes:
    name: registered name (`spot_<dataset>_v200`).
    source: the default data source (TFDS or local files).
    text_preprocessors: raw example -> {"inputs", "targets"} strings (before tokenization).
    schema: the raw example's fields (TFDS feature layout), used by file/HF sources.
    postprocess_fn: seqio postprocessor, or None.
    metric_fns: seqio metric functions `(targets, predictions) -> dict`.
    token_preprocessors: preprocessors applied after tokenization (C4 prefix-LM).
    hf: optional default Hugging Face location: (path, name, split_map, row_fn).
    formats: short description of inputs -> targets for the docs and `python -m tasks list`.
  """
  name: str
  source: seqio.DataSource
  text_preprocessors: Sequence[Callable[..., Any]]
  schema: sources.Schema
  postprocess_fn: Optional[Callable[..., Any]] = None
  metric_fns: Sequence[Callable[..., Any]] = ()
  token_preprocessors: Sequence[Callable[..., Any]] = ()
  hf: Optional[tuple] = None
  formats: str = ""


SPECS: Dict[str, TaskSpec] = {}


def _add(name: str, spec: TaskSpec, source: seqio.DataSource, taskless: bool) -> None:
  """Adds one seqio task unless a task of that name is already registered."""
  SPECS.setdefault(name, dataclasses.replace(spec, name=name, source=source))
  if name in seqio.TaskRegistry.names():
    return
  steps = list(spec.text_preprocessors)
  if taskless:
    steps.append(pp.drop_task_name)
  steps += [seqio.preprocessors.tokenize, *spec.token_preprocessors,
            seqio.preprocessors.append_eos_after_trim]
  seqio.TaskRegistry.add(name, source=source, preprocessors=steps,
                         output_features=vocab.output_features(),
                         postprocess_fn=spec.postprocess_fn, metric_fns=list(spec.metric_fns))


def register(spec: TaskSpec) -> None:
  """Registers `spec.name` and, unless the task has no task-name prefix, its taskless variant."""
  _add(spec.name, spec, spec.source, taskless=False)
  if spec.name not in names.NO_TASKLESS:
    _add(names.taskless_name(spec.name), spec, spec.source, taskless=True)


def _variant_name(name: str, kind: str) -> str:
  suffix = f"_{names.VERSION}"
  return name[: -len(suffix)] + f"_{kind}{suffix}"


def _spec(name: str) -> TaskSpec:
  if name not in SPECS:
    raise KeyError(f"{name!r} is not a registered spot task; known: {sorted(SPECS)[:5]}... "
                   f"({len(SPECS)} in all)")
  return SPECS[name]


def register_file_variant(name: str, data_dir: Optional[str] = None, dataset: Optional[str] = None,
                          splits: Sequence[str] = ("train", "validation")) -> str:
  """Registers task `name` reading local jsonl/csv/tsv files; returns the new task's name.

  Args:
    name: a registered spot task (taskless or not), e.g. "spot_glue_rte_v200".
    data_dir: the files directory; None uses $SPOT_JAX_DATA_DIR / tasks.set_files_dir().
    dataset: sub-folder of the files directory; default the task's dataset key ("glue_rte").
    splits: the splits the files provide.

  Returns:
    `<name without version>_files_v200`, with the same preprocessing, postprocessor
    and metrics as `name`, reading `<data_dir>/<dataset>/<split>.<jsonl|csv|tsv>`.
  """
  spec = _spec(name)
  taskless = name.endswith(f"_taskless_{names.VERSION}")
  base = name.replace("_taskless", "")
  dataset = dataset or base[len("spot_"): -len(f"_{names.VERSION}")]
  new_name = _variant_name(name, "files")
  source = sources.FileSource(dataset, spec.schema, splits=splits, data_dir=data_dir,
                              train_filter=getattr(spec.source, "train_filter", None))
  _register_variant(new_name, spec, source, taskless)
  return new_name


def register_hf_variant(
    name: str, path: Optional[str] = None, hf_name: Optional[str] = None,
    split_map: Optional[Mapping[str, str]] = None,
    row_fn: Optional[Callable[[Mapping[str, Any]], Mapping[str, Any]]] = None) -> str:
  """Registers task `name` reading a Hugging Face `datasets` dataset; returns the new name.

  Args:
    name: a registered spot task.
    path, hf_name: `datasets.load_dataset(path, hf_name)`; default the task's known location.
    split_map: canonical split -> Hugging Face split.
    row_fn: maps a Hugging Face row to the task's schema columns.

  Returns:
    `<name without version>_hf_v200`.
  """
  spec = _spec(name)
  default = spec.hf or (None, None, {"train": "train", "validation": "validation"}, None)
  path = path or default[0]
  if path is None:
    raise ValueError(f"{name!r} has no known Hugging Face dataset; pass path= (and "
                     "hf_name=, row_fn=)")
  source = sources.HfSource(path, spec.schema, split_map or default[2], name=hf_name or default[1],
                            row_fn=row_fn or default[3],
                            train_filter=getattr(spec.source, "train_filter", None))
  new_name = _variant_name(name, "hf")
  _register_variant(new_name, spec, source, name.endswith(f"_taskless_{names.VERSION}"))
  return new_name


def _register_variant(new_name: str, spec: TaskSpec, source: seqio.DataSource,
                      taskless: bool) -> None:
  if new_name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(new_name)  # a variant may be re-pointed at another directory
    SPECS.pop(new_name, None)
  _add(new_name, spec, source, taskless)

