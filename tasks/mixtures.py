"""Examples-proportional mixtures (T5's, capped at K = 2**19 examples per task).

A task's rate is `min(#train examples, K)` (`seqio.mixing_rate_num_examples`);
tasks with no train split (MNLI matched/mismatched dev sets) get rate 0, so they
are only there to be evaluated. Mixture members that are mixtures are replaced
by their tasks, so every task is weighted by its own size.

Attributes:
  K: the default cap, 2**19.
  MIXTURE_TASKS: mixture name -> its member task/mixture names.
"""
from __future__ import annotations

from typing import List, Sequence

import seqio

from tasks import names

K = 2 ** 19


class ExamplesProportional:
  """Mixing rate `min(num_train_examples, maximum)`; 0 for tasks without a train split.

  Attributes:
    maximum: the cap K.
  """

  def __init__(self, maximum: int = K):
    self.maximum = maximum

  def __call__(self, task: seqio.Task) -> float:
    if "train" not in task.splits:
      return 0.0
    return seqio.mixing_rate_num_examples(task, maximum=self.maximum)

  def __eq__(self, other):
    # By name, not isinstance: a reloaded module defines a new class object.
    return (type(other).__name__ == "ExamplesProportional"
            and getattr(other, "maximum", None) == self.maximum)

  def __hash__(self):
    return hash(self.maximum)

  def __repr__(self):
    return f"ExamplesProportional(maximum={self.maximum})"


def leaf_tasks(task_names: Sequence[str]) -> List[str]:
  """Replaces mixture names by their tasks (recursively), keeping order, without repeats."""
  out: List[str] = []
  for name in task_names:
    if name in seqio.MixtureRegistry.names():
      members = [t.name for t in seqio.get_mixture_or_task(name).tasks]
    elif name in seqio.TaskRegistry.names():
      members = [name]
    else:
      raise ValueError(f"{name!r} is neither a registered task nor a mixture (did you "
                       "`import tasks`?)")
    out += [m for m in members if m not in out]
  return out


def register_mixture(name: str, task_names: Sequence[str], *, maximum: int = K) -> str:
  """Registers an examples-proportional mixture of tasks (or mixtures); returns its name.

  Registering the same definition again is a no-op; a different definition under
  an existing name is an error.

  Args:
    name: the mixture's name.
    task_names: registered task or mixture names (mixtures are flattened to tasks).
    maximum: the per-task cap K on the number of examples.
  """
  if not task_names:
    raise ValueError(f"mixture {name!r} needs at least one task name")
  leaves = tuple(leaf_tasks(task_names))
  rate = ExamplesProportional(maximum)
  if name in seqio.TaskRegistry.names():
    raise ValueError(f"{name!r} is already a task name; choose another mixture name")
  if name in seqio.MixtureRegistry.names():
    mixture = seqio.get_mixture_or_task(name)
    existing = sorted(t.name for t in mixture.tasks)
    existing_rates = set(getattr(mixture, "_task_to_rate", {}).values())
    if existing != sorted(leaves) or existing_rates != {rate}:
      raise ValueError(f"mixture {name!r} is already registered with tasks {existing} and rates "
                       f"{sorted(map(repr, existing_rates))}; cannot redefine it as {list(leaves)} "
                       f"with {rate!r}")
    return name
  seqio.MixtureRegistry.add(name, [(t, rate) for t in leaves])
  return name


_G, _S, _O, _E, _M = names.GLUE, names.SUPER_GLUE, names.OTHER, names.EXTRA, names.MIXTURES

MIXTURE_TASKS = {
    _M["glue_mnli_and_dev"]: [_G["glue_mnli"], _G["glue_mnli_matched"], _G["glue_mnli_mismatched"]],
    _M["race"]: [_O["race_high"], _O["race_middle"]],
    _M["glue"]: [_G[k] for k in ("glue_cola", "glue_sst2", "glue_mrpc", "glue_qqp", "glue_stsb",
                                 "glue_qnli", "glue_rte")] + [_M["glue_mnli_and_dev"]],
    _M["super_glue"]: list(_S.values()),
    _M["nli"]: [_E["anli_r1"], _E["anli_r2"], _E["anli_r3"], _S["super_glue_cb"], _O["doc_nli"],
                _M["glue_mnli_and_dev"], _G["glue_qnli"], _S["super_glue_rte"], _E["snli"]],
    _M["paraphrase"]: [_O["cxc"], _G["glue_mrpc"], _G["glue_qqp"], _G["glue_stsb"]],
    _M["sentiment"]: [_O["cr"], _E["imdb"], _G["glue_sst2"], _O["yelp_polarity"]],
    _M["mrqa"]: [_E[f"mrqa_{c}"] for c in ("squad", "news_qa", "trivia_qa", "search_qa",
                                           "hotpot_qa", "natural_questions")],
    _M["rainbow"]: [_O["cosmos_qa"], _O["hellaswag"], _E["piqa"], _O["winogrande"]],
    _M["sources"]: list(names.SOURCE_TASKS.values()),
}


def register_all() -> None:
  for name, members in MIXTURE_TASKS.items():
    register_mixture(name, members)
