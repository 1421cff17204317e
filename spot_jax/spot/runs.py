"""Prompt-tuning runs of the SPoT layer: ordinary `train.train(...)` calls (one run, or K runs
in one jitted step), read back.

Every run the trainer makes is a SPoT run: its run directory records (`run.json`, see
`spot_jax.run_dir`) the task, the seed, the frozen model's fingerprint, the best validation
score and the task-embedding step, and holds the best prompt and the prompt at that step. A run
whose record says it finished is never trained again; any other is (re)started with the same
call, and the trainer resumes it from its own checkpoint.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Optional, Sequence

import numpy as np

from spot_jax import data as data_lib
from spot_jax import prompts
from spot_jax import train as train_lib
from spot_jax.run_dir import RunDir
from spot_jax.spot.settings import RunSettings
from spot_jax.train import evaluator as evaluator_lib
from spot_jax.train import optimizers


@dataclasses.dataclass(frozen=True)
class RunOutcome:
  """A finished run, as its directory records it.

  Attributes:
    run_dir: its directory.
    task: the task (or mixture) it trained on.
    seed: its seed.
    score: best validation value of its metric (None when it was not evaluated).
    metric: the metric's name (None when it was not evaluated).
    prompt_file: the prompt it serves (prompts/prompt_best.npy, else its last export).
    embedding_file: the prompt at its embedding step (the task embedding).
    fingerprint: the frozen model's fingerprint.
    init: how the prompt was initialised (free text for reports).
  """
  run_dir: str
  task: str
  seed: int
  score: Optional[float]
  metric: Optional[str]
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


def _configs(settings: RunSettings, task: str, seed: int, metric: str, evaluate: bool):
  """(training data, evaluation, checkpoints) of this layer's runs of `task` (K runs: the
  first run's; each run's own task and seed replace them)."""
  lengths = dict(settings.lengths)
  train_cfg = data_lib.DatasetConfig(task, lengths, batch_size=settings.batch_size, seed=seed,
                                     module=settings.task_module)
  eval_cfg = (evaluator_lib.EvalConfig(task, lengths, batch_size=settings.eval_batch_size,
                                       num_examples=settings.eval_num_examples,
                                       module=settings.task_module) if evaluate else None)
  checkpoint_cfg = train_lib.CheckpointConfig(period=settings.checkpoint_period,
                                              embedding_step=settings.embedding_step,
                                              best_metric=metric if evaluate else None)
  return train_cfg, eval_cfg, checkpoint_cfg

def read_record(run_dir: str | pathlib.Path) -> Optional[RunOutcome]:
  """The finished run's outcome, or None when `run_dir` holds no finished run."""
  rd = RunDir(run_dir)
  record = rd.read_record()
  if record is None or not record.finished:
    return None
  prompt_file, _ = rd.exported_prompt()
  embedding_file, _ = rd.embedding_prompt()
  return RunOutcome(run_dir=str(rd.path), task=record.task, seed=record.seed, score=record.score,
                    metric=record.metric, prompt_file=str(prompt_file.relative_to(rd.path)),
                    embedding_file=str(embedding_file.relative_to(rd.path)),
                    fingerprint=record.fingerprint, init=record.init)


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
  done = read_record(run_dir)
  if done is not None:
    return done
  prompt = prompt_module(settings, init, smop)
  model = dataclasses.replace(settings.model, module=settings.model.module.clone(prompt=prompt))
  metric = settings.metric_for(task)
  train_cfg, eval_cfg, checkpoint_cfg = _configs(settings, task, seed, metric, evaluate)
  train_lib.train(model=model, train_dataset_cfg=train_cfg, total_steps=settings.train_steps,
                  model_dir=str(run_dir),
                  optimizer=optimizers.adafactor(learning_rate=settings.learning_rate),
                  eval_cfg=eval_cfg, eval_period=settings.eval_period, checkpoint_cfg=checkpoint_cfg,
                  initial_checkpoint_path=settings.initial_checkpoint_path, seed=seed,
                  verbose=verbose, init_note=init_note)
  outcome = read_record(run_dir)
  if outcome is None:
    raise RuntimeError(f"{run_dir}: the trainer returned without recording the run as finished")
  return outcome


@dataclasses.dataclass(frozen=True)
class RunRequest:
  """One run of a batched job (`train_runs`).

  Attributes:
    name: its run directory's name under the job directory.
    task: its task or mixture.
    seed: its seed (prompt initialisation, data order, dropout keys).
    init: its initial prompt [L, E] (None: the sampled-vocabulary start, drawn with `seed`).
    init_note: how `init` was made, kept in the record.
  """
  name: str
  task: str
  seed: int
  init: Optional[np.ndarray] = None
  init_note: str = "sampled vocabulary"


def train_runs(settings: RunSettings, job_dir: str | pathlib.Path, requests: Sequence[RunRequest], *,
               backbone_seed: int, evaluate: bool = True, verbose: bool = False) -> list[RunOutcome]:
  """Trains K Prompt Tuning runs of one shape in one jitted step (the trainer's runs API).

  Each run is the ordinary run directory <job_dir>/<name>; finished runs are not trained again
  (a job resumes from the newest step all its runs saved). Every run of one job is evaluated
  with one metric: `settings.metric_for` of the first run's task (callers group by metric).

  Args:
    settings: the shared settings (the job trains `settings.train_steps` steps).
    job_dir: the job's directory (MODEL_DIR of the trainer).
    requests: the runs, in job order.
    backbone_seed: the random backbone's seed when there is no checkpoint (one for all K runs).
    evaluate: evaluate on the validation split and keep each run's best prompt.
    verbose: the trainer's progress lines.

  Returns:
    The outcome of every request, in order.
  """
  job_dir = pathlib.Path(job_dir)
  todo = [r for r in requests if read_record(job_dir / r.name) is None]
  if todo:
    first = todo[0].task
    metric = settings.metric_for(first)
    prompt = prompt_module(settings)
    model = dataclasses.replace(settings.model, module=settings.model.module.clone(prompt=prompt))
    specs = [train_lib.RunSpec(r.seed, r.task, r.name,
                               None if r.init is None else prompts.from_array(r.init, source=r.init_note),
                               r.init_note) for r in todo]
    train_cfg, eval_cfg, checkpoint_cfg = _configs(settings, first, backbone_seed, metric, evaluate)
    train_lib.train(model=model, train_dataset_cfg=train_cfg, total_steps=settings.train_steps,
                    model_dir=str(job_dir),
                    optimizer=optimizers.adafactor(learning_rate=settings.learning_rate),
                    eval_cfg=eval_cfg, eval_period=settings.eval_period,
                    checkpoint_cfg=checkpoint_cfg,
                    initial_checkpoint_path=settings.initial_checkpoint_path, seed=backbone_seed,
                    verbose=verbose, runs=specs)
  outcomes = [read_record(job_dir / r.name) for r in requests]
  missing = [r.name for r, o in zip(requests, outcomes) if o is None]
  if missing:
    raise RuntimeError(f"{job_dir}: the trainer returned without recording {missing} as finished")
  return outcomes
