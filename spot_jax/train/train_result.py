"""What the trainer returns: a job's `TrainResult` and each run's `RunResult`."""
from __future__ import annotations

import dataclasses
from typing import Any

from spot_jax.train import run_spec as runs_lib
from spot_jax.train.state import TrainState


@dataclasses.dataclass
class RunResult:
  """One run of a job.

  Attributes:
    run: the resolved run (seed, task, directory).
    state: its final `TrainState` (unstacked).
    history: one dict of host metrics per step run in this process (loss, ...).
    eval_history: (step, metrics) for each evaluation.
  """
  run: runs_lib.Run
  state: TrainState
  history: list[dict[str, Any]]
  eval_history: list[tuple[int, dict]]


@dataclasses.dataclass
class TrainResult:
  """What a finished job returns (for scripts and tests).

  Attributes:
    state: the final `TrainState` (K runs: stacked along a leading runs axis).
    frozen_params: the frozen parameter tree (empty for model tuning).
    history: run 0's step metrics (one run: the run's).
    eval_history: run 0's evaluations.
    compilations: how many times the train step was compiled.
    mesh: the device mesh used.
    runs: every run's own result, in job order.
  """
  state: TrainState
  frozen_params: Any
  history: list[dict[str, Any]]
  eval_history: list[tuple[int, dict]]
  compilations: int
  mesh: Any
  runs: list[RunResult] = dataclasses.field(default_factory=list)
