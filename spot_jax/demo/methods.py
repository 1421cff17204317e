"""The demo's methods and recipe, as jobs of the experiment runner on the embedded toy T5.

Each job is one `spot_jax.experiment.run` call: one prompt method (`recipe`), every seed of one
or more tasks as K runs of one jitted step. Each run is an ordinary run directory
`<runs_dir>/<method>-<digest>/<task>.seed_<s>` whose `run.json` holds what the demo reports:
the task, the seed, the best validation accuracy, how the prompt was initialised and the
task-embedding step; a target with class labels is scored by rank classification instead
(`rank_classification.json` beside it, `with_rank_classification`). The digest (`job_dir`)
names the method, the settings and the runs (tasks, seeds, initial prompts), so a rerun with the
same flags finds its finished runs and trains nothing, an interrupted job resumes from its own
checkpoints, and other flags never collide.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from spot_jax import embedded
from spot_jax import fileio
from spot_jax import experiment
from spot_jax import models
from spot_jax import prompts
from spot_jax.backbones import kinds
from spot_jax.backbones import t5
from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.experiment import Recipe, RunOutcome, RunRequest
from spot_jax.train import optimizers

# Every method runs by default; "pt" always runs (the baseline of every verdict, and its early
# prompt is the target's task embedding for SPoT's retrieval).
METHODS = ("pt", "spot", "smop", "residual", "spot_unrelated")
# The successors run on request (`--methods=...` or `--methods=all`;
# `spot_jax.demo.successor_methods`).
DEFAULT_SEEDS = 20  # what the 5-minute budget allows; `--claims` runs the power analysis' count
# The demo's targets: the suite's, less sum, where no method lifts a prompt trained on 32 examples
# for 20 steps above about 24% (a floor that compares nothing, at the most labels to score).
DEFAULT_TARGETS = ("sentiment_travel", "sentiment_sports", "category")
SUCCESSORS = ("prefix", "ptuning_v2", "dept", "residual_smop", "attempt", "mpt", "ulpt")
# Prompt Tuning on the int8-quantized backbone (QUANTIZATION, needs qwix): runs when named.
QUANTIZED = {"pt_int8": "int8"}
METHOD_NAMES = {"pt": "Prompt Tuning", "spot": "SPoT", "smop": "SMoP 4x5",
                "residual": "Residual PT", "spot_unrelated": "SPoT unrelated",
                "prefix": "Prefix tuning", "ptuning_v2": "P-tuning v2", "dept": "DePT 10+r8",
                "residual_smop": "Residual SMoP 4x5", "attempt": "ATTEMPT", "mpt": "MPT",
                "ulpt": "ULPT r8", "pt_int8": "PT, int8 backbone"}
SOURCE = "source"  # the method name of the source prompts' job (Prompt Tuning on the sources)
MPT_SOURCE = "mpt_source"  # the method name of MPT's distillation job (one run on the sources)
# How the progress lines and the job-time table name each job.
JOB_NAMES = {**METHOD_NAMES, SOURCE: "sources", MPT_SOURCE: "MPT distillation"}
TASK_MODULE = "tasks.embedded"
LONGEST_TARGET_INPUT = 37  # tokens of the suite's longest target input
# --backbone: the embedded toy T5 (the default) or the embedded toy decoder (Llama-style); the
# decoder runs the default methods (the successors' recipes are the encoder-decoder's).
BACKBONES = {"t5": "toy T5 (t5_1_1_toy)", "decoder": "toy decoder (decoder_toy)"}
LOW_RESOURCE = 32  # a target's training examples by default (tasks.embedded.LOW_RESOURCE)
METRIC = "accuracy"


@dataclasses.dataclass(frozen=True)
class Settings:
  """The recipe every run of one demo shares (docs/embedded.md, "The recipe").

  Attributes:
    source_steps: training steps of a source prompt.
    target_steps: training steps of a target prompt (every method).
    train_examples: a target's training examples, the first ones of its train split (the
      low-resource regime where SPoT's paper finds transfer matters most; None: all 4,000).
    prompt_length: tokens of the Prompt Tuning, SPoT and Residual prompts (SMoP: 4 x 5).
    batch_size: training batch size of each run.
    learning_rate: Adafactor's peak learning rate.
    warmup_steps: linear warm-up from 0 to the peak.
    final_learning_rate: linear decay from the peak to this at the last step (None: none;
      with no warm-up either, the constant rate of Prompt Tuning's recipe).
    input_length: target tasks' input length in tokens (`LONGEST_TARGET_INPUT` fits).
    source_input_length: the sources' input length (paraphrase inputs reach 48).
    target_length: output length in tokens (the longest label is 4 tokens and EOS).
    eval_examples: validation examples greedy decoding scores at the end of a run whose task
      has no class labels (the sources; a target whose answer is composed, such as sum).
    rank_examples: validation examples rank classification scores for a target with class
      labels (`spot_jax.experiment.rank`; such runs are not decoded).
    embedding_step: the step whose prompt is a run's task embedding (sources and targets).
    backbone: the frozen model, a key of BACKBONES.
  """
  source_steps: int = 80
  target_steps: int = 20
  train_examples: Optional[int] = LOW_RESOURCE
  prompt_length: int = 10
  batch_size: int = 8
  learning_rate: float = 0.3
  warmup_steps: int = 6
  final_learning_rate: Optional[float] = 0.03
  input_length: int = LONGEST_TARGET_INPUT
  source_input_length: int = 48
  target_length: int = 6
  eval_examples: int = 200
  # At 1,000 examples the evaluation sample is 2.5% of a run's variance on the targets' mean
  # (`python -m spot_jax.demo.noise`); 500 keep it near 5% and leave the time for twice the seeds.
  rank_examples: int = 500
  embedding_step: int = 10
  backbone: str = "t5"


def settings_from_flags(args: Any, names: Sequence[str], **changes: Any) -> Settings:
  """The demo's Settings with `changes`, then each of the command-line flags `names` that was
  given (a positive integer, or one line saying it is not)."""
  for name in names:
    if getattr(args, name) is not None:
      changes[name] = validate.positive_int(getattr(args, name), f"--{name}")
  return dataclasses.replace(Settings(), **changes)


def output_folders(output_dir: str, backbone: str = "t5") -> tuple[pathlib.Path, pathlib.Path]:
  """(--output_dir, its runs/ folder), made after checking that the embedded toy model exists."""
  path, program = ((embedded.DECODER_CHECKPOINT_PATH, "pretrain_decoder") if backbone == "decoder"
                   else (embedded.CHECKPOINT_PATH, "pretrain"))
  if not os.path.isdir(path):
    raise ConfigError(f"the embedded toy model is missing at {path}; "
                      f"make it with `python -m spot_jax.embedded.{program}`")
  out = fileio.writable_dir(output_dir, "--output_dir")
  runs_dir = out / "runs"
  runs_dir.mkdir(exist_ok=True)
  return out, runs_dir


def sampled_vocab_rows() -> int:
  """The rows of the toy vocabulary the sampled-vocabulary initialiser draws from (its pieces,
  not the sentinels)."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  return suite.get_vocabulary().vocab_size - suite.EXTRA_IDS


def learning_rate_schedule(settings: Settings, steps: int):
  """The constant rate, or warm-up then linear decay over `steps`."""
  if not settings.warmup_steps and settings.final_learning_rate is None:
    return settings.learning_rate
  final = (settings.learning_rate if settings.final_learning_rate is None
           else settings.final_learning_rate)
  warmup = min(settings.warmup_steps, steps - 1)
  return optimizers.warmup_linear_decay(settings.learning_rate, warmup, max(steps - warmup, 1),
                                        end_value=final)


def _prompt_module(method: str, settings: Settings, vocab_rows: int):
  sampled = prompts.sampled_vocab(num_most_frequent=vocab_rows)
  # SPoT: each run's RunSpec.prompt_init
  if method in ("pt", SOURCE, "spot", "spot_unrelated", *QUANTIZED):
    return prompts.PromptTuning(length=settings.prompt_length, prompt_init=sampled)
  if method == "smop":
    return prompts.SMoP(num_prompts=4, length=5, prompt_init=sampled)
  if method == "residual":
    return prompts.ResidualPrompt(length=settings.prompt_length, bottleneck=128,
                                  prompt_init=sampled)
  raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")


def _plain_model(module: Any) -> Any:
  if kinds.kind_of(module.config) == "decoder":
    return models.DecoderOnlyModel(module=module)
  return models.EncoderDecoderModel(module=module)


def backbone_module(backbone: str, prompt: Any, quantization: str = "none") -> tuple[Any, str]:
  """(the embedded `backbone`'s network under `prompt`, dropout off, its kernels quantized as
  `quantization` says; its checkpoint path)."""
  if backbone == "decoder":
    from spot_jax.backbones.decoder.network import DecoderLM  # pylint: disable=g-import-not-at-top
    from spot_jax.embedded import decoder_config  # pylint: disable=g-import-not-at-top
    return (DecoderLM(decoder_config.toy_config(quantization=quantization), prompt=prompt),
            embedded.DECODER_CHECKPOINT_PATH)
  config = t5.config_by_name(embedded.CONFIG_NAME, dropout_rate=0.0, quantization=quantization)
  return t5.Transformer(config, prompt=prompt), embedded.CHECKPOINT_PATH


def _adafactor(learning_rate) -> Any:
  return optimizers.adafactor(learning_rate=learning_rate)


def recipe(method: str, settings: Settings, vocab_rows: int, *, prompt: Any = None,
           optimizer: Callable[[Any], Any] = _adafactor,
           model: Callable[[Any], Any] = _plain_model,
           source: bool = False, evaluate: bool = True, task_names: Optional[Sequence[str]] = None,
           key: Optional[Mapping[str, Any]] = None) -> Recipe:
  """A job's recipe: `method`'s prompt on the frozen embedded backbone (`settings.backbone`,
  dropout off) with the demo's settings.

  Args:
    method: one of METHODS, a successor's name, SOURCE or MPT_SOURCE (names the job).
    settings: the demo's settings.
    vocab_rows: the vocabulary rows the sampled-vocabulary initialiser draws from.
    prompt: the prompt module (None: the default method's own).
    optimizer: learning-rate schedule -> optax transformation.
    model: the backbone module -> the trained model (MPT's distillation student wraps it).
    source: train on source tasks: the source steps and input length.
    evaluate: evaluate every run at its end and keep the best (False: the last state, no score).
    task_names: a mixture's tasks, for the `task_index` feature.
    key: more content for the job's digest (a successor's settings, its frozen sources' digest).
  """
  steps = settings.source_steps if source else settings.target_steps
  module, checkpoint = backbone_module(
      settings.backbone, _prompt_module(method, settings, vocab_rows) if prompt is None else prompt,
      QUANTIZED.get(method, "none"))
  inputs = settings.source_input_length if source else settings.input_length
  return Recipe(
      name=method, model=model(module),
      optimizer=optimizer(learning_rate_schedule(settings, steps)), steps=steps,
      lengths={"inputs": inputs, "targets": settings.target_length},
      batch_size=settings.batch_size, task_module=TASK_MODULE,
      initial_checkpoint_path=checkpoint, metric=METRIC if evaluate else None,
      eval_period=steps, eval_batch_size=100, eval_num_examples=settings.eval_examples,
      checkpoint_period=steps, embedding_step=min(settings.embedding_step, steps),
      task_names=task_names, key=key)


def request(task: str, seed: int, init: Optional[np.ndarray] = None, init_note: str = "",
            train_examples: Optional[int] = None) -> RunRequest:
  """A run of the suite's task `task` (a key of `tasks.embedded.TASKS`: its taskless variant,
  trained on its first `train_examples` train examples; None: all)."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  return RunRequest(suite.task_name(task, taskless=True, train_examples=train_examples), seed,
                    label=task, init=init, init_note=init_note)


def accuracy(outcome: RunOutcome) -> Optional[float]:
  """A run's validation accuracy as the demo reports it (%, 2 decimals; None: not evaluated):
  rank classification's when it has one, else greedy decoding's."""
  score = outcome.score if outcome.rank_accuracy is None else outcome.rank_accuracy
  return None if score is None else round(float(score), 2)


def with_rank_classification(job_recipe: Recipe, requests: Sequence[RunRequest],
                             settings: Settings) -> Recipe:
  """A target job's recipe scoring its class-label targets by rank classification on
  `settings.rank_examples` examples; greedy decoding stays only for open-ended targets (none:
  no decoding). Sources and recipes without evaluation are returned as they are."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  if job_recipe.name == SOURCE or not job_recipe.evaluate:
    return job_recipe
  labels = {r.label: suite.TASKS[r.label].classes for r in requests
            if r.label in suite.TASKS and suite.TASKS[r.label].classes}
  if not labels:
    return job_recipe
  open_ended = {r.label for r in requests} - set(labels)
  return dataclasses.replace(job_recipe, class_labels=labels,
                             rank_examples=settings.rank_examples,
                             metric=job_recipe.metric if open_ended else None)


def array_digest(array: np.ndarray) -> str:
  """SHA-256 of the array as contiguous float32 (what names an initial prompt in a job's key)."""
  return hashlib.sha256(np.ascontiguousarray(array, np.float32).tobytes()).hexdigest()


def job_dir(runs_dir: pathlib.Path, settings: Settings, job_recipe: Recipe,
            requests: Sequence[RunRequest]) -> pathlib.Path:
  """<runs_dir>/<method>-<digest of the settings, the runs, their initial prompts and the
  recipe's key>."""
  named = dataclasses.asdict(settings)
  if named["backbone"] == "t5":  # the toy T5's digests stay those of the demos before --backbone
    del named["backbone"]
  key = {"method": job_recipe.name, "settings": named,
         "runs": [[r.label, r.seed, r.init_note, None if r.init is None else array_digest(r.init)]
                  for r in requests]}
  if job_recipe.key:  # absent for the default methods: their digests stay those of earlier demos
    key["plan"] = dict(job_recipe.key)
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
  return runs_dir / f"{job_recipe.name}-{digest}"


def run_job(job_recipe: Recipe, requests: Sequence[RunRequest], settings: Settings,
            runs_dir: pathlib.Path, fresh: bool = False) -> experiment.JobResult:
  """Trains `requests` as K runs of `job_recipe` in `job_dir` (or reuses them); class-label
  targets are scored by rank classification (`with_rank_classification`)."""
  return experiment.run(with_rank_classification(job_recipe, requests, settings),
                        job_dir(runs_dir, settings, job_recipe, requests), requests, fresh=fresh)
