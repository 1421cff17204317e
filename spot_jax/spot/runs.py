"""One prompt-tuning run of the SPoT layer: an ordinary `trainer.train(...)` call plus a record.

A run directory holds what the trainer writes (checkpoints/, best/, prompts/, eval/) and, once
the run has finished, `spot_run.json`: task, seed, the frozen model's fingerprint, the best
validation score and the paths of the best prompt and of the task embedding (the prompt at
`embedding_step`). A directory with that record is finished and is never trained again; one
without it is (re)started with the same call, and the trainer resumes from its own checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Optional

import numpy as np

from spot_jax import data as data_lib
from spot_jax.train import evaluator as evaluator_lib
from spot_jax import fileio
from spot_jax.train import optimizers
from spot_jax import prompts
from spot_jax import train as train_lib
from spot_jax.spot.settings import RunSettings

RECORD = "spot_run.json"


@dataclasses.dataclass(frozen=True)
class RunOutcome:
  """A finished run.

  Attributes:
    run_dir: its directory.
    task: the task (or mixture) it trained on.
    seed: its seed.
    score: best validation value of its metric (None when it was not evaluated).
    metric: the metric's name.
    prompt_file: the best prompt, relative to run_dir (prompts/prompt_best.npy; the last
      step's export when not evaluated).
    embedding_file: the prompt at the embedding step (the task embedding), relative to run_dir.
    fingerprint: the frozen model's fingerprint.
    init: how the prompt was initialised (free text for reports).
  """
  run_dir: str
  task: str
  seed: int
  score: Optional[float]
  metric: str
  prompt_file: str
  embedding_file: str
  fingerprint: dict
  init: str

  @property
  def prompt_path(self) -> pathlib.Path:
    return pathlib.Path(self.run_dir) / self.prompt_file

  @property
  def embedding_path(self) -> pathlib.Path:
    return pathlib.Path(self.run_dir) / self.embedding_file

  def prompt(self) -> np.ndarray:
    return np.load(self.prompt_path, allow_pickle=False)

  def embedding(self) -> np.ndarray:
    return np.load(self.embedding_path, allow_pickle=False)


def read_record(run_dir: str | pathlib.Path) -> Optional[RunOutcome]:
  """The finished run's outcome, or None when `run_dir` has no (valid) record."""
  path = pathlib.Path(run_dir) / RECORD
  if not path.is_file():
    return None
  try:
    record = json.loads(path.read_text())
    record["run_dir"] = str(pathlib.Path(run_dir))  # the directory may have moved
    return RunOutcome(**record)
  except (ValueError, TypeError):
    return None


def prompt_module(settings: RunSettings, init: Optional[np.ndarray] = None,
                  smop: Optional[dict] = None) -> Any:
  """Prompt Tuning of `settings.prompt_length` (from `init`, else sampled vocabulary), or SMoP.

  Args:
    init: an initial prompt [L, E] (or [k, l, E] with `smop`).
    smop: {"num_prompts": k, "length": l} to train SMoP instead.
  """
  start = (prompts.from_array(init, source="retrieved prompt") if init is not None
           else prompts.sampled_vocab(num_most_frequent=min(5000, settings.model.config.vocab_size)))
  if smop is not None:
    return prompts.SMoP(num_prompts=int(smop["num_prompts"]), length=int(smop["length"]),
                        prompt_init=start)
  return prompts.PromptTuning(length=settings.prompt_length, prompt_init=start)


def train_prompt(settings: RunSettings, task: str, run_dir: str | pathlib.Path, seed: int, *,
                 init: Optional[np.ndarray] = None, init_note: str = "sampled vocabulary",
                 smop: Optional[dict] = None, evaluate: bool = True,
                 verbose: bool = False) -> RunOutcome:
  """Trains (or resumes, or reuses) one prompt on `task` with the normal trainer.

  Args:
    settings: the shared settings.
    task: a registered task or mixture.
    run_dir: the run directory (MODEL_DIR).
    seed: the run's seed.
    init: the initial prompt (None: sampled vocabulary).
    init_note: how `init` was made, kept in the record.
    smop: train SMoP with these settings instead of Prompt Tuning.
    evaluate: evaluate on the validation split and keep the best prompt (mixtures: False).
    verbose: the trainer's progress lines.
  """
  run_dir = pathlib.Path(run_dir)
  done = read_record(run_dir)
  if done is not None:
    return done
  prompt = prompt_module(settings, init, smop)
  model = dataclasses.replace(settings.model, module=settings.model.module.clone(prompt=prompt))
  metric = settings.metric_for(task)
  train_cfg = data_lib.DatasetConfig(task, dict(settings.lengths), batch_size=settings.batch_size,
                                     seed=seed, module=settings.task_module)
  eval_cfg = (evaluator_lib.EvalConfig(task, dict(settings.lengths), batch_size=settings.eval_batch_size,
                                    num_examples=settings.eval_num_examples,
                                    module=settings.task_module) if evaluate else None)
  checkpoint_cfg = train_lib.CheckpointConfig(period=settings.checkpoint_period,
                                            save_prompt_steps=(settings.embedding_step,),
                                            best_metric=metric if evaluate else None)
  train_lib.train(model=model, train_dataset_cfg=train_cfg, total_steps=settings.train_steps,
                model_dir=str(run_dir), optimizer=optimizers.adafactor(learning_rate=settings.learning_rate),
                eval_cfg=eval_cfg, eval_period=settings.eval_period, checkpoint_cfg=checkpoint_cfg,
                initial_checkpoint_path=settings.initial_checkpoint_path, seed=seed,
                verbose=verbose)
  if evaluate:
    best = json.loads((run_dir / "best" / "metric.json").read_text())
    score, prompt_file = float(best["value"]), "prompts/prompt_best.npy"
  else:
    score, prompt_file = None, f"prompts/prompt_step_{settings.train_steps}.npy"
  outcome = RunOutcome(run_dir=str(run_dir), task=task, seed=int(seed), score=score, metric=metric,
                       prompt_file=prompt_file,
                       embedding_file=f"prompts/prompt_step_{settings.embedding_step}.npy",
                       fingerprint=settings.fingerprint_for(seed), init=init_note)
  fileio.atomic_write_bytes(run_dir / RECORD, json.dumps(dataclasses.asdict(outcome), indent=1).encode())
  return outcome
