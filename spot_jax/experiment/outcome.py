"""What a finished prompt run left behind, read from its run directory (run.json and prompts/).

Every run the trainer makes records (`spot_jax.run_dir.RunRecord`) its task, seed, the frozen
model's fingerprint, the best validation score and the task-embedding step, and holds its best
prompt and the prompt at that step. `read_outcome` turns a finished one into a `RunOutcome`.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional

import numpy as np

from spot_jax.run_dir import RunDir


@dataclasses.dataclass(frozen=True)
class RunOutcome:
  """A finished run, as its directory records it.

  Attributes:
    run_dir: its directory.
    task: the task (or mixture) it trained on.
    seed: its seed.
    score: best validation value of its metric (None when it was not evaluated).
    metric: the metric's name (None when it was not evaluated).
    fingerprint: the frozen model's fingerprint.
    init: how the prompt was initialised (free text for reports).
    train_steps: the run's final step.
    label: the experiment's name for its task (`RunRequest.label`; read alone: the task).
    method: the name of the recipe that trained it ("" when read alone).
    rank_accuracy: its prompt's rank-classification accuracy (%) on the recipe's validation
      examples (`spot_jax.experiment.rank`; None: not scored so).
  """
  run_dir: str
  task: str
  seed: int
  score: Optional[float]
  metric: Optional[str]
  fingerprint: dict
  init: str
  train_steps: int
  label: str = ""
  method: str = ""
  rank_accuracy: Optional[float] = None

  @property
  def prompt_path(self) -> pathlib.Path:
    """The prompt it serves: prompts/prompt_best.npy, else its last export (ConfigError: none)."""
    return RunDir(self.run_dir).exported_prompt()[0]

  @property
  def embedding_path(self) -> pathlib.Path:
    """The prompt at its embedding step, the task embedding (ConfigError: not exported)."""
    return RunDir(self.run_dir).embedding_prompt()[0]

  @property
  def embedding_step(self) -> int:
    return RunDir(self.run_dir).embedding_prompt()[1]

  def prompt(self) -> np.ndarray:
    return np.load(self.prompt_path, allow_pickle=False)

  def embedding(self) -> np.ndarray:
    return np.load(self.embedding_path, allow_pickle=False)


def read_outcome(run_dir: str | pathlib.Path, label: str = "",
                 method: str = "") -> Optional[RunOutcome]:
  """The finished run's outcome, or None when `run_dir` holds no finished run."""
  rd = RunDir(run_dir)
  record = rd.read_record()
  if record is None or not record.finished:
    return None
  return RunOutcome(run_dir=str(rd.path), task=record.task, seed=record.seed, score=record.score,
                    metric=record.metric, fingerprint=record.fingerprint, init=record.init,
                    train_steps=record.train_steps, label=label or record.task, method=method)
