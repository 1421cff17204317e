"""The demo's runs: K seeded runs per trainer call on the embedded toy T5, read back from run.json.

A `Job` is one `train.train(..., runs=[RunSpec, ...])` call: one prompt method, every seed of
one or more tasks stacked along the trainer's runs axis (one jitted step for all of them). Each
run is an ordinary run directory `<runs_dir>/<method>-<digest>/<task>.seed_<s>` whose `run.json`
(`spot_jax.run_dir.RunRecord`) holds what the demo reports: the task, the seed, the best
validation accuracy (`score`), how the prompt was initialised (`init`) and the task-embedding
step. The digest names the method, the settings and the runs (tasks, seeds, initial prompts), so
a rerun with the same flags finds its finished runs and trains nothing, an interrupted job
resumes from its own checkpoints, and other flags never collide with them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import shutil
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from spot_jax import data as data_lib
from spot_jax import embedded
from spot_jax import models
from spot_jax import prompts
from spot_jax import t5
from spot_jax import train as train_lib
from spot_jax.run_dir import RunDir, RunRecord
from spot_jax.train import evaluator as evaluator_lib
from spot_jax.train import optimizers

# Every method runs by default; "pt" always runs (the baseline of every verdict, and its early
# prompt is the target's task embedding for SPoT's retrieval).
METHODS = ("pt", "spot", "smop", "residual", "spot_unrelated")
# The successors run on request (`--methods=...` or `--methods=all`; `spot_jax.demo.successors`).
SUCCESSORS = ("prefix", "ptuning_v2", "dept", "residual_smop", "attempt", "mpt")
METHOD_NAMES = {"pt": "Prompt Tuning", "spot": "SPoT", "smop": "SMoP 4x5",
                "residual": "Residual PT", "spot_unrelated": "SPoT unrelated",
                "prefix": "Prefix tuning", "ptuning_v2": "P-tuning v2", "dept": "DePT 10+r8",
                "residual_smop": "Residual SMoP 4x5", "attempt": "ATTEMPT", "mpt": "MPT"}
SOURCE = "source"  # the method name of the source prompts' job (Prompt Tuning on the sources)
MPT_SOURCE = "mpt_source"  # the method name of MPT's distillation job (one run on the sources)
# How the progress lines and the job-time table name each job.
JOB_NAMES = {**METHOD_NAMES, SOURCE: "sources", MPT_SOURCE: "MPT distillation"}
TASK_MODULE = "tasks.embedded"
LONGEST_TARGET_INPUT = 37  # tokens of the suite's longest target input
METRIC = "accuracy"


@dataclasses.dataclass(frozen=True)
class Settings:
  """The recipe every run of one demo shares (docs/embedded.md: the sweep that chose it).

  Attributes:
    source_steps: training steps of a source prompt.
    target_steps: training steps of a target prompt (every method).
    prompt_length: tokens of the Prompt Tuning, SPoT and Residual prompts (SMoP: 4 x 5).
    batch_size: training batch size of each run.
    learning_rate: Adafactor's peak learning rate.
    warmup_steps: linear warm-up from 0 to the peak.
    final_learning_rate: linear decay from the peak to this at the last step (None: none;
      with no warm-up either, the constant rate of Prompt Tuning's recipe).
    input_length: target tasks' input length in tokens (`LONGEST_TARGET_INPUT` fits).
    source_input_length: the sources' input length (paraphrase inputs reach 48).
    target_length: output length in tokens (the longest label is 4 tokens and EOS).
    eval_examples: validation examples scored at the end of every run.
    embedding_step: the step whose prompt is a run's task embedding (sources and targets).
  """
  source_steps: int = 80
  target_steps: int = 40
  prompt_length: int = 10
  batch_size: int = 8
  learning_rate: float = 0.3
  warmup_steps: int = 6
  final_learning_rate: Optional[float] = 0.03
  input_length: int = LONGEST_TARGET_INPUT
  source_input_length: int = 48
  target_length: int = 6
  eval_examples: int = 200
  embedding_step: int = 10


@dataclasses.dataclass(frozen=True)
class Member:
  """One run of a job.

  Attributes:
    task: a key of `tasks.embedded.TASKS` (its taskless variant is trained).
    seed: the run's seed (prompt initialisation and data order).
    init: the initial prompt [L, E] (SPoT), or None for the method's own initialiser.
    init_note: how `init` was chosen (kept in run.json's `init`).
  """
  task: str
  seed: int
  init: Optional[np.ndarray] = dataclasses.field(default=None, compare=False)
  init_note: str = ""

  @property
  def name(self) -> str:
    return f"{self.task}.seed_{self.seed}"


@dataclasses.dataclass(frozen=True)
class Outcome:
  """A finished run, as its run.json records it."""
  task: str
  seed: int
  method: str
  accuracy: Optional[float]
  init: str
  run_dir: str


def sampled_vocab_rows() -> int:
  """The rows of the toy vocabulary the sampled-vocabulary initialiser draws from (its pieces,
  not the sentinels)."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  return suite.get_vocabulary().vocab_size - suite.EXTRA_IDS


def learning_rate_schedule(settings: Settings, steps: int):
  """The constant rate, or warm-up then linear decay over `steps`."""
  if not settings.warmup_steps and settings.final_learning_rate is None:
    return settings.learning_rate
  final = settings.learning_rate if settings.final_learning_rate is None else settings.final_learning_rate
  warmup = min(settings.warmup_steps, steps - 1)
  return optimizers.warmup_linear_decay(settings.learning_rate, warmup, max(steps - warmup, 1),
                                        end_value=final)


def _prompt_module(method: str, settings: Settings, vocab_rows: int):
  sampled = prompts.sampled_vocab(num_most_frequent=vocab_rows)
  if method in ("pt", SOURCE, "spot", "spot_unrelated"):  # SPoT: each run's RunSpec.prompt_init
    return prompts.PromptTuning(length=settings.prompt_length, prompt_init=sampled)
  if method == "smop":
    return prompts.SMoP(num_prompts=4, length=5, prompt_init=sampled)
  if method == "residual":
    return prompts.ResidualPrompt(length=settings.prompt_length, bottleneck=128, prompt_init=sampled)
  raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")


def _plain_model(module: t5.Transformer) -> models.EncoderDecoderModel:
  return models.EncoderDecoderModel(module=module)


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a job trains besides its runs and the recipe (`plan` for the default methods; the
  successors' in `spot_jax.demo.successors`).

  Attributes:
    prompt: the prompt module every run of the job trains.
    optimizer: learning-rate schedule -> optax transformation.
    key: more content for the job's digest (a successor's recipe, its frozen sources' digest).
    model: the backbone module -> the trained model (MPT's distillation student wraps it).
    train_task: the training task or mixture of a single-run job (None: each run's own task).
    task_names: the mixture's tasks, for the `task_index` feature (None: no such feature).
    evaluate: evaluate every run at its end and keep the best (False: the last state, no score).
  """
  prompt: Any
  optimizer: Callable[[Any], Any] = lambda lr: optimizers.adafactor(learning_rate=lr)
  key: Optional[Mapping[str, Any]] = None
  model: Callable[[t5.Transformer], models.EncoderDecoderModel] = _plain_model
  train_task: Optional[str] = None
  task_names: Optional[Sequence[str]] = None
  evaluate: bool = True


def plan(method: str, settings: Settings, vocab_rows: int) -> Plan:
  """The default methods' plan: their prompt module and Adafactor."""
  return Plan(prompt=_prompt_module(method, settings, vocab_rows))


def build_model(method: str, settings: Settings, vocab_rows: int,
                job_plan: Optional[Plan] = None) -> models.EncoderDecoderModel:
  """The frozen toy T5 with the method's prompt (dropout off)."""
  job_plan = job_plan or plan(method, settings, vocab_rows)
  config = t5.config_by_name(embedded.CONFIG_NAME, dropout_rate=0.0)
  return job_plan.model(t5.Transformer(config, prompt=job_plan.prompt))


def array_digest(array: np.ndarray) -> str:
  """SHA-256 of the array as contiguous float32 (what names an initial prompt in a job's key)."""
  return hashlib.sha256(np.ascontiguousarray(array, np.float32).tobytes()).hexdigest()


def job_dir(runs_dir: pathlib.Path, method: str, settings: Settings,
            members: Sequence[Member], extra: Optional[Mapping[str, Any]] = None) -> pathlib.Path:
  """<runs_dir>/<method>-<digest of the settings, the runs, their initial prompts and `extra`>."""
  key = {"method": method, "settings": dataclasses.asdict(settings),
         "runs": [[m.task, m.seed, m.init_note, None if m.init is None else array_digest(m.init)]
                  for m in members]}
  if extra:  # absent for the default methods: their digests stay those of earlier demos
    key["plan"] = dict(extra)
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
  return runs_dir / f"{method}-{digest}"


def _finished(path: pathlib.Path, members: Sequence[Member], steps: int,
              scored: bool = True) -> Optional[list[RunRecord]]:
  """Every member's record when all finished `steps` steps (with a score if `scored`), else None."""
  records = []
  for m in members:
    record = RunDir(path / m.name).read_record()
    if record is None or not record.finished or record.train_steps != steps \
        or (scored and record.score is None):
      return None
    records.append(record)
  return records


@dataclasses.dataclass
class JobResult:
  """A job's outcomes (member order) and its wall time in this process (None: reused)."""
  path: pathlib.Path
  outcomes: list[Outcome]
  seconds: Optional[float]


def run_job(method: str, members: Sequence[Member], settings: Settings, runs_dir: pathlib.Path,
            vocab_rows: int, fresh: bool = False, job_plan: Optional[Plan] = None,
            log: Callable[[str], None] = lambda line: None) -> JobResult:
  """Trains `members` as K runs in one trainer call (or reuses them); returns their records.

  Args:
    method: one of METHODS, a successor's name, or SOURCE (Prompt Tuning on source tasks).
    members: the runs; every run keeps its own seed, task, data stream and directory.
    settings: the recipe.
    runs_dir: the parent of the job directory.
    vocab_rows: the vocabulary rows the sampled-vocabulary initialiser draws from.
    fresh: delete the job's directory first.
    job_plan: the prompt, optimizer and model (None: `plan(method, ...)`).
    log: progress lines.
  """
  job_plan = job_plan or plan(method, settings, vocab_rows)
  path = job_dir(runs_dir, method, settings, members, job_plan.key)
  source = method == SOURCE or job_plan.train_task is not None
  steps = settings.source_steps if source else settings.target_steps
  if fresh and path.exists():
    shutil.rmtree(path)
  records = _finished(path, members, steps, scored=job_plan.evaluate)
  seconds = None
  if records is None:
    started = time.time()
    _train(job_plan, members, settings, path, steps, source, vocab_rows, method)
    seconds = time.time() - started
    records = _finished(path, members, steps, scored=job_plan.evaluate)
    if records is None:
      raise RuntimeError(f"{path}: the trainer returned without recording every run as finished")
  outcomes = [Outcome(m.task, m.seed, method, None if r.score is None else round(float(r.score), 2),
                      r.init, str(path / m.name)) for m, r in zip(members, records)]
  return JobResult(path, outcomes, seconds)


def _train(job_plan: Plan, members: Sequence[Member], settings: Settings, path: pathlib.Path,
           steps: int, source: bool, vocab_rows: int, method: str) -> None:
  """One trainer call: the members as K runs of one jitted step."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  lengths = {"inputs": settings.source_input_length if source else settings.input_length,
             "targets": settings.target_length}
  # Runs starting from the same prompt share one initialiser: the trainer compiles the prompt's
  # initialisation once per initialiser, not once per run.
  inits = {}
  for m in members:
    if m.init is not None:
      inits.setdefault(array_digest(m.init), prompts.from_array(m.init, source=m.init_note))
  specs = [train_lib.RunSpec(
      m.seed, job_plan.train_task or suite.task_name(m.task, taskless=True), name=m.name,
      prompt_init=None if m.init is None else inits[array_digest(m.init)],
      init_note=m.init_note or "sampled vocabulary") for m in members]
  first = specs[0].task
  eval_cfg = None
  if job_plan.evaluate:
    eval_cfg = evaluator_lib.EvalConfig(first, lengths, split="validation", batch_size=100,
                                        num_examples=settings.eval_examples, module=TASK_MODULE)
  train_lib.train(
      model=build_model(method, settings, vocab_rows, job_plan),
      train_dataset_cfg=data_lib.DatasetConfig(first, lengths, batch_size=settings.batch_size,
                                               module=TASK_MODULE, task_names=job_plan.task_names),
      total_steps=steps, model_dir=str(path),
      optimizer=job_plan.optimizer(learning_rate_schedule(settings, steps)),
      eval_cfg=eval_cfg, eval_period=steps,
      checkpoint_cfg=train_lib.CheckpointConfig(
          period=steps, best_metric=METRIC if job_plan.evaluate else None,
          embedding_step=min(settings.embedding_step, steps)),
      initial_checkpoint_path=embedded.CHECKPOINT_PATH, verbose=False, runs=specs)
