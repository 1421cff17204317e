"""Where experiments are run: a batch of prompt runs as one K-run trainer job, read back.

`run(recipe, job_dir, requests)` is the one way the demo, the study and retrieval train prompts.
The requests share the recipe, hence one prompt method and its shapes, so they train as K runs
of one jitted step: one `train.train(..., runs=[RunSpec, ...])` call, every run in the ordinary
run directory `<job_dir>/<name>` (`alone=True`: one plain trainer run per request, in the same
directory). A job whose runs all finished the recipe's steps is not trained again; a job with
any other run is started again with the same call, and the trainer resumes every run from its
own checkpoints (a finished run takes no more steps). The outcomes are read back from each
run's run.json. A recipe naming class labels also gets each run's rank-classification accuracy
(`rank.score`, after training; saved in the run directory, reused on a rerun). The runner calls
the trainer as a library function; it never patches it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import shutil
import time
from typing import Optional, Sequence

import numpy as np

from spot_jax import data as data_lib
from spot_jax import prompts
from spot_jax import train as train_lib
from spot_jax.experiment import rank
from spot_jax.experiment.outcome import RunOutcome, read_outcome
from spot_jax.experiment.request import Recipe, RunRequest
from spot_jax.train import evaluator as evaluator_lib

SAMPLED_VOCABULARY = "sampled vocabulary"  # run.json's `init` of a run from the recipe's start


@dataclasses.dataclass
class JobResult:
  """A job's outcomes (request order) and its wall time in this process (None: nothing trained).

  Attributes:
    path: the job's directory.
    outcomes: every request's outcome, in request order.
    seconds: the trainer's wall time, or None when every run had finished before.
    rank_seconds: the rank classification's wall time, or None when none was computed.
  """
  path: pathlib.Path
  outcomes: list[RunOutcome]
  seconds: Optional[float]
  rank_seconds: Optional[float] = None


def _finished(recipe: Recipe, run_dir: pathlib.Path, request: RunRequest) -> Optional[RunOutcome]:
  """The run's outcome when it finished the recipe's steps (with a score if evaluated)."""
  outcome = read_outcome(run_dir, request.label, recipe.name)
  if outcome is None or outcome.train_steps != recipe.steps \
      or (recipe.evaluate and outcome.score is None):
    return None
  return outcome


def _outcomes(recipe: Recipe, job_dir: pathlib.Path,
              requests: Sequence[RunRequest]) -> Optional[list[RunOutcome]]:
  outcomes = [_finished(recipe, job_dir / r.run_name, r) for r in requests]
  return None if any(o is None for o in outcomes) else outcomes


def run(recipe: Recipe, job_dir: str | pathlib.Path, requests: Sequence[RunRequest], *,
        alone: bool = False, fresh: bool = False, verbose: bool = False) -> JobResult:
  """Trains `requests` as K runs of `recipe` in one trainer call (or reuses them).

  Args:
    recipe: what every run shares (model and prompt, optimizer, budget, data, evaluation).
    job_dir: the job's directory (the trainer's MODEL_DIR); run k is `<job_dir>/<name>`.
    requests: the runs, in job order; each keeps its own seed, task, data stream and directory.
    alone: train each unfinished request as a plain single run (its seed also seeds a random
      backbone), e.g. to compare wall times, or for runs of one recipe that never batch.
    fresh: delete the job's directory first.
    verbose: the trainer's progress lines.

  Returns:
    The job's directory, every request's outcome and the wall time spent training.
  """
  job_dir = pathlib.Path(job_dir)
  if not requests:
    return JobResult(job_dir, [], None)
  if fresh and job_dir.exists():
    shutil.rmtree(job_dir)
  outcomes = _outcomes(recipe, job_dir, requests)
  seconds = None
  if outcomes is None:
    started = time.time()
    if alone:
      for r in requests:
        if _finished(recipe, job_dir / r.run_name, r) is None:
          _train_alone(recipe, job_dir / r.run_name, r, verbose)
    else:
      _train_job(recipe, job_dir, requests, verbose)
    seconds = time.time() - started
    outcomes = _outcomes(recipe, job_dir, requests)
    if outcomes is None:
      raise RuntimeError(f"{job_dir}: the trainer returned without recording every run as finished")
  started = time.time()
  seeds = [r.seed if alone else recipe.backbone_seed for r in requests]
  outcomes, computed = rank.score(recipe, outcomes, seeds)
  return JobResult(job_dir, outcomes, seconds, time.time() - started if computed else None)


def _array_key(array: np.ndarray) -> str:
  return hashlib.sha256(np.ascontiguousarray(array, np.float32).tobytes()).hexdigest()


def _configs(recipe: Recipe, task: str, seed: int):
  """(training data, evaluation, checkpoints) of the job; K runs: the first run's task, and each
  run's own task and seed replace them."""
  lengths = dict(recipe.lengths)
  train_cfg = data_lib.DatasetConfig(task, lengths, batch_size=recipe.batch_size, seed=seed,
                                     module=recipe.task_module, task_names=recipe.task_names)
  eval_cfg = None
  if recipe.evaluate:
    eval_cfg = evaluator_lib.EvalConfig(task, lengths, split="validation",
                                        batch_size=recipe.eval_batch_size,
                                        num_examples=recipe.eval_num_examples,
                                        module=recipe.task_module)
  checkpoint_cfg = train_lib.CheckpointConfig(period=recipe.checkpoint_period,
                                              best_metric=recipe.metric,
                                              embedding_step=recipe.embedding_step)
  return train_cfg, eval_cfg, checkpoint_cfg


