"""The trainer's per-run bookkeeping: one run, or K runs stacked along a leading runs axis.

A `Job` holds what the loop of `spot_jax.train.loop` needs besides the state: the runs and their
directories (records, checkpointers, TensorBoard), the shardings, the pending step metrics,
evaluation with best-state selection, prompt exports and checkpoints. With one run nothing is
stacked; with K runs each of these is done per run on its slice of the stacked state, so each
run directory is an ordinary run directory. Data streams: `spot_jax.train.streams`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from spot_jax import backbone as backbone_lib
from spot_jax import fileio, models, partitioning
from spot_jax.orbax_io import DamagedCheckpoint
from spot_jax.run_dir import RunRecord, companion_file
from spot_jax.train import checks, progress, prompt_init, streams
from spot_jax.train import run_spec as runs_lib
from spot_jax.train.checkpointer import Checkpointer
from spot_jax.train.evaluator import EvalConfig, Evaluator, ModelOutputs, lookup_metric
from spot_jax.train.train_result import RunResult, TrainResult
from spot_jax.train.state import TrainState


def _state_dict(state: TrainState) -> dict[str, Any]:
  return {"step": state.step, "params": state.params, "opt_state": state.opt_state,
          "rng": state.rng, "data_position": state.data_position}


def _state_from_dict(d: Any) -> TrainState:
  return TrainState(step=d["step"], params=d["params"], opt_state=d["opt_state"], rng=d["rng"],
                    data_position=d["data_position"])


def _host_metrics(metrics: Any) -> dict[str, Any]:
  out = {}
  for name, value in metrics.items():
    value = np.asarray(value)
    out[name] = float(value) if value.ndim == 0 else value
  if out.get("num_tokens", 0) > 0:
    out["token_accuracy"] = out["correct_tokens"] / out["num_tokens"]
  return out


class Job:
  """One run, or K stacked runs, being trained (see the module docstring).

  Attributes:
    plan: the checked `checks.Plan`.
    mesh: the device mesh.
    log: the console progress logger (and, for one run, its TensorBoard).
    pending: (step, device metrics) not yet brought to the host.
  """

  def __init__(self, plan: checks.Plan, mesh, rules, runs_sharded: bool, verbose: bool):
    self.plan, self.mesh, self.rules, self.runs_sharded = plan, mesh, rules, runs_sharded
    self.stacked = plan.stacked
    self.k = len(plan.runs)
    self.main = jax.process_index() == 0
    batch_size = plan.train_cfgs[0].batch_size
    first_tb = plan.runs[0].run_dir.tensorboard if (self.main and not self.stacked) else None
    self.log = progress.ProgressLogger(plan.total_steps, batch_size * self.k, first_tb,
                                       enabled=verbose and self.main)
    self.run_logs = ([progress.ProgressLogger(plan.total_steps, batch_size,
                                              r.run_dir.tensorboard if self.main else None,
                                              enabled=False) for r in plan.runs]
                     if self.stacked else [self.log])
    self.checkpointers: list[Checkpointer] = []
    self.pending: list[tuple[int, Any]] = []
    self.histories: list[list[dict]] = [[] for _ in plan.runs]
    self.eval_histories: list[list[tuple[int, dict]]] = [[] for _ in plan.runs]
    self.data = streams.Streams(plan, self.log)
    runs_axis = partitioning.DATA if runs_sharded else None
    self.batch_sharding = (NamedSharding(mesh, PartitionSpec(runs_axis) if runs_sharded
                                         else PartitionSpec(None, partitioning.DATA))
                           if self.stacked else partitioning.batch_sharding(mesh))
    self._runs_axis = runs_axis
    self.model: Optional[models.Model] = None
    self.run_shardings: Any = None    # one run's state shardings
    self.state_shardings: Any = None  # the job's (stacked for K runs)
    self._resumed, self._resumed_step = False, None

  # --- sharding helpers ---------------------------------------------------------------------

  def _stacked_sharding(self, sharding: NamedSharding) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec(self._runs_axis, *sharding.spec))

  def _run_slice(self, tree: Any, k: int, shardings: Any) -> Any:
    """Run k's slice of a stacked tree, placed with one run's `shardings`."""
    if not self.stacked:
      return tree
    if not hasattr(self, "_slicer"):
      self._slicer = {}
    key = id(shardings)
    if key not in self._slicer:
      self._slicer[key] = jax.jit(lambda t, i: jax.tree.map(
          lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), t), out_shardings=shardings)
    return self._slicer[key](tree, np.int32(k))

  # --- 3. the trainable parameters ----------------------------------------------------------

  def init_params(self, model: models.Model, backbone: Any, backbone_shardings: Any,
                  dummy: Any) -> tuple[Any, Any, Any]:
    """(trainable params, frozen params, frozen shardings): each run's prompt, stacked for K."""
    self.model = model
    if not model.has_prompt:
      prompt_params, prompt_shardings = {}, {}
    else:
      per_run, prompt_shardings = prompt_init.initial_prompts(
          model, self.plan.runs, backbone, dummy, self.mesh, self.rules, self.stacked)
      runs_lib.check_same_shapes(per_run, self.plan.runs)
      if self.stacked:
        stacked = jax.tree.map(self._stacked_sharding, prompt_shardings)
        prompt_params = jax.jit(lambda *ps: runs_lib.stack(ps), out_shardings=stacked)(*per_run)
      else:
        prompt_params = per_run[0]
    if self.plan.trainable == checks.TRAINABLE_PROMPT:
      return prompt_params, backbone, backbone_shardings
    return models.merge_params(backbone, prompt_params), {}, {}

  # --- 4. run directories ---------------------------------------------------------------------

  def open_runs(self, backbone_record: dict, allow_backbone_change: bool) -> None:
    """Checks each existing run's backbone, then opens (creates) the directories' checkpointers.

    The records are written by `write_records`, once the state has been restored: a restart
    that fails before that leaves every run directory as it was.
    """
    self._existing = [run.run_dir.read_record() for run in self.plan.runs]
    self._backbone_record = backbone_record
    if not allow_backbone_change:
      for run, record in zip(self.plan.runs, self._existing):
        if record is not None:
          backbone_lib.check_same(record.fingerprint, backbone_record["fingerprint"],
                                  str(run.run_dir.path), "--gin.ALLOW_BACKBONE_CHANGE=True")
    self.checkpointers = [Checkpointer(run.run_dir, keep=self.plan.checkpoint_cfg.keep)
                          for run in self.plan.runs]

  def write_records(self) -> None:
    """Each run's record (run.json) and operative gin config (config.gin) as the run starts,
    and the job's run list (K runs)."""
    if not self.main:
      return
    if self.stacked:
      runs_lib.write_job(self.plan.model_dir, self.plan.runs)
    from spot_jax.cli import gin_flags  # pylint: disable=g-import-not-at-top  (gin at the edge)
    config = gin_flags.operative_config()
    for run, old in zip(self.plan.runs, self._existing):
      if config is not None:
        run.run_dir.write_config(config, self._resumed_step if old is not None else None)
      run.run_dir.write_record(RunRecord(
          task=run.task, seed=run.seed, method=self.plan.method, backbone=self._backbone_record,
          task_module=self.plan.task_module, train_steps=self.plan.total_steps,
          embedding_step=self.plan.embedding_step, metric=self.plan.checkpoint_cfg.best_metric,
          score=None if old is None else old.score, finished=False,
          init=old.init if (self._resumed and old is not None and old.init)
          else self._init_origin(run)))

  def _init_origin(self, run: runs_lib.Run) -> str:
    """Where the run's trainable parameters start (`RunRecord.init`)."""
    if self.model is not None and self.model.has_prompt:
      return prompt_init.origin(self.model, run)
    checkpoint = self._backbone_record.get("checkpoint")
    return (f"the frozen model's weights, {checkpoint}" if checkpoint
            else f"random weights (seed {self._backbone_record.get('seed')})")

  # --- 5. state: fresh or restored --------------------------------------------------------------

  def restore_or_init(self, params: Any, tx) -> TrainState:
    """The job's state: each run's own latest checkpoint, else a fresh state."""
    rngs = [backbone_lib.seed_keys(run.seed)[2] for run in self.plan.runs]
    rep = partitioning.replicated(self.mesh)
    first = params
    if self.stacked:  # run 0's own arrays, to find one run's state shardings
      first = self._run_slice(params, 0,
                              jax.tree.map(lambda x: self._unstacked(x.sharding), params))
    in_shardings = jax.tree.map(lambda x: x.sharding, first)
    fresh = jax.jit(lambda p, r: TrainState.create(p, tx, r), in_shardings=(in_shardings, rep))(
        first, rngs[0])
    self.run_shardings = jax.tree.map(lambda x: x.sharding, fresh)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            _state_dict(fresh))
    if self.stacked:
      self.state_shardings = jax.tree.map(self._stacked_sharding, self.run_shardings)
      fresh = jax.jit(jax.vmap(lambda p, r: TrainState.create(p, tx, r)),
                      out_shardings=self.state_shardings)(params, runs_lib.stack(rngs))
    else:
      self.state_shardings = self.run_shardings
    if self.plan.checkpoint_cfg.best_metric:
      for ck in self.checkpointers:
        ck.check_best(abstract, warn=self.log.info)
    restored = (self._restore_one(abstract) if not self.stacked
                else self._restore_common(abstract))
    self._resumed = restored is not None  # a resumed run keeps the start its record names
    self._resumed_step = self.step_of(restored) if restored is not None else None
    return fresh if restored is None else restored

  def _unstacked(self, sharding: NamedSharding) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec(*sharding.spec[1:]))

  def _restore_one(self, abstract: Any) -> Optional[TrainState]:
    restored, latest = self.checkpointers[0].restore_latest(abstract, warn=self.log.info)
    if restored is None:
      return None
    state = _state_from_dict(restored)
    self.log.info(f"resumed from {self.plan.runs[0].run_dir.state_path(latest)} "
                  f"(step {int(state.step)})")
    return state

  def _restore_common(self, abstract: Any) -> Optional[TrainState]:
    """K runs resume from the newest step every run saved (damaged ones moved aside)."""
    while True:
      steps = [set(run.run_dir.state_steps()) for run in self.plan.runs]
      if not any(steps):
        return None
      common = sorted(set.intersection(*steps), reverse=True)
      if not common:  # e.g. killed between the runs' first saves: all start again from step 0
        listing = "; ".join(f"{r.name}: {sorted(s) or 'none'}"
                            for r, s in zip(self.plan.runs, steps))
        self.log.info(f"the runs of {self.plan.model_dir} saved no common step ({listing}); all "
                      f"start from step 0 (a saved state is kept, not written again)")
        return None
      step, states = common[0], []
      try:
        for ck in self.checkpointers:
          states.append(_state_from_dict(ck.restore(step, abstract)))
      except DamagedCheckpoint as e:
        ck = self.checkpointers[len(states)]
        aside = ck.move_aside(e.step)
        self.log.info(f"warning: the training state of step {e.step} of run "
                      f"{self.plan.runs[len(states)].name} cannot be read ({e.reason}); moved it "
                      f"to {aside}")
        continue
      state = jax.jit(lambda *s: runs_lib.stack(s), out_shardings=self.state_shardings)(*states)
      self.log.info(f"resumed {self.k} runs in {self.plan.model_dir} from step {step}")
      return state

  def step_of(self, state: TrainState) -> int:
    return int(partitioning.fetch(state.step).reshape(-1)[0])

  def data_position(self, state: TrainState) -> int:
    return int(partitioning.fetch(state.data_position).reshape(-1)[0])

  def batches(self, start_position: int) -> Iterator[dict]:
    return self.data.global_batches(start_position, self.batch_sharding)

  # --- 7. the loop's work -------------------------------------------------------------------------

  def flush(self) -> None:
    """Brings pending metrics to the host; stops before anything of a diverged step is written."""
    for done, metrics in self.pending:
      host = {name: partitioning.fetch(value) for name, value in metrics.items()}
      for k, run in enumerate(self.plan.runs):
        values = {n: v[k] for n, v in host.items()} if self.stacked else host
        self.histories[k].append(_host_metrics(values))
        last_saved = self.checkpointers[k].latest_step()
        checks.check_finite(self.histories[k][-1], done, last_saved,
                            run.name if self.stacked else None)
    self.pending.clear()

  def progress_line(self, done: int) -> None:
    lasts = [h[-1] for h in self.histories]
    floats = [{k: v for k, v in last.items() if isinstance(v, float)} for last in lasts]
    if not self.stacked:
      self.log.train_line(done, floats[0])
    else:
      losses = [f["loss"] for f in floats]
      mean = dict(floats[0], loss=float(np.mean(losses)))
      self.log.train_line(done, mean, note=f" ({self.k} runs: {min(losses):.4f}-{max(losses):.4f})")
      for logger, values in zip(self.run_logs, floats):
        logger.scalars("train", done, values)
    self.data.warn_truncation()

  def report_truncation(self) -> None:
    self.data.report_truncation()

  def _effective_prompt(self, params: Any) -> Optional[np.ndarray]:
    if self.model is None or not self.model.has_prompt or models.PROMPT_KEY not in params:
      return None
    from spot_jax import prompts  # pylint: disable=g-import-not-at-top
    host = jax.tree.map(partitioning.fetch, params[models.PROMPT_KEY])
    return np.asarray(prompts.effective_prompt(self.model.module.prompt, host, self.model.config))

  def _export_arrays(self, params: Any) -> dict:
    from spot_jax import prompts  # pylint: disable=g-import-not-at-top
    host = jax.tree.map(partitioning.fetch, params[models.PROMPT_KEY])
    return prompts.export_arrays(self.model.module.prompt, host)

  def _run_params(self, state: TrainState, k: int) -> Any:
    return self._run_slice(state.params, k, self.run_shardings.params)

  def export(self, state: TrainState, name: str, only: Optional[int] = None) -> None:
    """Writes each run's effective prompt as prompts/<name>.npy (process 0 writes)."""
    step = "best" if name == "prompt_best" else int(name.rsplit("_", 1)[1])
    for k, run in enumerate(self.plan.runs):
      if only is not None and k != only:
        continue
      params = self._run_params(state, k)
      prompt = self._effective_prompt(params)
      if prompt is None or not self.main:
        continue
      path = run.run_dir.prompt_path(step)
      # Companions (DePT's offset) first: a prompt file on disk always has its companions.
      for extra, array in self._export_arrays(params).items():
        fileio.save_npy(companion_file(path, extra), np.asarray(array, np.float32))
      # A deep prompt's record (structured dtype) is written as is.
      fileio.save_npy(path, prompt if prompt.dtype.names else prompt.astype(np.float32))

  def save(self, state: TrainState, done: int) -> None:
    for k, ck in enumerate(self.checkpointers):
      ck.save(done, _state_dict(self._run_slice(state, k, self.run_shardings)))

  def evaluators(self, model: models.Model, eval_cfg: Optional[EvalConfig]
                 ) -> Optional[list[tuple[Evaluator, list[int]]]]:
    """One evaluator per evaluated task with the runs it evaluates (runs on TASKS: their own)."""
    if eval_cfg is None:
      return None
    # The run files bind the evaluated task to the training task (MIXTURE_OR_TASK_NAME): then each
    # run evaluates its own task; an explicitly different one is evaluated by every run.
    own = eval_cfg.mixture_or_task_name == self.plan.default_task
    groups: dict[str, list[int]] = {}
    for k, run in enumerate(self.plan.runs):
      groups.setdefault(run.task if own else eval_cfg.mixture_or_task_name, []).append(k)
    log_dir = None if self.stacked else str(self.plan.runs[0].run_dir.eval_logs)
    outputs = ModelOutputs(model, eval_cfg.task_feature_lengths["targets"])  # one trace for all
    return [(Evaluator(model, dataclasses.replace(eval_cfg, mixture_or_task_name=task),
                       log_dir=log_dir, mesh=self.mesh, outputs=outputs), members)
            for task, members in groups.items()]

  def evaluate(self, evaluators, frozen: Any, state: TrainState, done: int) -> None:
    """Evaluates every run, logs the metrics and keeps each run's best state."""
    results: list[Optional[dict]] = [None] * self.k
    for evaluator, members in evaluators:
      if not self.stacked:
        results[0] = evaluator.evaluate(models.merge_params(frozen, state.params), step=done)
        continue
      prompt = jax.tree.map(lambda x, idx=np.asarray(members): x[idx], state.params)
      dirs = [str(self.plan.runs[k].run_dir.eval_logs) for k in members]
      for k, metrics in zip(members, evaluator.evaluate_stacked(frozen, prompt, done, dirs)):
        results[k] = metrics
    flats = [{f"{t}/{m}": v for t, ms in r.items() for m, v in ms.items()} for r in results]
    for k, (logger, flat) in enumerate(zip(self.run_logs, flats)):
      self.eval_histories[k].append((done, results[k]))
      logger.scalars("eval", done, flat)
    if not self.stacked:
      self.log.info(f"eval step {done}: "
                    + ", ".join(f"{n} {v:.4g}" for n, v in sorted(flats[0].items())))
    else:
      names = sorted(set().union(*flats))
      self.log.info(f"eval step {done} ({self.k} runs): " + ", ".join(
          f"{n} mean {np.mean([f[n] for f in flats if n in f]):.4g} "
          f"[{min(f[n] for f in flats if n in f):.4g}, {max(f[n] for f in flats if n in f):.4g}]"
          for n in names))
    self._keep_best(results, state, done)

  def _keep_best(self, results, state: TrainState, done: int) -> None:
    cc = self.plan.checkpoint_cfg
    if not cc.best_metric:
      return
    for k, ck in enumerate(self.checkpointers):
      value = lookup_metric(results[k], cc.best_metric)
      best = ck.best_metric()
      if best is None or (value > best if cc.best_mode == "max" else value < best):
        # metric.json (written last by save_best) commits the new best: a kill before it
        # makes the resumed run redo this evaluation and both writes.
        self.export(state, "prompt_best", only=k)
        ck.save_best(done, _state_dict(self._run_slice(state, k, self.run_shardings)),
                     cc.best_metric, value)

  # --- the end ----------------------------------------------------------------------------------

  def finish(self, state: TrainState) -> None:
    """Marks each run finished in its record, with its best score."""
    del state
    if not self.main:
      return
    for run, ck in zip(self.plan.runs, self.checkpointers):
      record = run.run_dir.read_record()
      if record is not None:
        run.run_dir.write_record(dataclasses.replace(record, score=ck.best_metric(), finished=True))

  def close(self) -> None:
    for ck in self.checkpointers:
      ck.close()
    for logger in {id(l): l for l in [self.log, *self.run_logs]}.values():
      logger.close()

  def result(self, state: TrainState, frozen: Any, compilations: int) -> TrainResult:
    per_run = [RunResult(run, self._run_slice(state, k, self.run_shardings), self.histories[k],
                         self.eval_histories[k]) for k, run in enumerate(self.plan.runs)]
    return TrainResult(state=state, frozen_params=frozen, history=self.histories[0],
                       eval_history=self.eval_histories[0], compilations=compilations,
                       mesh=self.mesh, runs=per_run)
