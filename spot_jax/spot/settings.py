"""What every run of the SPoT layer shares: the frozen model, the data lengths and the budgets,
and the experiment recipe (`recipe`) its runs train with.

Each command line (`spot_jax.library`, `spot_jax.retrieve`, `spot_jax.study`) takes the same
flags, so the same study runs on a tiny test model, the embedded toy T5 or T5.1.1 XXL by
changing only `--model`, `--checkpoint` and the task names (`spot_jax.cli.flags`):

  --model=gin/models/t5_1_1_lm100k_base.gin   (a gin model file providing MODEL, or a config
                                               name such as t5_1_1_byte_tiny)
  --model_binding="DROPOUT_RATE=0.0"          (gin bindings for the model file, repeatable)
  --checkpoint=/ckpts/...                     (the frozen backbone; omit: random, tests only)
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Mapping, Optional, Sequence

from spot_jax import experiment
from spot_jax import models
from spot_jax import prompts
from spot_jax import validate
from spot_jax.cli import flags
from spot_jax.cli import model_flag
from spot_jax.errors import ConfigError
from spot_jax import backbone as backbone_lib
from spot_jax.train import optimizers


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """Shared settings of the prompt-tuning runs this layer makes.

  Attributes:
    model: the backbone model (its `module.prompt` is None; each run adds its prompt).
    model_name: the --model value, for records.
    initial_checkpoint_path: the frozen backbone (None: random, from the run seed).
    task_module: module(s) registering the tasks (MIXTURE_OR_TASK_MODULE).
    lengths: {"inputs": T, "targets": S} (prompt excluded).
    batch_size: training batch size.
    train_steps: steps of every full run.
    embedding_step: the early step whose prompt is the task embedding (SAVE_PROMPT_STEPS).
    eval_period: steps between validation evaluations (the best one is kept).
    checkpoint_period: steps between training-state checkpoints (None: eval_period).
    eval_batch_size: evaluation batch size.
    eval_num_examples: validation examples per evaluation (None: all).
    prompt_length: L of the Prompt Tuning prompts.
    learning_rate: Adafactor learning rate (Prompt Tuning: 0.3).
    metric: the validation metric selecting the best prompt, e.g. "accuracy".
    task_metrics: per-task overrides of `metric`.
    metric_max: the metric's best possible value (errors are metric_max - score).
    fingerprint: the frozen model's fingerprint (see `spot_jax/backbone.py`), for seed 0.
  """
  model: models.EncoderDecoderModel
  model_name: str
  initial_checkpoint_path: Optional[str]
  task_module: str
  lengths: Mapping[str, int]
  batch_size: int = 32
  train_steps: int = 30000
  embedding_step: int = 10000
  eval_period: int = 1000
  checkpoint_period: Optional[int] = None
  eval_batch_size: int = 32
  eval_num_examples: Optional[int] = None
  prompt_length: int = 100
  learning_rate: float = 0.3
  metric: str = "accuracy"
  task_metrics: Mapping[str, str] = dataclasses.field(default_factory=dict)
  metric_max: float = 100.0
  fingerprint: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    for name in ("batch_size", "train_steps", "embedding_step", "eval_period", "prompt_length"):
      validate.positive_int(getattr(self, name), f"--{name}")
    validate.positive_int(self.checkpoint_period, "--checkpoint_period", optional=True)
    if self.embedding_step > self.train_steps:
      raise ConfigError(f"--embedding_step={self.embedding_step} is after the end of training "
                        f"(--train_steps={self.train_steps}); give a step <= train_steps")

  @property
  def embed_dim(self) -> int:
    return int(self.model.config.emb_dim)

  def metric_for(self, task: str) -> str:
    return self.task_metrics.get(task, self.metric)

  def fingerprint_for(self, seed: int) -> dict[str, str]:
    """The backbone's fingerprint for a run of `seed` (a random backbone depends on the seed)."""
    if self.initial_checkpoint_path:
      return dict(self.fingerprint)
    return backbone_lib.fingerprint(self.model.config, None, seed)


def model_fingerprint(model: models.EncoderDecoderModel, checkpoint: Optional[str],
                      seed: int = 0) -> dict[str, str]:
  if checkpoint:
    backbone_lib.check_initial_checkpoint(checkpoint)
  return backbone_lib.fingerprint(model.config, checkpoint, seed)


def prompt_module(settings: RunSettings, smop: Optional[Mapping[str, int]] = None) -> Any:
  """Prompt Tuning of `settings.prompt_length` from sampled vocabulary, or SMoP.

  Args:
    smop: {"num_prompts": k, "length": l} to train SMoP instead.
  """
  start = prompts.sampled_vocab(num_most_frequent=min(5000, settings.model.config.vocab_size))
  if smop is not None:
    return prompts.SMoP(num_prompts=int(smop["num_prompts"]), length=int(smop["length"]),
                        prompt_init=start)
  return prompts.PromptTuning(length=settings.prompt_length, prompt_init=start)