def _train(recipe: Recipe, model, task: str, seed: int, model_dir: pathlib.Path, verbose: bool,
           **more) -> None:
  train_cfg, eval_cfg, checkpoint_cfg = _configs(recipe, task, seed)
  train_lib.train(model=model, train_dataset_cfg=train_cfg, total_steps=recipe.steps,
                  model_dir=str(model_dir), optimizer=recipe.optimizer, eval_cfg=eval_cfg,
                  eval_period=recipe.eval_period or recipe.steps, checkpoint_cfg=checkpoint_cfg,
                  initial_checkpoint_path=recipe.initial_checkpoint_path, seed=seed,
                  verbose=verbose, **more)


def _train_job(recipe: Recipe, job_dir: pathlib.Path, requests: Sequence[RunRequest],
               verbose: bool) -> None:
  """One trainer call: the requests as K runs of one jitted step."""
  # Runs starting from the same prompt share one initialiser: the trainer traces the prompt's
  # initialisation once per initialiser, not once per run.
  inits = {}
  for r in requests:
    if r.init is not None:
      inits.setdefault(_array_key(r.init), prompts.from_array(r.init, source=r.init_note))
  specs = [train_lib.RunSpec(r.seed, r.task, name=r.run_name,
                             prompt_init=None if r.init is None else inits[_array_key(r.init)],
                             init_note=r.init_note or SAMPLED_VOCABULARY) for r in requests]
  _train(recipe, recipe.model, requests[0].task, recipe.backbone_seed, job_dir, verbose,
         runs=specs)


def _train_alone(recipe: Recipe, run_dir: pathlib.Path, request: RunRequest,
                 verbose: bool) -> None:
  """One plain trainer run in `run_dir` (MODEL_DIR is the run directory)."""
  model = recipe.model
  if request.init is not None:
    prompt = model.module.prompt
    start = prompts.from_array(request.init, source=request.init_note or "initial prompt")
    model = dataclasses.replace(model, module=model.module.clone(
        prompt=prompt.clone(prompt_init=start)))
  _train(recipe, model, request.task, request.seed, run_dir, verbose,
         init_note=request.init_note or SAMPLED_VOCABULARY)
