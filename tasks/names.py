"""Every registered task and mixture name, and the SPoT study's task lists.

Names are `spot_<dataset>_v200`; the "taskless" variant of a task (its inputs
without the leading task name, as Prompt Tuning trains) is
`spot_<dataset>_taskless_v200`. The version suffix is the version of these
formats: it changes whenever a format, split or metric changes.

Attributes:
  VERSION: suffix of every name.
  GLUE, SUPER_GLUE, OTHER, EXTRA: short dataset key -> registered task name.
  MIXTURES: short mixture key -> registered mixture name.
  SOURCE_TASKS: the 16 SPoT source tasks, short name -> task or mixture name.
  TARGET_TASKS: the 10 SPoT target tasks, short name -> task or mixture name.
"""
from __future__ import annotations

from typing import Dict

VERSION = "v200"


def task_name(dataset: str, taskless: bool = False) -> str:
  """`spot_<dataset>[_taskless]_v200`."""
  return f"spot_{dataset}{'_taskless' if taskless else ''}_{VERSION}"


def taskless_name(name: str) -> str:
  """The taskless variant's name of a registered task name."""
  suffix = f"_{VERSION}"
  if not name.endswith(suffix) or name.endswith(f"_taskless{suffix}"):
    raise ValueError(f"{name!r} is not a spot task name ending in {suffix!r} (and not "
                     "already taskless)")
  return name[: -len(suffix)] + f"_taskless{suffix}"


def _names(datasets) -> Dict[str, str]:
  return {d: task_name(d) for d in datasets}


GLUE = _names(["glue_cola", "glue_sst2", "glue_mrpc", "glue_qqp", "glue_stsb", "glue_mnli",
               "glue_mnli_matched", "glue_mnli_mismatched", "glue_qnli", "glue_rte"])
SUPER_GLUE = _names(["super_glue_boolq", "super_glue_cb", "super_glue_copa", "super_glue_multirc",
                     "super_glue_record", "super_glue_rte", "super_glue_wic", "super_glue_wsc"])
OTHER = _names(["c4_prefix_lm", "doc_nli", "yelp_polarity", "cxc", "squad", "drop", "winogrande",
                "hellaswag", "cosmos_qa", "race_high", "race_middle", "cr"])
# Extra tasks that complete the SPoT paper's NLI, sentiment, MRQA and RAINBOW mixtures.
EXTRA = _names(["anli_r1", "anli_r2", "anli_r3", "snli", "imdb", "piqa", "mrqa_squad",
                "mrqa_news_qa", "mrqa_trivia_qa", "mrqa_search_qa", "mrqa_hotpot_qa",
                "mrqa_natural_questions"])
MIXTURES = _names(["glue_mnli_and_dev", "race", "glue", "super_glue", "nli", "paraphrase",
                   "sentiment", "mrqa", "rainbow", "sources"])

SOURCE_TASKS = {
    "c4": OTHER["c4_prefix_lm"],
    "doc_nli": OTHER["doc_nli"],
    "yelp_polarity": OTHER["yelp_polarity"],
    "mnli": MIXTURES["glue_mnli_and_dev"],
    "qqp": GLUE["glue_qqp"],
    "qnli": GLUE["glue_qnli"],
    "record": SUPER_GLUE["super_glue_record"],
    "cxc": OTHER["cxc"],
    "squad": OTHER["squad"],
    "drop": OTHER["drop"],
    "sst2": GLUE["glue_sst2"],
    "winogrande": OTHER["winogrande"],
    "hellaswag": OTHER["hellaswag"],
    "multirc": SUPER_GLUE["super_glue_multirc"],
    "cosmos_qa": OTHER["cosmos_qa"],
    "race": MIXTURES["race"],
}

TARGET_TASKS = {
    "boolq": SUPER_GLUE["super_glue_boolq"],
    "cola": GLUE["glue_cola"],
    "stsb": GLUE["glue_stsb"],
    "wic": SUPER_GLUE["super_glue_wic"],
    "cr": OTHER["cr"],
    "mrpc": GLUE["glue_mrpc"],
    "rte": SUPER_GLUE["super_glue_rte"],
    "wsc": SUPER_GLUE["super_glue_wsc"],
    "cb": SUPER_GLUE["super_glue_cb"],
    "copa": SUPER_GLUE["super_glue_copa"],
}

# Tasks whose inputs do not start with a task name, so they have no taskless variant.
NO_TASKLESS = frozenset({OTHER["c4_prefix_lm"], OTHER["squad"]})