def recipe(settings: RunSettings, task: str, *, smop: Optional[Mapping[str, int]] = None,
           evaluate: bool = True, backbone_seed: int = 0) -> experiment.Recipe:
  """The experiment recipe of this layer's runs of `task` (its metric selects the best prompt).

  Args:
    settings: the shared settings (the runs train `settings.train_steps` steps).
    task: the task whose metric the runs are evaluated with (K runs: every run's).
    smop: train SMoP with these settings instead of Prompt Tuning.
    evaluate: evaluate on the validation split and keep the best prompt (mixtures: False).
    backbone_seed: the random backbone's seed of a K-run job when there is no checkpoint.
  """
  prompt = prompt_module(settings, smop)
  model = dataclasses.replace(settings.model, module=settings.model.module.clone(prompt=prompt))
  return experiment.Recipe(
      name="prompt_tuning" if smop is None else "smop", model=model,
      optimizer=optimizers.adafactor(learning_rate=settings.learning_rate),
      steps=settings.train_steps, lengths=dict(settings.lengths), batch_size=settings.batch_size,
      task_module=settings.task_module, initial_checkpoint_path=settings.initial_checkpoint_path,
      backbone_seed=backbone_seed, metric=settings.metric_for(task) if evaluate else None,
      eval_period=settings.eval_period, eval_batch_size=settings.eval_batch_size,
      eval_num_examples=settings.eval_num_examples, checkpoint_period=settings.checkpoint_period,
      embedding_step=settings.embedding_step)


def check_tasks(task_names: Sequence[str], module: str) -> None:
  """A one-line error naming the first unregistered task (with close names)."""
  from spot_jax import data as data_lib  # pylint: disable=g-import-not-at-top
  data_lib.import_modules(module)
  for name in task_names:
    data_lib.get_mixture_or_task(name)


def add_flags(parser: argparse.ArgumentParser, seed: bool = False) -> None:
  """The backbone, data, budget and metric flags of the SPoT layer's runs (study, retrieve);
  `from_flags` reads them."""
  flags.add_backbone(parser, seed=seed, seed_help="seed of the runs (and of the random backbone "
               "without --checkpoint)")
  parser.add_argument("--task_module", default="tasks",
                      help="module(s) registering the tasks, comma-separated (default: tasks)")
  flags.add_lengths(parser, 512, 16)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--train_steps", type=int, default=30000)
  parser.add_argument("--embedding_step", type=int, default=10000,
                      help="the early step whose prompt is the task embedding")
  parser.add_argument("--eval_period", type=int, default=1000)
  parser.add_argument("--checkpoint_period", type=int, default=None,
                      help="steps between checkpoints (default: --eval_period)")
  parser.add_argument("--eval_batch_size", type=int, default=32)
  parser.add_argument("--eval_num_examples", type=int, default=None)
  parser.add_argument("--prompt_length", type=int, default=100)
  parser.add_argument("--learning_rate", type=float, default=0.3)
  parser.add_argument("--metric", default="accuracy",
                      help="validation metric selecting the best prompt (default: accuracy)")
  parser.add_argument("--task_metric", action="append", default=[],
                      help="per-task metric, TASK=METRIC (repeatable), e.g. "
                           "spot_glue_stsb_v200=pearson_corrcoef")
  parser.add_argument("--metric_max", type=float, default=100.0,
                      help="best possible metric value (errors are metric_max - score)")


def from_flags(args: argparse.Namespace) -> RunSettings:
  """`RunSettings` from the `add_flags` flags, each checked by name."""
  for flag in ("input_length", "target_length", "batch_size", "eval_batch_size"):
    validate.positive_int(getattr(args, flag), f"--{flag}", optional=True)
  validate.positive_int(args.eval_num_examples, "--eval_num_examples", optional=True)
  for flag in ("learning_rate", "metric_max"):
    validate.positive(getattr(args, flag), f"--{flag}", finite=False)
  validate.positive_int(args.prompt_length, "--prompt_length", optional=True)
  if args.input_length < args.prompt_length:
    raise ConfigError(f"--input_length={args.input_length} is shorter than --prompt_length="
                      f"{args.prompt_length}; the input length counts real tokens only and must be "
                      f"at least the prompt length")
  task_metrics = flags.pairs("--task_metric", args.task_metric,
                             "spot_glue_stsb_v200=pearson_corrcoef")
  model, name = model_flag.load_model(args.model, args.model_binding)
  return RunSettings(
      model=model, model_name=name, initial_checkpoint_path=args.checkpoint,
      task_module=args.task_module,
      lengths={"inputs": args.input_length, "targets": args.target_length},
      batch_size=args.batch_size, train_steps=args.train_steps,
      embedding_step=args.embedding_step, eval_period=args.eval_period,
      checkpoint_period=args.checkpoint_period,
      eval_batch_size=args.eval_batch_size, eval_num_examples=args.eval_num_examples,
      prompt_length=args.prompt_length, learning_rate=args.learning_rate, metric=args.metric,
      task_metrics=task_metrics, metric_max=args.metric_max,
      fingerprint=model_fingerprint(model, args.checkpoint, 0))
