"""Section 0 of the trainer: check every setting before anything heavy is read or anything written.

`plan(...)` validates the settings (one-line `ConfigError`s naming the gin macro), resolves the
job's runs (`spot_jax.train.run_spec`), checks the run directories that already exist
(MODEL_DIR, the job's run list, each run's record: same task and seed) and returns the `Plan` the
loop follows.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from spot_jax import backbone as backbone_lib
from spot_jax import data as data_lib
from spot_jax import models
from spot_jax import prompts
from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import ptuning_v2
from spot_jax.train import run_spec as runs_lib
from spot_jax.train.evaluator import EvalConfig
from spot_jax.train.step import DROPOUT_RNGS

TRAINABLE_PROMPT = "prompt"
TRAINABLE_ALL = "all"


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """When and what to save.

  Attributes:
    period: save the training state every this many steps (and at the end); None: EVAL_PERIOD.
    keep: how many latest training states to keep (at least 2 lets a restart fall back when
      the latest one is damaged, and lets K runs always find a step they all saved).
    save_prompt_steps: extra steps at which the prompt is exported.
    best_metric: "task/metric" (or "metric") whose best value selects best/ and
      prompts/prompt_best.npy; None disables.
    best_mode: "max" or "min".
    embedding_step: the step whose exported prompt is the run's task embedding (SPoT); None:
      a third of the training steps (the SPoT layer's 10,000 of 30,000).
  """
  period: Optional[int] = None
  keep: int = 2
  save_prompt_steps: Sequence[int] = ()
  best_metric: Optional[str] = None
  best_mode: str = "max"
  embedding_step: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the loop follows, from checked settings.

  Attributes:
    runs: the resolved runs (one, or K stacked).
    default_task: the job's training task (MIXTURE_OR_TASK_NAME; runs without a task train it).
    stacked: K runs stacked along a runs axis (False: one plain run).
    model_dir: the job's directory (the run directory of a single run).
    train_cfgs: each run's dataset configuration (its seed and task).
    trainable, total_steps, log_period, checkpoint_period: as given (period resolved).
    save_prompt_steps: steps whose prompt is exported (the embedding step included).
    embedding_step: the task-embedding step.
    checkpoint_cfg: as given.
    vocabulary: the training task's input vocabulary (recorded in each run's record).
    task_module: MIXTURE_OR_TASK_MODULE.
    method: the prompt module's description (recorded).
  """
  runs: list
  default_task: str
  stacked: bool
  model_dir: pathlib.Path
  train_cfgs: list
  trainable: str
  total_steps: int
  log_period: int
  checkpoint_period: int
  save_prompt_steps: frozenset
  embedding_step: int
  checkpoint_cfg: CheckpointConfig
  vocabulary: Any
  task_module: Optional[str]
  method: dict


def _check_input_length(model: Any, cfg: Any) -> None:
  """Inputs no longer than a prompt method's own maximum (DePT's offset has one row a position;
  a decoder-only model's prompt module sees inputs and targets as one sequence)."""
  longest = getattr(model.module.prompt, "max_input_length", None)
  lengths = cfg.task_feature_lengths
  given = lengths["inputs"]
  what = "TASK_FEATURE_LENGTHS['inputs']"
  if getattr(model, "feature_layout", None) == "decoder_only":
    given, what = given + lengths["targets"], "inputs + targets of TASK_FEATURE_LENGTHS"
  if longest is not None and given > longest:
    raise ConfigError(f"{what}={given} is longer than the prompt method's max input length "
                      f"{longest}; give inputs of at most {longest} tokens or a longer max length "
                      f"(DePT: MAX_INPUT_LENGTH)")


def check_backbone_kind(model: Any) -> None:
  """Refuses, in one line, a prompt method setting that cannot apply to the model's backbone kind.

  A decoder-only backbone reads inputs and targets as one causal sequence and has one stack of
  self-attention: a prompt after the targets (placement 'suffix') would be seen by no target,
  and deep prompts for an encoder or for cross-attention have nowhere to go.
  """
  prompt = model.module.prompt
  if getattr(model, "kind", "t5") != "decoder" or prompt is None:
    return
  name = type(prompt).__name__
  if getattr(prompt, "placement", "prefix") == "suffix":
    raise ConfigError(f"{name}.placement='suffix' puts the prompt after the targets of a "
                      f"decoder-only model, where no target sees it; use 'prefix' or 'after_bos'")
  if isinstance(prompt, prompts.PTuningV2):
    ptuning_v2.check_decoder_stacks(prompt.stacks)
    return
  wanted = tuple(getattr(prompt, "attention", ()))
  other = [w for w in wanted if w != "decoder"]
  if other:
    raise ConfigError(f"{name}.attention={wanted!r}: a decoder-only model has no {other[0]!r} "
                      f"attention, only the decoder's self-attention; set attention=('decoder',) "
                      f"(PREFIX_ATTENTION)")
  if getattr(prompt, "layout", "separate") != "separate":
    raise ConfigError(f"{name}.layout={prompt.layout!r} is PEFT's layout for T5; a decoder-only "
                      f"model takes layout='separate'")


def _steps(name: str, values: Any, total_steps: int) -> list[int]:
  if values is None:
    return []
  if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
    raise ConfigError(f"{name}={values!r} is not a list of steps; give e.g. {name}=[10, 100]")
  out = []
  for i, v in enumerate(values):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= total_steps:
      raise ConfigError(f"{name}={list(values)!r}: entry {i} ({v!r}) must be a positive step "
                        f"<= TRAIN_STEPS={total_steps}")
    out.append(int(v))
  return out


def describe_method(module: Any) -> dict:
  """The prompt module as a run records it: its class and scalar attributes."""
  if module is None:
    return {}
  out = {"class": type(module).__name__}
  for field in dataclasses.fields(module):
    if field.name in ("parent", "name"):
      continue
    value = getattr(module, field.name, None)
    if isinstance(value, (bool, int, float, str)) or value is None:
      out[field.name] = value
    elif isinstance(value, tuple) and all(isinstance(v, (bool, int, float, str)) for v in value):
      out[field.name] = list(value)
  return out


def check_model_dir(model_dir: Any) -> pathlib.Path:
  """MODEL_DIR as an absolute local path that can be created and written (nothing is created)."""
  if not model_dir or model_dir == "None":
    raise ConfigError("MODEL_DIR is required: pass --gin.MODEL_DIR=\"'/path/to/run'\"")
  if "://" in str(model_dir):
    raise ConfigError(f"MODEL_DIR {model_dir!r}: only local directories are supported by this "
                      f"version (mount the bucket, e.g. with gcsfuse)")
  folder = pathlib.Path(str(model_dir)).expanduser().absolute()
  probe = folder
  while not probe.exists():
    probe = probe.parent
  if not probe.is_dir():
    raise ConfigError(f"MODEL_DIR {str(folder)!r}: {str(probe)!r} is a file, not a directory; "
                      f"give a directory you can create and write to")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise ConfigError(f"MODEL_DIR {str(folder)!r} is not writable ({str(probe)!r} is read-only); "
                      f"give a directory you can create and write to")
  return folder


def plan(*, model: models.Model, train_dataset_cfg: data_lib.DatasetConfig,
         total_steps: int, model_dir: Any, eval_cfg: Optional[EvalConfig], eval_period: int,
         checkpoint_cfg: CheckpointConfig, initial_checkpoint_path: Optional[str], trainable: str,
         seed: int, log_period: int, dropout_rng: str, seeds: Optional[Sequence[int]],
         tasks: Optional[Sequence[str]], runs: Optional[Sequence[runs_lib.RunSpec]],
         init_note: str = "") -> Plan:
  """Checks the trainer's settings and the directories it would write; returns the `Plan`."""
  if trainable not in (TRAINABLE_PROMPT, TRAINABLE_ALL):
    raise ConfigError(f"TRAINABLE={trainable!r}; valid: 'prompt' (prompt methods) or 'all' "
                      "(model tuning)")
  if trainable == TRAINABLE_PROMPT and not model.has_prompt:
    raise ConfigError("prompt tuning needs a prompt method: add a --gin_file from gin/prompts/ "
                      "(e.g. gin/prompts/prompt_tuning_sampled_vocab.gin), or use "
                      "gin/runs/model_tune.gin")
  check_backbone_kind(model)
  if trainable == TRAINABLE_ALL and model.config.param_dtype not in (None, "float32"):
    raise ConfigError(f"FROZEN_DTYPE={model.config.param_dtype!r} stores the backbone for "
                      "prompt training, but TRAINABLE='all' trains it; use FROZEN_DTYPE="
                      "'float32' (or None) for model tuning")
  train_dataset_cfg = dataclasses.replace(
      train_dataset_cfg, feature_layout=getattr(model, "feature_layout", "encoder_decoder"))
  total_steps = validate.positive_int(total_steps, "TRAIN_STEPS")
  validate.positive_int(eval_period, "EVAL_PERIOD")
  validate.positive_int(log_period, "log_period")
  validate.positive_int(seed, "RANDOM_SEED", minimum=0)
  validate.one_of(dropout_rng, "DROPOUT_RNG", DROPOUT_RNGS)
  cc = checkpoint_cfg
  keep = validate.positive_int(cc.keep, "CHECKPOINTS_TO_KEEP")
  validate.one_of(cc.best_mode, "best_mode", ("max", "min"))
  period = (validate.positive_int(cc.period, "CHECKPOINT_PERIOD") if cc.period is not None
            else eval_period)
  save_steps = _steps("SAVE_PROMPT_STEPS", cc.save_prompt_steps, total_steps)
  embedding_step = (max(1, total_steps // 3) if cc.embedding_step is None
                    else _steps("EMBEDDING_STEP", [cc.embedding_step], total_steps)[0])
  folder = check_model_dir(model_dir)
  run_list, stacked = runs_lib.resolve(str(folder), train_dataset_cfg.mixture_or_task_name,
                                       int(seed), seeds, tasks, runs, init_note)
  if stacked and trainable == TRAINABLE_ALL:
    raise ConfigError("K runs in one step (SEEDS/TASKS) train prompts: use TRAINABLE='prompt'")
  if stacked and keep < 2:
    raise ConfigError(f"CHECKPOINTS_TO_KEEP={keep} with {len(run_list)} runs: keep at least 2, so "
                      f"an interrupted save of the runs' states leaves a step they all saved")
  train_cfgs = [dataclasses.replace(train_dataset_cfg, mixture_or_task_name=r.task, seed=r.seed)
                if stacked else train_dataset_cfg for r in run_list]
  data_lib.import_modules(train_dataset_cfg.module)
  for cfg in train_cfgs:
    data_lib.validate(cfg, model.prompt_length)
    data_lib.get_mixture_or_task(cfg.mixture_or_task_name, cfg.split, "DatasetConfig.split",
                                 ("MIXTURE_OR_TASK_MODULE", train_dataset_cfg.module))
  _check_input_length(model, train_dataset_cfg)
  if eval_cfg is not None:
    data_lib.import_modules(eval_cfg.module)
    data_lib.get_mixture_or_task(eval_cfg.mixture_or_task_name, eval_cfg.split, "EVAL_SPLIT",
                                 ("MIXTURE_OR_TASK_MODULE", eval_cfg.module))
  if initial_checkpoint_path:
    backbone_lib.check_initial_checkpoint(initial_checkpoint_path)
  if stacked:
    runs_lib.check_job(folder, run_list)
  method = describe_method(model.module.prompt)
  projection = getattr(model.module.prompt, "projection_record", None)  # ULPT's frozen P
  if projection is not None:  # by seed, generator and hash; refuses a rank above the width
    method["projection"] = projection(model.config.emb_dim)
  records = [_check_existing_record(run, method) for run in run_list]
  if cc.embedding_step is None and records[0] is not None and records[0].embedding_step:
    embedding_step = min(int(records[0].embedding_step), total_steps)  # a resumed run keeps its own
  vocab = data_lib.get_mixture_or_task(train_dataset_cfg.mixture_or_task_name).output_features
  vocabulary = getattr(vocab.get("inputs") or vocab.get("targets"), "vocabulary", None)
  _check_vocabulary_fits(model, vocabulary, train_dataset_cfg.mixture_or_task_name)
  return Plan(runs=run_list, default_task=train_dataset_cfg.mixture_or_task_name, stacked=stacked,
              model_dir=folder, train_cfgs=train_cfgs, trainable=trainable, total_steps=total_steps,
              log_period=int(log_period), checkpoint_period=period,
              save_prompt_steps=frozenset(save_steps + [embedding_step]),
              embedding_step=embedding_step, checkpoint_cfg=dataclasses.replace(cc, keep=keep),
              vocabulary=vocabulary, task_module=train_dataset_cfg.module, method=method)


def _check_vocabulary_fits(model: Any, vocabulary: Any, task: str) -> None:
  """Refuses a decoder-only run whose task's vocabulary has ids the embedding table has no row
  for (a tokenizer of another model): they would read clamped rows and score no logit."""
  rows = getattr(model.config, "vocab_size", None)
  size = getattr(vocabulary, "vocab_size", None)
  if getattr(model, "kind", "t5") != "decoder" or rows is None or size is None or size <= rows:
    return
  raise ConfigError(f"the task {task}'s vocabulary has {size} ids but the model's embedding table "
                    f"has {rows} rows (vocab_size={rows}); give a task in the model's own "
                    f"tokenizer (at most {rows} ids)")


def _check_existing_record(run: runs_lib.Run, method: Mapping[str, Any]):
  """A run directory that records another task, seed or prompt method is not resumed."""
  record = run.run_dir.read_record()
  if record is None:
    return None
  for what, old, new in (("task", record.task, run.task), ("seed", record.seed, run.seed),
                         ("prompt method", record.method.get("class"), method.get("class"))):
    if old != new:
      raise ConfigError(f"{run.run_dir.path} holds a run of {what} {old!r}, not {new!r}; use a new "
                        f"MODEL_DIR, or the settings that wrote it")
  return record


def check_finite(metrics: Mapping[str, Any], step: int, last_saved: Optional[int],
                 run: Optional[str] = None) -> None:
  """Raises a one-line `ConfigError` when a step's loss, gradient or new parameters are not finite.

  A non-finite gradient or parameter norm means the parameters after `step` are corrupted even
  when the loss was finite, so all three are checked before anything of that step is written.
  `run` names the run of a K-run job.
  """
  for name, what in (("loss", "loss"), ("grad_norm", "gradient norm"),
                     ("param_norm", "parameter norm")):
    value = metrics.get(name)
    if value is not None and not np.isfinite(value):
      kept = (f"the last checkpoint (step {last_saved}) is intact" if last_saved is not None
              else "no checkpoint had been written")
      who = f" of run {run}" if run else ""
      raise ConfigError(f"training diverged: the {what}{who} is {value} at step {step}; nothing "
                        f"from step {step} on was saved and {kept}; lower LEARNING_RATE (or check "
                        f"the data) and restart")
