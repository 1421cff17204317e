"""SuperGLUE tasks in T5's text-to-text format, on TFDS super_glue 1.0.2.

BoolQ, CB, COPA, RTE, WiC use T5's `glue` format; MultiRC keeps one example per
answer option with its question ids for F1a and per-question exact match;
ReCoRD has one example per gold answer and is scored by max-over-answers EM/F1
on one copy per query; WSC is T5's "simple" WSC (predict the referent of the
marked pronoun): trained on correct referents only, evaluated on every example
with T5's referent-matching postprocessor. The diagnostics (AX-b, AX-g) have no
training or validation data and are not registered.

Attributes:
  TFDS_VERSION: the pinned TFDS version of super_glue.
  CLASSIFICATION: config -> (feature names in T5's order, label names, metric fns).
"""
from __future__ import annotations

import functools

from tasks import metrics, names, postprocessors, registry, sources
from tasks import preprocessors as pp

TFDS_VERSION = "1.0.2"
_SPLITS = {"train": "train", "validation": "validation", "test": "test"}

CLASSIFICATION = {
    "boolq": (("passage", "question"), ("False", "True"), (metrics.accuracy,)),
    "cb": (("hypothesis", "premise"), ("entailment", "contradiction", "neutral"),
           (metrics.mean_multiclass_f1(3), metrics.accuracy)),
    "copa": (("choice1", "choice2", "premise", "question"), ("choice1", "choice2"),
             (metrics.accuracy,)),
    "rte": (("hypothesis", "premise"), ("entailment", "not_entailment"), (metrics.accuracy,)),
    "wic": (("sentence1", "sentence2", "word"), ("False", "True"), (metrics.accuracy,)),
}


def _source(config: str) -> sources.TfdsSource:
  return sources.TfdsSource(f"super_glue/{config}:{TFDS_VERSION}", _SPLITS)


def register_all() -> None:
  for config, (feature_names, label_names, metric_fns) in CLASSIFICATION.items():
    registry.register(registry.TaskSpec(
        name=names.SUPER_GLUE[f"super_glue_{config}"],
        source=_source(config),
        text_preprocessors=[functools.partial(pp.glue, benchmark=config, label_names=label_names,
                                              feature_names=feature_names)],
        schema={**{f: "str" for f in feature_names}, "label": "int", "idx": "int"},
        postprocess_fn=functools.partial(postprocessors.string_label_to_class_id,
                                         label_classes=label_names),
        metric_fns=metric_fns,
        hf=("super_glue", config, dict(_SPLITS), None),
        formats=f"{config} " + " ".join(f"{f}: <{f}>" for f in feature_names) + " -> "
        + " | ".join(label_names)))

  registry.register(registry.TaskSpec(
      name=names.SUPER_GLUE["super_glue_multirc"],
      source=_source("multirc"),
      text_preprocessors=[functools.partial(pp.glue, benchmark="multirc",
                                            label_names=("False", "True"),
                                            feature_names=("question", "answer", "paragraph"))],
      schema={"paragraph": "str", "question": "str", "answer": "str", "label": "int",
              "idx/paragraph": "int", "idx/question": "int", "idx/answer": "int"},
      postprocess_fn=postprocessors.multirc,
      metric_fns=(metrics.multirc_f1_over_all_answers, metrics.multirc_exact_match),
      hf=("super_glue", "multirc", dict(_SPLITS), None),
      formats="multirc question: <question> answer: <answer> paragraph: <paragraph, HTML removed> "
              "-> False | True"))

  registry.register(registry.TaskSpec(
      name=names.SUPER_GLUE["super_glue_record"],
      source=_source("record"),
      text_preprocessors=[pp.record],
      schema={"passage": "str", "query": "str", "entities": "str_list", "answers": "str_list",
              "idx/passage": "int", "idx/query": "int"},
      postprocess_fn=postprocessors.record,
      metric_fns=(metrics.record_metric,),
      hf=("super_glue", "record", dict(_SPLITS), None),
      formats="record query: <query> entities: <e1, e2, ...> passage: <passage> -> one example "
              "per answer"))

  registry.register(registry.TaskSpec(
      name=names.SUPER_GLUE["super_glue_wsc"],
      source=sources.TfdsSource(f"super_glue/wsc.fixed:{TFDS_VERSION}", _SPLITS,
                                train_filter=pp.wsc_correct_referent),
      text_preprocessors=[pp.wsc_simple],
      schema={"text": "str", "span1_index": "int", "span2_index": "int", "span1_text": "str",
              "span2_text": "str", "label": "int", "idx": "int"},
      postprocess_fn=postprocessors.wsc_simple,
      metric_fns=(metrics.accuracy,),
      hf=("super_glue", "wsc.fixed", dict(_SPLITS), None),
      formats="wsc: <text with the pronoun as *pronoun*> -> <candidate referent> (train: correct "
              "ones only)"))
