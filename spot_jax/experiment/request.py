"""What an experiment asks the trainer for: a `Recipe` that K runs share, a `RunRequest` per run.

A recipe is everything the runs of one job have in common, hence everything one jitted step
needs: the model with its prompt module, the optimizer, the budget, the data lengths, the
evaluation and the frozen backbone. A request is what one run adds: its task, its seed, its
directory's name and, optionally, the prompt it starts from (a SPoT transfer).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from spot_jax import models


@dataclasses.dataclass(frozen=True)
class Recipe:
  """How every run of one job trains (`spot_jax.experiment.runner.run`).

  Attributes:
    name: what the experiment calls the recipe (the demo: its method key); every outcome
      carries it.
    model: the frozen backbone's model with the prompt module the runs train.
    optimizer: the optax transformation, its learning-rate schedule included.
    steps: training steps of every run.
    lengths: {"inputs": T, "targets": S} in tokens (prompt excluded).
    batch_size: training batch size of each run.
    task_module: module(s) registering the tasks (MIXTURE_OR_TASK_MODULE).
    initial_checkpoint_path: the frozen backbone (None: random; tests and smoke runs only).
    backbone_seed: the random backbone's seed of a K-run job (a run alone: its own seed).
    metric: the validation metric selecting each run's best prompt (None: no evaluation, the
      last state is kept, e.g. a mixture's source prompt).
    eval_period: steps between evaluations (None: at the last step only).
    eval_batch_size: evaluation batch size.
    eval_num_examples: validation examples per evaluation (None: all).
    checkpoint_period: steps between training-state checkpoints (None: `eval_period`).
    embedding_step: the step whose prompt is a run's task embedding (None: a third of `steps`).
    task_names: a mixture's tasks, for the `task_index` feature (None: no such feature).
    key: more content that names this recipe's jobs, for callers that key job directories by
      content (the demo's successors' own settings); the runner does not read it.
    class_labels: run label (`RunRequest.label`) -> its task's class labels; each such run is
      scored by rank classification after the job trains (`spot_jax.experiment.rank`; None:
      none is).
    rank_examples: validation examples each rank classification scores (the first ones).
    rank_batch_size: examples per rank-classification batch.
  """
  name: str
  model: models.Model
  optimizer: Any
  steps: int
  lengths: Mapping[str, int]
  batch_size: int
  task_module: str
  initial_checkpoint_path: Optional[str]
  backbone_seed: int = 0
  metric: Optional[str] = "accuracy"
  eval_period: Optional[int] = None
  eval_batch_size: int = 32
  eval_num_examples: Optional[int] = None
  checkpoint_period: Optional[int] = None
  embedding_step: Optional[int] = None
  task_names: Optional[Sequence[str]] = None
  key: Optional[Mapping[str, Any]] = None
  class_labels: Optional[Mapping[str, Sequence[str]]] = None
  rank_examples: int = 1000
  rank_batch_size: int = 250

  @property
  def evaluate(self) -> bool:
    return self.metric is not None


@dataclasses.dataclass(frozen=True)
class RunRequest:
  """One prompt run an experiment wants.

  Attributes:
    task: the registered task or mixture it trains on.
    seed: its seed (prompt initialisation, data order, dropout keys).
    label: the experiment's own name for the run's task, e.g. the demo's target key "sum"
      (default: `task`); it names the run directory and comes back in the outcome.
    name: its run directory's name in the job (default `<label>.seed_<seed>`).
    init: the prompt it starts from, [L, E] (SMoP: [k, l, E]); None: the recipe's initialiser,
      drawn with `seed`.
    init_note: how `init` was made, kept in run.json's `init` (default "sampled vocabulary").
  """
  task: str
  seed: int
  label: str = ""
  name: Optional[str] = None
  init: Optional[np.ndarray] = dataclasses.field(default=None, compare=False)
  init_note: str = ""

  @property
  def run_name(self) -> str:
    return self.name or f"{self.label or self.task}.seed_{self.seed}"
