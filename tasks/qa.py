"""Extractive / abstractive QA: SQuAD (T5's format), DROP, MRQA, RACE.

SQuAD is T5's `squad_v010_allanswers`: "question: <q> context: <c>" with
punctuation padded, the first answer as target, scored by max-over-answers
SQuAD EM/F1. DROP and the six MRQA in-domain sets use the same format with a
leading task name (SPoT's MRQA format). RACE is multiple choice, one example per
question, answered by its letter.

Attributes:
  MRQA_CONFIGS: the MRQA in-domain TFDS configs (their SPoT task names).
"""
from __future__ import annotations

import functools

from tasks import metrics, names, postprocessors, registry, sources
from tasks import preprocessors as pp

MRQA_CONFIGS = ("squad", "news_qa", "trivia_qa", "search_qa", "hotpot_qa", "natural_questions")
_QA_METRICS = (metrics.squad,)


def register_all() -> None:
  registry.register(registry.TaskSpec(
      name=names.OTHER["squad"],
      source=sources.TfdsSource("squad/v1.1:3.0.0", {"train": "train", "validation": "validation"}),
      text_preprocessors=[pp.squad],
      schema={"id": "str", "title": "str", "context": "str", "question": "str",
              "answers/text": "str_list"},
      postprocess_fn=postprocessors.qa,
      metric_fns=_QA_METRICS,
      hf=("squad", None, {"train": "train", "validation": "validation"}, None),
      formats="question: <question> context: <context> (punctuation padded) -> first answer"))

  registry.register(registry.TaskSpec(
      name=names.OTHER["drop"],
      source=sources.TfdsSource("drop:2.0.0", {"train": "train", "validation": "dev"}),
      text_preprocessors=[pp.drop_qa],
      schema={"passage": "str", "question": "str", "answer": "str", "validated_answers": "str_list",
              "query_id": "str"},
      postprocess_fn=postprocessors.qa,
      metric_fns=_QA_METRICS,
      formats="drop question: <question> context: <passage> (punctuation padded) -> answer"))

  for config in MRQA_CONFIGS:
    registry.register(registry.TaskSpec(
        name=names.EXTRA[f"mrqa_{config}"],
        source=sources.TfdsSource(f"mrqa/{config}:1.0.0",
                                  {"train": "train", "validation": "validation"}),
        text_preprocessors=[functools.partial(pp.squad, task=config, answers_key="answers")],
        schema={"qid": "str", "context": "str", "question": "str", "answers": "str_list"},
        postprocess_fn=postprocessors.qa,
        metric_fns=_QA_METRICS,
        formats=f"{config} question: <question> context: <context> (punctuation padded) -> "
                "first answer"))

  for level in ("high", "middle"):
    registry.register(registry.TaskSpec(
        name=names.OTHER[f"race_{level}"],
        source=sources.TfdsSource(f"race/{level}:2.0.0",
                                  {"train": "train", "validation": "dev", "test": "test"}),
        text_preprocessors=[pp.race],
        schema={"article": "str", "questions": "str_list", "answers": "str_list",
                "options": "str_list_list", "example_id": "str"},
        postprocess_fn=functools.partial(postprocessors.string_label_to_class_id,
                                         label_classes=pp.RACE_LETTERS),
        metric_fns=(metrics.accuracy,),
        formats="race question: <question> A: <o1> B: <o2> C: <o3> D: <o4> article: <article> -> A "
                "| B | C | D"))

