"""GLUE tasks in T5's text-to-text format (t5.data.glue_utils), on TFDS glue 2.0.0.

Inputs are "<task> <feature>: <text> ..." with T5's feature order (sorted
feature names), targets the label name; STS-B targets are the score rounded to
0.2. MNLI trains on `spot_glue_mnli_v200` and evaluates on the matched and
mismatched validation sets through `spot_glue_mnli_matched_v200` /
`spot_glue_mnli_mismatched_v200`. WNLI is left out, as T5 does for GLUE training.

Attributes:
  TFDS_VERSION: the pinned TFDS version of glue.
  GLUE_TASKS: dataset key -> (config, feature names, label names, metric fns).
"""
from __future__ import annotations

import functools

from tasks import metrics, names, postprocessors, registry, sources
from tasks import preprocessors as pp

TFDS_VERSION = "2.0.0"
_STANDARD_SPLITS = {"train": "train", "validation": "validation", "test": "test"}

GLUE_TASKS = {
    "cola": (("sentence",), ("unacceptable", "acceptable"), (metrics.matthews_corrcoef,)),
    "sst2": (("sentence",), ("negative", "positive"), (metrics.accuracy,)),
    "mrpc": (("sentence1", "sentence2"), ("not_equivalent", "equivalent"),
             (metrics.f1_score_with_invalid, metrics.accuracy)),
    "qqp": (("question1", "question2"), ("not_duplicate", "duplicate"),
            (metrics.f1_score_with_invalid, metrics.accuracy)),
    "mnli": (("hypothesis", "premise"), ("entailment", "neutral", "contradiction"),
             (metrics.accuracy,)),
    "qnli": (("question", "sentence"), ("entailment", "not_entailment"), (metrics.accuracy,)),
    "rte": (("sentence1", "sentence2"), ("entailment", "not_entailment"), (metrics.accuracy,)),
}
_MNLI_SPLITS = {
    "glue_mnli": {"train": "train", "validation_matched": "validation_matched",
                  "validation_mismatched": "validation_mismatched", "test_matched": "test_matched",
                  "test_mismatched": "test_mismatched"},
    "glue_mnli_matched": {"validation": "validation_matched", "test": "test_matched"},
    "glue_mnli_mismatched": {"validation": "validation_mismatched", "test": "test_mismatched"},
}


def _register_classification(config: str, key: str, splits) -> None:
  feature_names, label_names, metric_fns = GLUE_TASKS[config]
  schema = {**{f: "str" for f in feature_names}, "label": "int", "idx": "int"}
  registry.register(registry.TaskSpec(
      name=names.GLUE[key],
      source=sources.TfdsSource(f"glue/{config}:{TFDS_VERSION}", splits),
      text_preprocessors=[functools.partial(pp.glue, benchmark=config, label_names=label_names,
                                            feature_names=feature_names)],
      schema=schema,
      postprocess_fn=functools.partial(postprocessors.string_label_to_class_id,
                                       label_classes=label_names),
      metric_fns=metric_fns,
      hf=("glue", config, dict(splits), None),
      formats=f"{config} " + " ".join(f"{f}: <{f}>" for f in feature_names) + " -> "
      + " | ".join(label_names)))


def register_all() -> None:
  for config in GLUE_TASKS:
    if config != "mnli":
      _register_classification(config, f"glue_{config}", _STANDARD_SPLITS)
  for key, splits in _MNLI_SPLITS.items():
    _register_classification("mnli", key, splits)
  registry.register(registry.TaskSpec(
      name=names.GLUE["glue_stsb"],
      source=sources.TfdsSource(f"glue/stsb:{TFDS_VERSION}", _STANDARD_SPLITS),
      text_preprocessors=[pp.similarity],
      schema={"sentence1": "str", "sentence2": "str", "label": "float", "idx": "int"},
      postprocess_fn=postprocessors.string_to_float,
      metric_fns=(metrics.pearson_corrcoef, metrics.spearman_corrcoef),
      hf=("glue", "stsb", dict(_STANDARD_SPLITS), None),
      formats="stsb sentence1: <sentence1> sentence2: <sentence2> -> score rounded to "
              "0.2 (\"3.8\")"))
