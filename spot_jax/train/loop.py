"""The prompt-only (or full-model) training loop, in clear sections.

  0. check the configuration        4. run directories: backbone identity, records
  1. devices and mesh               5. optimizer state, restore (own checkpoints, else fresh)
  2. frozen backbone                6. one jitted train step (state donated, frozen weights not)
  3. trainable/frozen split         7. loop: log, save prompts, checkpoint, evaluate, keep best

`train_step(state, frozen_params, batch)` takes gradients with respect to `state.params` only,
so the frozen backbone never gets gradients, optimizer state or re-saving. Step keys are
`fold_in(state.rng, state.step)`, and the data stream is positioned by `state.data_position`, so
a run killed at any point and restarted with the same command ends where an uninterrupted run
would. With `seeds`/`tasks`/`runs` the job trains K runs in the same step, stacked along a
leading runs axis (`spot_jax.train.run_spec`); each run's directory is an ordinary run directory.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import optax

from spot_jax import backbone as backbone_lib
from spot_jax import data as data_lib
from spot_jax import models
from spot_jax import partitioning
from spot_jax import runtime
from spot_jax.errors import ConfigError
from spot_jax.train import checks
from spot_jax.train import job as job_lib
from spot_jax.train import optimizers
from spot_jax.train import run_spec as runs_lib
from spot_jax.train.checks import TRAINABLE_ALL, TRAINABLE_PROMPT, CheckpointConfig
from spot_jax.train.evaluator import EvalConfig
from spot_jax.train.train_result import RunResult, TrainResult
from spot_jax.train.state import TrainState
from spot_jax.train.step import jit_step

__all__ = ["TRAINABLE_ALL", "TRAINABLE_PROMPT", "CheckpointConfig", "RunResult",
           "TrainResult", "train"]


def train(*, model: models.Model, train_dataset_cfg: data_lib.DatasetConfig,
          total_steps: int, model_dir: str,
          optimizer: Optional[optax.GradientTransformation] = None,
          eval_cfg: Optional[EvalConfig] = None, eval_period: int = 500,
          checkpoint_cfg: CheckpointConfig = CheckpointConfig(),
          initial_checkpoint_path: Optional[str] = None, trainable: str = TRAINABLE_PROMPT,
          num_partitions: int = 1, shard_prompt_embed: bool = False, fsdp: bool = False,
          seed: int = 0,
          log_period: int = 10, verbose: bool = True,
          compilation_cache_dir: Optional[str] = None, dropout_rng: str = "threefry",
          seeds: Optional[Sequence[int]] = None, tasks: Optional[Sequence[str]] = None,
          runs: Optional[Sequence[runs_lib.RunSpec]] = None, shard_runs: bool = True,
          allow_backbone_change: bool = False, init_note: str = "") -> TrainResult:
  """Trains the prompt (or, with trainable="all", every parameter) of `model`; one run or K.

  Args:
    model: the model; `model.module.prompt` is the prompt method (None for model tuning).
    train_dataset_cfg: training data (K runs: each run's seed and task replace its own).
    total_steps: train until the state's step reaches this.
    model_dir: the run directory (K runs: the job's directory; run k in <model_dir>/<name>).
    optimizer: optax transformation (default: Prompt Tuning's Adafactor).
    eval_cfg: evaluation every `eval_period` steps and at the end (None: no evaluation); K runs
      on several tasks each evaluate their own task.
    eval_period: steps between evaluations.
    checkpoint_cfg: checkpoint cadence, prompt exports, the task-embedding step, best metric.
    initial_checkpoint_path: the frozen backbone (T5X, orbax or Hugging Face directory); None
      trains against a randomly initialised backbone (tests and smoke runs only).
    trainable: "prompt" (frozen backbone) or "all" (model tuning baselines).
    num_partitions: size of the "model" mesh axis.
    shard_prompt_embed: shard the prompt's embedding axis over "model".
    fsdp: shard the frozen weights over "data" as well (`partitioning.frozen_rules`).
    seed: the run's seed (K runs: the random backbone's seed and the default run seed).
    log_period: steps between progress lines.
    verbose: print progress lines.
    compilation_cache_dir: JAX's persistent compilation cache directory (None: off).
    dropout_rng: PRNG of the dropout masks: "threefry", "rbg" or "unsafe_rbg".
    seeds, tasks: K runs in one step (gin SEEDS / TASKS; see `spot_jax.train.run_spec`).
    runs: K runs from Python (`RunSpec`s: seed, task, name, per-run prompt initialiser).
    shard_runs: shard the runs axis over the data-parallel mesh axis when K divides by it.
    allow_backbone_change: resume runs recorded with another frozen backbone on purpose.
    init_note: how a single run's prompt was initialised (kept in its record).
  """
  # --- 0. check the configuration: nothing is read heavily or written before this passes ----
  plan = checks.plan(model=model, train_dataset_cfg=train_dataset_cfg, total_steps=total_steps,
                     model_dir=model_dir, eval_cfg=eval_cfg, eval_period=eval_period,
                     checkpoint_cfg=checkpoint_cfg, initial_checkpoint_path=initial_checkpoint_path,
                     trainable=trainable, seed=seed, log_period=log_period, dropout_rng=dropout_rng,
                     seeds=seeds, tasks=tasks, runs=runs, init_note=init_note)
  # FROZEN_DTYPE None: the checkpoint's dtype, decided once, before the runs record it
  model = backbone_lib.resolve_frozen_dtype(model, initial_checkpoint_path, trainable)
  runtime.enable_compilation_cache(compilation_cache_dir)
  tx = optimizer if optimizer is not None else optimizers.adafactor()

  # --- 1. devices and mesh --------------------------------------------------------------------
  mesh = partitioning.create_mesh(num_partitions)
  data_size = mesh.shape[partitioning.DATA]
  stacked = plan.stacked
  runs_sharded = stacked and shard_runs and data_size > 1 and len(plan.runs) % data_size == 0
  if not runs_sharded and train_dataset_cfg.batch_size % data_size:
    raise ConfigError(f"BATCH_SIZE={train_dataset_cfg.batch_size} must be divisible by the "
                      f"data-parallel mesh size {data_size} ({jax.device_count()} devices / "
                      f"{num_partitions} partitions)")
  rules = partitioning.logical_rules(shard_prompt_embed,
                                     overrides=(("batch", None),) if runs_sharded else ())
  lengths = train_dataset_cfg.task_feature_lengths
  model = model.for_batches(lengths)  # a decoder-only loss reads the targets' positions only
  dummy = model.dummy_batch(lengths["inputs"], lengths["targets"])
  job = job_lib.Job(plan, mesh, rules, runs_sharded, verbose)
  job.log.info(f"mesh: data={data_size} x model={num_partitions} over {jax.device_count()} "
               f"{jax.devices()[0].platform} device(s)"
               + (f"; {len(plan.runs)} runs in one step" + (" (runs axis sharded over data)"
                                                            if runs_sharded else "")
                  if stacked else ""))

  # --- 2. frozen backbone (placed by explicit shardings, before the rules context) ------------
  backbone, backbone_shardings = backbone_lib.load_backbone(
      model, dummy, initial_checkpoint_path, seed, mesh, partitioning.frozen_rules(rules, fsdp),
      job.log.info)
  try:
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
      # --- 3. trainable / frozen split (by structure: top-level keys) --------------------------
      params, frozen, frozen_shardings = job.init_params(model, backbone, backbone_shardings, dummy)
      # --- 4. run directories: the frozen backbone each existing run was trained with ---------
      job.open_runs(backbone_lib.record(model.config, initial_checkpoint_path, seed,
                                               plan.vocabulary), allow_backbone_change)
      # --- 5. optimizer state on the trainable tree only, then this job's own checkpoints ------
      state = job.restore_or_init(params, tx)
      job.write_records()
      # --- 6. one jitted train step (one compile per input length with length buckets) ---------
      step_fn = jit_step(model, tx, mesh, state_shardings=job.state_shardings,
                         frozen_shardings=frozen_shardings, batch_sharding=job.batch_sharding,
                         dropout_rng=dropout_rng, stacked=stacked,
                         runs_axis=partitioning.DATA if runs_sharded else None)
      # --- 7. loop ------------------------------------------------------------------------------
      state = _loop(job, model, state, frozen, step_fn, eval_cfg, eval_period, total_steps)
      job.finish(state)
      compilations = step_fn._cache_size()  # pylint: disable=protected-access
  finally:
    job.close()
  return job.result(state, frozen, compilations)


def _loop(job: job_lib.Job, model: models.Model, state: TrainState, frozen: Any,
          step_fn, eval_cfg: Optional[EvalConfig], eval_period: int,
          total_steps: int) -> TrainState:
  """Steps from the state's step to `total_steps`: log, export, evaluate, keep best, checkpoint."""
  plan = job.plan
  evaluators = job.evaluators(model, eval_cfg)
  batches = job.batches(int(job.data_position(state)))
  start = int(job.step_of(state))
  job.log.start(start)
  for step in range(start, total_steps):
    state, metrics = step_fn(state, frozen, next(batches))
    done = step + 1
    if step == start:  # the first step compiled: progress rates and the ETA count from its end
      jax.block_until_ready(metrics)
      job.log.compiled(done)
    job.pending.append((done, metrics))
    evaluate = evaluators is not None and (done % eval_period == 0 or done == total_steps)
    checkpoint = done % plan.checkpoint_period == 0 or done == total_steps
    if done % plan.log_period == 0 or done == total_steps:
      job.flush()
      job.progress_line(done)
    elif evaluate or checkpoint or done in plan.save_prompt_steps:
      job.flush()
    if done in plan.save_prompt_steps:
      job.export(state, f"prompt_step_{done}")
    if evaluate:
      job.evaluate(evaluators, frozen, state, done)
      job.log.start(done)  # rates time training steps, not an evaluation (nor its compilation)
    # Saved after the evaluation: a run killed between the two redoes this segment and its
    # evaluation (deterministically), instead of resuming past an evaluation that never ran.
    if checkpoint:
      job.save(state, done)
      job.export(state, f"prompt_step_{done}")
  job.flush()
  job.report_truncation()
  return state


logging.getLogger("absl").setLevel(logging.WARNING)
