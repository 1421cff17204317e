"""The demo's runs: each one an ordinary `trainer.train` run on the embedded toy T5.

A `RunSpec` names a task and a prompt method; `execute` trains it in its own run directory
(checkpoints, exported prompts, TensorBoard, evaluation outputs, as any trainer run) and writes
`demo_result.json` there when it finishes. A rerun of the demo reuses a run directory whose
`demo_result.json` matches the spec, so finished runs are not trained twice (`--fresh` deletes
them first).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import time
from typing import Optional

from spot_jax import data as data_lib
from spot_jax import embedded
from spot_jax.train import evaluator as evaluator_lib
from spot_jax import models
from spot_jax.train import optimizers
from spot_jax import prompts
from spot_jax import t5
from spot_jax import train as train_lib

METHODS = ("pt", "spot", "smop", "residual")
# A control, not run by default: SPoT started from an unrelated source's prompt.
EXTRA_METHODS = ("spot_unrelated",)
METHOD_NAMES = {"pt": "Prompt Tuning", "spot": "SPoT", "smop": "SMoP 4x5",
                "residual": "Residual PT", "spot_unrelated": "SPoT (unrelated source)"}
TASK_MODULE = "tasks.embedded"
RESULT_FILE = "demo_result.json"


@dataclasses.dataclass(frozen=True)
class Settings:
  """What every run of one demo shares.

  Attributes:
    source_steps: training steps of a source prompt.
    target_steps: training steps of a target prompt (every method).
    prompt_length: tokens of the Prompt Tuning, SPoT and Residual prompts (SMoP: 4 x 5).
    batch_size: training batch size.
    learning_rate: Adafactor's constant learning rate (Prompt Tuning's recipe).
    input_length, target_length: task feature lengths in tokens (prompt excluded).
    eval_examples: validation examples scored at the end of a run.
    seed: seed of every run (prompt initialisation and data order).
  """
  source_steps: int = 200
  target_steps: int = 100
  prompt_length: int = 20
  batch_size: int = 16
  learning_rate: float = 0.3
  input_length: int = 48
  target_length: int = 8
  eval_examples: int = 200
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One run.

  Attributes:
    task: a key of `tasks.embedded.TASKS` (its taskless variant is trained).
    method: one of METHODS.
    role: "source" or "target".
    init_from: SPoT only: the source run directory whose exported prompt starts this one.
      ("spot_unrelated": the first of tasks.embedded.UNRELATED[task], a control).
  """
  task: str
  method: str
  role: str
  init_from: Optional[str] = None

  @property
  def name(self) -> str:
    return f"source_{self.task}" if self.role == "source" else f"{self.task}_{self.method}"


def _prompt_module(spec: RunSpec, settings: Settings, vocab_rows: int):
  sampled = prompts.sampled_vocab(num_most_frequent=vocab_rows)
  if spec.method == "pt":
    return prompts.PromptTuning(length=settings.prompt_length, prompt_init=sampled)
  if spec.method in ("spot", "spot_unrelated"):
    path = prompts.exported_prompt_path(spec.init_from)
    return prompts.PromptTuning(length=settings.prompt_length, prompt_init=prompts.from_file(path))
  if spec.method == "smop":
    return prompts.SMoP(num_prompts=4, length=5, prompt_init=sampled)
  if spec.method == "residual":
    return prompts.ResidualPrompt(length=settings.prompt_length, bottleneck=128, prompt_init=sampled)
  raise ValueError(f"unknown method {spec.method!r}; valid: {', '.join(METHODS + EXTRA_METHODS)}")


def build_model(spec: RunSpec, settings: Settings, vocab_rows: int) -> models.EncoderDecoderModel:
  """The frozen toy T5 with the run's prompt method (dropout off)."""
  config = t5.config_by_name(embedded.CONFIG_NAME, dropout_rate=0.0)
  return models.EncoderDecoderModel(
      module=t5.Transformer(config, prompt=_prompt_module(spec, settings, vocab_rows)))


def _fingerprint(spec: RunSpec, settings: Settings) -> dict:
  return {"spec": dataclasses.asdict(spec), "settings": dataclasses.asdict(settings)}


def finished_result(run_dir: pathlib.Path, spec: RunSpec, settings: Settings) -> Optional[dict]:
  """The recorded result of a finished run with the same spec and settings, else None."""
  try:
    result = json.loads((run_dir / RESULT_FILE).read_text())
  except (OSError, ValueError):
    return None
  return result if result.get("fingerprint") == _fingerprint(spec, settings) else None


def execute(spec: RunSpec, settings: Settings, run_dir: pathlib.Path, vocab_rows: int) -> dict:
  """Trains and evaluates one run in `run_dir` (started afresh); returns its result."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  if run_dir.exists():
    shutil.rmtree(run_dir)  # an unfinished or different run: start afresh, deterministically
  task = suite.task_name(spec.task, taskless=True)
  lengths = {"inputs": settings.input_length, "targets": settings.target_length}
  steps = settings.source_steps if spec.role == "source" else settings.target_steps
  started = time.time()
  result = train_lib.train(
      model=build_model(spec, settings, vocab_rows),
      train_dataset_cfg=data_lib.DatasetConfig(task, lengths, batch_size=settings.batch_size,
                                               seed=settings.seed, module=TASK_MODULE),
      total_steps=steps, model_dir=str(run_dir),
      optimizer=optimizers.adafactor(learning_rate=settings.learning_rate),
      eval_cfg=evaluator_lib.EvalConfig(task, lengths, split="validation", batch_size=100,
                                     num_examples=settings.eval_examples, module=TASK_MODULE),
      eval_period=steps, checkpoint_cfg=train_lib.CheckpointConfig(period=steps),
      initial_checkpoint_path=embedded.CHECKPOINT_PATH, seed=settings.seed, verbose=False)
  seconds = time.time() - started
  metrics = result.eval_history[-1][1][task]
  out = {"name": spec.name, "task": spec.task, "method": spec.method, "role": spec.role,
         "init_from": os.path.basename(spec.init_from) if spec.init_from else None,
         "accuracy": round(float(metrics["accuracy"]), 2), "seconds": round(seconds, 1),
         "steps": steps, "final_loss": round(float(result.history[-1]["loss"]), 4),
         "run_dir": str(run_dir), "fingerprint": _fingerprint(spec, settings)}
  (run_dir / RESULT_FILE).write_text(json.dumps(out, indent=1))
  return out
