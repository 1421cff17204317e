"""Classification and similarity tasks T5 never defined, in T5's "<task> key: value" style.

NLI (DocNLI, ANLI, SNLI), sentiment (Yelp-2, IMDB, CR), similarity (CxC) and
multiple choice (WinoGrande, PIQA, CosmosQA). The NLI formats are SPoT's own
(prompt_tuning/spot/data/nli.py). CR and CxC are not in TFDS and read local
files (`$SPOT_JAX_DATA_DIR/cr/<split>.jsonl`, `.../cxc/<split>.jsonl`).

Attributes:
  CLASSIFIERS: dataset key -> (tfds name or None for local files, split map,
    shown keys, label names, Hugging Face (path, name, split map or None, row_fn) or None).
"""
from __future__ import annotations

import functools

from tasks import metrics, names, postprocessors, registry, sources
from tasks import preprocessors as pp

_STD = {"train": "train", "validation": "validation", "test": "test"}
_NO_DEV = {"train": "train", "validation": "test", "test": "test"}  # datasets without a dev set
_NLI3 = ("entailment", "neutral", "contradiction")
_SENTIMENT = ("negative", "positive")


def _anli_splits(round_: int):
  return {"train": f"train_r{round_}", "validation": f"dev_r{round_}", "test": f"test_r{round_}"}


def _hf_anli_row(row):
  return {**row, "context": row["premise"]}  # Hugging Face calls ANLI's context "premise"


def _text_schema(keys, label="int"):
  return {**{k: "str" for k in keys}, "label": label}


CLASSIFIERS = {
    "doc_nli": ("doc_nli:1.0.0", _STD, ("hypothesis", "premise"),
                ("not_entailment", "entailment"), None),
    "anli_r1": ("anli/r1:0.1.0", _STD, ("hypothesis", "context"), _NLI3,
                ("anli", None, _anli_splits(1), _hf_anli_row)),
    "anli_r2": ("anli/r2:0.1.0", _STD, ("hypothesis", "context"), _NLI3,
                ("anli", None, _anli_splits(2), _hf_anli_row)),
    "anli_r3": ("anli/r3:0.1.0", _STD, ("hypothesis", "context"), _NLI3,
                ("anli", None, _anli_splits(3), _hf_anli_row)),
    "snli": ("snli:1.1.0", _STD, ("hypothesis", "premise"), _NLI3, ("snli", None, None, None)),
    "yelp_polarity": ("yelp_polarity_reviews:0.2.0", _NO_DEV, ("text",), _SENTIMENT,
                      ("yelp_polarity", None, None, None)),
    "imdb": ("imdb_reviews/plain_text:1.0.0", _NO_DEV, ("text",), _SENTIMENT,
             ("imdb", None, None, None)),
    "cr": (None, {"train": "train", "validation": "validation", "test": "test"}, ("sentence",),
           _SENTIMENT, None),
    "winogrande": ("winogrande:1.2.0",
                   {"train": "train_xl", "validation": "validation", "test": "test"},
                   ("sentence", "option1", "option2"), ("option1", "option2"), None),
    "piqa": ("piqa:1.0.0", {"train": "train", "validation": "validation"}, ("goal", "sol1", "sol2"),
             ("sol1", "sol2"), None),
    "cosmos_qa": ("cosmos_qa:1.0.0", _STD,
                  ("question", "answer0", "answer1", "answer2", "answer3", "context"),
                  tuple(f"answer{i}" for i in range(4)), None),
}


def _name(key: str) -> str:
  return {**names.OTHER, **names.EXTRA}[key]


def _source(key: str, tfds_name, splits, schema, train_filter=None):
  if tfds_name is None:
    return sources.FileSource(key, schema, splits=tuple(splits))
  return sources.TfdsSource(tfds_name, splits, train_filter=train_filter)


def _has_label(x):
  return x["label"] >= 0


def register_all() -> None:
  for key, (tfds_name, splits, keys, labels, hf) in CLASSIFIERS.items():
    schema = _text_schema(keys)
    preprocess = functools.partial(pp.classify, task=key, keys=keys, label_names=labels)
    steps = [preprocess]
    if key == "snli":  # SNLI marks pairs without annotator agreement with label -1
      steps = [_filter_labelled, preprocess]
    registry.register(registry.TaskSpec(
        name=_name(key),
        source=_source(key, tfds_name, splits, schema),
        text_preprocessors=steps,
        schema=schema,
        postprocess_fn=functools.partial(postprocessors.string_label_to_class_id,
                                         label_classes=labels),
        metric_fns=(metrics.accuracy,),
        hf=(hf[0], hf[1], hf[2] or dict(splits), hf[3]) if hf else None,
        formats=f"{key} " + " ".join(f"{k}: <{k}>" for k in keys) + " -> " + " | ".join(labels)))

  cxc_schema = {"sentence1": "str", "sentence2": "str", "label": "float", "idx": "int"}
  registry.register(registry.TaskSpec(
      name=names.OTHER["cxc"],
      source=sources.FileSource("cxc", cxc_schema, splits=("train", "validation", "test")),
      text_preprocessors=[functools.partial(pp.similarity, benchmark="cxc")],
      schema=cxc_schema,
      postprocess_fn=postprocessors.string_to_float,
      metric_fns=(metrics.pearson_corrcoef, metrics.spearman_corrcoef),
      formats="cxc sentence1: <sentence1> sentence2: <sentence2> -> 0-5 score rounded to "
              "0.2 (\"3.8\")"))

  registry.register(registry.TaskSpec(
      name=names.OTHER["hellaswag"],
      source=sources.TfdsSource("hellaswag:1.1.0", _STD),
      text_preprocessors=[pp.hellaswag],
      schema={"context": "str", "endings": "str_list", "label": "int"},
      postprocess_fn=functools.partial(postprocessors.string_label_to_class_id,
                                       label_classes=tuple(f"ending{i}" for i in range(4))),
      metric_fns=(metrics.accuracy,),
      hf=("hellaswag", None, {"train": "train", "validation": "validation"}, _hf_hellaswag_row),
      formats="hellaswag context: <context> ending0: <e0> ending1: <e1> ending2: <e2> ending3: "
              "<e3> -> ending0..ending3"))


def _filter_labelled(dataset):
  return dataset.filter(_has_label)


def _hf_hellaswag_row(row):
  return {"context": row["ctx"], "endings": row["endings"],
          "label": int(row["label"]) if row["label"] != "" else -1}
