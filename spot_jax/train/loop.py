"""The prompt-only (or full-model) training loop, in clear sections.

  1. devices and mesh          5. restore: own MODEL_DIR checkpoint, else fresh state
  2. frozen backbone           6. one jitted train step (state donated, frozen weights not)
  3. trainable/frozen split    7. loop: log, save prompts, checkpoint, evaluate, keep best
  4. optimizer state

`train_step(state, frozen_params, batch)` takes gradients with respect to `state.params` only,
so the frozen backbone never gets gradients, optimizer state or re-saving. Step keys are
`fold_in(state.rng, state.step)`, and the data stream is positioned by `state.data_position`, so
a run killed at any point and restarted with the same command ends where an uninterrupted run
would.
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
import optax

from spot_jax import backbone as backbone_lib
from spot_jax import data as data_lib
from spot_jax import fileio
from spot_jax import models
from spot_jax import partitioning
from spot_jax import run_dir as run_dir_lib
from spot_jax import runtime
from spot_jax.errors import ConfigError
from spot_jax.train import checkpointer as checkpointer_lib
from spot_jax.train import evaluator as evaluator_lib
from spot_jax.train import optimizers
from spot_jax.train import progress
from spot_jax.train.state import TrainState
from spot_jax.train.step import DROPOUT_RNGS, make_train_step

TRAINABLE_PROMPT = "prompt"
TRAINABLE_ALL = "all"


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """When and what to save.

  Attributes:
    period: save the training state every this many steps (and at the end); None: EVAL_PERIOD.
    keep: how many latest training states to keep (at least 2 lets a restart fall back when
      the latest one is damaged; a prompt-only state is well under a megabyte).
    save_prompt_steps: extra steps at which the prompt is exported (e.g. an early step whose
      prompt serves as a SPoT task embedding).
    best_metric: "task/metric" (or "metric") whose best value selects best/ and
      prompts/prompt_best.npy; None disables.
    best_mode: "max" or "min".
  """
  period: Optional[int] = None
  keep: int = 2
  save_prompt_steps: Sequence[int] = ()
  best_metric: Optional[str] = None
  best_mode: str = "max"


@dataclasses.dataclass
class TrainResult:
  """What a finished run returns (for scripts and tests).

  Attributes:
    state: the final `TrainState`.
    frozen_params: the frozen parameter tree (empty for model tuning).
    history: one dict of host metrics per step run in this process (loss, ...).
    eval_history: (step, metrics) for each evaluation.
    compilations: how many times the train step was compiled.
    mesh: the device mesh used.
  """
  state: TrainState
  frozen_params: Any
  history: list[dict[str, float]]
  eval_history: list[tuple[int, dict]]
  compilations: int
  mesh: Any


def prepare_model_dir(model_dir: str) -> pathlib.Path:
  """Creates MODEL_DIR and proves it writable, or raises a one-line ConfigError."""
  if not model_dir or model_dir == "None":
    raise ConfigError("MODEL_DIR is required: pass --gin.MODEL_DIR=\"'/path/to/run'\"")
  if "://" in str(model_dir):
    raise ConfigError(f"MODEL_DIR {model_dir!r}: only local directories are supported by this "
                      f"version (mount the bucket, e.g. with gcsfuse)")
  # Absolute: orbax refuses relative checkpoint paths, and users type MODEL_DIR=runs/x.
  return fileio.writable_dir(model_dir, "MODEL_DIR")


def _host_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
  out = {}
  for name, value in jax.device_get(dict(metrics)).items():
    value = np.asarray(value)
    out[name] = float(value) if value.ndim == 0 else value
  if out.get("num_tokens", 0) > 0:
    out["token_accuracy"] = out["correct_tokens"] / out["num_tokens"]
  return out


def check_finite(metrics: Mapping[str, Any], step: int, last_saved: Optional[int]) -> None:
  """Raises a one-line `ConfigError` when a step's loss, gradient or new parameters are not finite.

  A non-finite gradient or parameter norm means the parameters after `step` are corrupted even
  when the loss was finite, so all three are checked before anything of that step is written.
  """
  for name, what in (("loss", "loss"), ("grad_norm", "gradient norm"), ("param_norm", "parameter norm")):
    value = metrics.get(name)
    if value is not None and not np.isfinite(value):
      kept = (f"the last checkpoint (step {last_saved}) is intact" if last_saved is not None
              else "no checkpoint had been written")
      raise ConfigError(f"training diverged: the {what} is {value} at step {step}; nothing from step "
                        f"{step} on was saved and {kept}; lower LEARNING_RATE (or check the data) "
                        f"and restart")


def _effective_prompt(model: models.EncoderDecoderModel, trainable: Any) -> Optional[np.ndarray]:
  if not model.has_prompt or models.PROMPT_KEY not in trainable:
    return None
  from spot_jax import prompts  # pylint: disable=g-import-not-at-top
  return np.asarray(prompts.effective_prompt(model.module.prompt, jax.device_get(trainable[models.PROMPT_KEY])))


def _state_dict(state: TrainState) -> dict[str, Any]:
  return {"step": state.step, "params": state.params, "opt_state": state.opt_state,
          "rng": state.rng, "data_position": state.data_position}


def _state_from_dict(d: Mapping[str, Any]) -> TrainState:
  return TrainState(step=d["step"], params=d["params"], opt_state=d["opt_state"], rng=d["rng"],
                    data_position=d["data_position"])


def train(*, model: models.EncoderDecoderModel, train_dataset_cfg: data_lib.DatasetConfig,
          total_steps: int, model_dir: str,
          optimizer: Optional[optax.GradientTransformation] = None,
          eval_cfg: Optional[evaluator_lib.EvalConfig] = None, eval_period: int = 500,
          checkpoint_cfg: CheckpointConfig = CheckpointConfig(),
          initial_checkpoint_path: Optional[str] = None, trainable: str = TRAINABLE_PROMPT,
          num_partitions: int = 1, shard_prompt_embed: bool = False, seed: int = 0,
          log_period: int = 10, verbose: bool = True,
          compilation_cache_dir: Optional[str] = None, dropout_rng: str = "threefry") -> TrainResult:
  """Trains the prompt (or, with trainable="all", every parameter) of `model`.

  Args:
    model: the model; `model.module.prompt` is the prompt method (None for model tuning).
    train_dataset_cfg: training data.
    total_steps: train until the state's step reaches this.
    model_dir: run directory (checkpoints, prompts, TensorBoard, evaluation outputs).
    optimizer: optax transformation (default: Prompt Tuning's Adafactor).
    eval_cfg: evaluation every `eval_period` steps and at the end (None: no evaluation).
    eval_period: steps between evaluations.
    checkpoint_cfg: checkpoint cadence, prompt exports and best-metric tracking.
    initial_checkpoint_path: the frozen backbone (T5X, orbax or Hugging Face directory);
      None trains against a randomly initialised backbone (tests and smoke runs only).
    trainable: "prompt" (frozen backbone) or "all" (model tuning baselines).
    num_partitions: size of the "model" mesh axis.
    shard_prompt_embed: shard the prompt's embedding axis over "model".
    seed: seed of the initialisation and the dropout keys.
    log_period: steps between progress lines.
    verbose: print progress lines.
    compilation_cache_dir: JAX's persistent compilation cache directory (None: off); with
      `train_dataset_cfg.length_buckets` the step compiles once per bucket length, and a rerun
      with the cache loads those executables instead.
    dropout_rng: PRNG of the dropout masks: "threefry" (default), "rbg" or "unsafe_rbg"
      (see `dropout_key`).
  """
  # --- 0. check the configuration before any heavy work -------------------------------------
  if trainable not in (TRAINABLE_PROMPT, TRAINABLE_ALL):
    raise ConfigError(f"trainable={trainable!r}; valid: 'prompt' (prompt methods) or 'all' (model tuning)")
  if trainable == TRAINABLE_PROMPT and not model.has_prompt:
    raise ConfigError("prompt tuning needs a prompt method: add a --gin_file from gin/prompts/ "
                      "(e.g. gin/prompts/prompt_tuning_sampled_vocab.gin), or use gin/runs/model_tune.gin")
  if not isinstance(total_steps, int) or total_steps <= 0:
    raise ConfigError(f"TRAIN_STEPS must be a positive integer, got {total_steps!r}")
  if dropout_rng not in DROPOUT_RNGS:
    raise ConfigError(f"DROPOUT_RNG={dropout_rng!r}; valid: {', '.join(map(repr, DROPOUT_RNGS))}")
  if eval_period <= 0 or log_period <= 0:
    raise ConfigError(f"EVAL_PERIOD ({eval_period}) and log_period ({log_period}) must be positive")
  if not isinstance(checkpoint_cfg.keep, int) or checkpoint_cfg.keep < 1:
    raise ConfigError(f"CheckpointConfig.keep={checkpoint_cfg.keep!r}; keep at least 1 training state "
                      f"(2 or more lets a restart fall back when the latest one is damaged)")
  if checkpoint_cfg.best_mode not in ("max", "min"):
    raise ConfigError(f"best_mode={checkpoint_cfg.best_mode!r}; valid: 'max' or 'min'")
  data_lib.validate(train_dataset_cfg, model.prompt_length)
  longest = getattr(model.module.prompt, "max_input_length", None)  # DePT's offset rows
  if longest is not None and train_dataset_cfg.task_feature_lengths["inputs"] > longest:
    given = train_dataset_cfg.task_feature_lengths["inputs"]
    raise ConfigError(f"TASK_FEATURE_LENGTHS['inputs']={given} is longer than the prompt method's "
                      f"max input length {longest}; give inputs of at most {longest} tokens or a "
                      f"longer max length (DePT: MAX_INPUT_LENGTH)")
  data_lib.import_modules(train_dataset_cfg.module)
  data_lib.get_mixture_or_task(train_dataset_cfg.mixture_or_task_name)
  if initial_checkpoint_path:
    backbone_lib.check_initial_checkpoint(initial_checkpoint_path)
  run_dir = prepare_model_dir(model_dir)
  runtime.enable_compilation_cache(compilation_cache_dir)
  tx = optimizer if optimizer is not None else optimizers.adafactor()
  ckpt_period = checkpoint_cfg.period or eval_period

  # --- 1. devices and mesh -------------------------------------------------------------------
  mesh = partitioning.create_mesh(num_partitions)
  rules = partitioning.logical_rules(shard_prompt_embed)
  data_size = mesh.shape[partitioning.DATA]
  if train_dataset_cfg.batch_size % data_size:
    raise ConfigError(f"BATCH_SIZE={train_dataset_cfg.batch_size} must be divisible by the data-parallel "
                      f"mesh size {data_size} ({jax.device_count()} devices / {num_partitions} partitions)")
  lengths = train_dataset_cfg.task_feature_lengths
  dummy = model.dummy_batch(lengths["inputs"], lengths["targets"])
  _, prompt_rng, state_rng = backbone_lib.seed_keys(seed)
  log = progress.ProgressLogger(total_steps, train_dataset_cfg.batch_size,
                                       run_dir / "tensorboard" if jax.process_index() == 0 else None,
                                       enabled=verbose and jax.process_index() == 0)
  log.info(f"mesh: data={data_size} x model={num_partitions} over {jax.device_count()} "
           f"{jax.devices()[0].platform} device(s)")

  # --- 2. frozen backbone (placed by explicit shardings, before the rules context) ------------
  backbone, backbone_shardings = backbone_lib.load_backbone(model, dummy, initial_checkpoint_path, seed, mesh,
                                               rules, log.info)

  with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):

    # --- 3. trainable / frozen split (by structure: top-level keys) ---------------------------
    if model.has_prompt:
      abstract_prompt = jax.eval_shape(model.init_prompt, prompt_rng, backbone, dummy)
      prompt_shardings = partitioning.param_shardings(abstract_prompt, mesh, rules)
      prompt_params = jax.jit(lambda r, f: models.unbox(model.init_prompt(r, f, dummy)),
                              out_shardings=prompt_shardings)(prompt_rng, backbone)
    else:
      prompt_params, prompt_shardings = {}, {}
    if trainable == TRAINABLE_PROMPT:
      frozen, frozen_shardings = backbone, backbone_shardings
      params, params_shardings = prompt_params, prompt_shardings
    else:
      frozen, frozen_shardings = {}, {}
      params = models.merge_params(backbone, prompt_params)
      params_shardings = models.merge_params(backbone_shardings, prompt_shardings)

    # --- 4. optimizer state on the trainable tree only -----------------------------------------
    fresh = jax.jit(lambda p, r: TrainState.create(p, tx, r),
                    in_shardings=(params_shardings, partitioning.replicated(mesh)))(params, state_rng)
    state_shardings = jax.tree.map(lambda x: x.sharding, fresh)

    # --- 5. restore: this run's own checkpoint first, else the fresh state --------------------
    checkpointer = checkpointer_lib.Checkpointer(run_dir, keep=checkpoint_cfg.keep)
    try:
      abstract_state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                    _state_dict(fresh))
      restored, latest = checkpointer.restore_latest(abstract_state, warn=log.info)
      if checkpoint_cfg.best_metric:
        checkpointer.check_best(abstract_state, warn=log.info)
      if restored is not None:
        state = _state_from_dict(restored)
        del fresh
        log.info(f"resumed from {run_dir / 'checkpoints' / str(latest)} (step {int(state.step)})")
      else:
        state = fresh

      # --- 6. one jitted train step (one compile per input length with length buckets) -------
      batch_sharding = partitioning.batch_sharding(mesh)
      step_fn = jax.jit(make_train_step(model, tx, dropout_rng),
                        in_shardings=(state_shardings, frozen_shardings, batch_sharding),
                        out_shardings=(state_shardings, partitioning.replicated(mesh)),
                        donate_argnums=(0,))
      evaluator = (evaluator_lib.Evaluator(model, eval_cfg, log_dir=str(run_dir / "eval"))
                   if eval_cfg is not None else None)

      # --- 7. loop ------------------------------------------------------------------------
      start = int(state.step)
      batches = data_lib.train_batches(train_dataset_cfg, start_position=int(state.data_position),
                                       shard_id=jax.process_index(), num_shards=jax.process_count())
      history: list[dict[str, float]] = []
      eval_history: list[tuple[int, dict]] = []
      pending: list[tuple[int, Any]] = []  # (step, device metrics) not yet on the host
      truncated = {"inputs": 0, "targets": 0, "seen": 0}
      warned = set()
      log.start(start)
      save_prompt_steps = set(int(s) for s in checkpoint_cfg.save_prompt_steps)

      def flush() -> None:
        """Brings pending metrics to the host; stops before anything of a diverged step is written."""
        for step_done, m in pending:
          history.append(_host_metrics(m))
          check_finite(history[-1], step_done, checkpointer.latest_step())
        pending.clear()

      for step in range(start, total_steps):
        host = next(batches)
        truncated["inputs"] += int(np.sum(host.pop("inputs_truncated")))
        truncated["targets"] += int(np.sum(host.pop("targets_truncated")))
        truncated["seen"] += len(host["encoder_input_tokens"])
        batch = {k: jax.make_array_from_process_local_data(batch_sharding, v) for k, v in host.items()}
        state, metrics = step_fn(state, frozen, batch)
        done = step + 1
        pending.append((done, metrics))
        saves = (done in save_prompt_steps or done % ckpt_period == 0 or done == total_steps
                 or (evaluator is not None and (done % eval_period == 0 or done == total_steps)))

        if done % log_period == 0 or done == total_steps:
          flush()
          last = history[-1]
          log.train_line(done, {k: v for k, v in last.items() if isinstance(v, float)})
          for key in ("inputs", "targets"):
            if truncated[key] and key not in warned:
              warned.add(key)
              log.info(f"warning: {truncated[key]} of {truncated['seen']} training examples so far had "
                       f"{key} longer than TASK_FEATURE_LENGTHS[{key!r}]={lengths[key]} and were truncated")
        elif saves:
          flush()

        if done in save_prompt_steps:
          _export(checkpointer, model, state, f"prompt_step_{done}")
        if evaluator is not None and (done % eval_period == 0 or done == total_steps):
          results = evaluator.evaluate(models.merge_params(frozen, state.params), step=done)
          eval_history.append((done, results))
          flat = {f"{t}/{m}": v for t, ms in results.items() for m, v in ms.items()}
          log.info(f"eval step {done}: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(flat.items())))
          log.scalars("eval", done, flat)
          if checkpoint_cfg.best_metric:
            value = evaluator_lib.lookup_metric(results, checkpoint_cfg.best_metric)
            best = checkpointer.best_metric()
            better = best is None or (value > best if checkpoint_cfg.best_mode == "max" else value < best)
            if better:
              # metric.json (written last by save_best) commits the new best: a kill before it
              # makes the resumed run redo this evaluation and both writes.
              _export(checkpointer, model, state, "prompt_best")
              checkpointer.save_best(done, _state_dict(state), checkpoint_cfg.best_metric, value)
        # Saved after the evaluation: a run killed between the two redoes this segment and its
        # evaluation (deterministically), instead of resuming past an evaluation that never ran.
        if done % ckpt_period == 0 or done == total_steps:
          checkpointer.save(done, _state_dict(state))
          _export(checkpointer, model, state, f"prompt_step_{done}")
      flush()

      if truncated["inputs"] or truncated["targets"]:
        log.info(f"truncated in this run: {truncated['inputs']} inputs and {truncated['targets']} targets "
                 f"of {truncated['seen']} examples")
    finally:
      checkpointer.close()
      log.close()
    compilations = step_fn._cache_size()  # pylint: disable=protected-access
  return TrainResult(state=state, frozen_params=frozen, history=history, eval_history=eval_history,
                     compilations=compilations, mesh=mesh)


def _export(checkpointer: checkpointer_lib.Checkpointer, model: models.EncoderDecoderModel,
            state: TrainState, name: str) -> None:
  if jax.process_index() != 0:
    return
  prompt = _effective_prompt(model, state.params)
  if prompt is not None:
    # companions (DePT's offset) first: a prompt file on disk always has its companions
    from spot_jax import prompts  # pylint: disable=g-import-not-at-top
    params = jax.device_get(state.params[models.PROMPT_KEY])
    for extra, array in prompts.export_arrays(model.module.prompt, params).items():
      checkpointer.export_prompt(run_dir_lib.companion_file(f"{name}.npy", extra).stem, array)
    checkpointer.export_prompt(name, prompt)


logging.getLogger("absl").setLevel(logging.WARNING)
