"""The K-run trainer tests' jobs (tests/train/test_runs.py): a byte-tiny T5 (dropout 0.1), a
local TSV task, 8 steps."""
from __future__ import annotations

import pathlib

import jax
import numpy as np

from spot_jax import data, models, prompts
from spot_jax import train as train_lib
from spot_jax.run_dir import RunDir
from spot_jax.backbones.t5 import Transformer, config_by_name, save_checkpoint
from spot_jax.train import evaluator as evaluator_lib
from tests.helpers import prompt_train

STEPS = 8
LENGTHS = {"inputs": 24, "targets": 4}
METHODS = {
    "pt": lambda: prompts.PromptTuning(length=4, prompt_init=prompts.sampled_vocab(256)),
    "smop": lambda: prompts.SMoP(num_prompts=3, length=2, prompt_init=prompts.sampled_vocab(256)),
    "residual": lambda: prompts.ResidualPrompt(length=4, bottleneck=8,
                                               prompt_init=prompts.sampled_vocab(256)),
    "ulpt": lambda: prompts.ULPT(length=4, rank=8),
}


def save_backbone(path: pathlib.Path) -> str:
  """One frozen backbone for every run (a random backbone would follow each run's seed), drawn
  with NumPy (Flax's jitted init compiles its RNG ops for seconds); returns its path."""
  backbone = prompt_train.frozen_backbone(config_by_name("t5_1_1_byte_tiny"), seed=7)
  save_checkpoint(jax.device_get(backbone), str(path), format="t5x")
  return str(path)


def model(method: str) -> models.EncoderDecoderModel:
  config = config_by_name("t5_1_1_byte_tiny", dropout_rate=0.1)
  return models.EncoderDecoderModel(Transformer(config, prompt=METHODS[method]()))


def train(model_, task, model_dir, checkpoint, evaluate: bool = True, **kwargs):
  """A job (or one run) of the K-run tests: each run's data order follows its seed, as gin's
  RANDOM_SEED sets both (K runs: each its own)."""
  cfg = data.DatasetConfig(task, LENGTHS, batch_size=4, seed=kwargs.get("seed", 0), module=None)
  eval_cfg = evaluator_lib.EvalConfig(task, LENGTHS, batch_size=8) if evaluate else None
  return train_lib.train(model=model_, train_dataset_cfg=cfg, total_steps=STEPS,
                         model_dir=str(model_dir), eval_cfg=eval_cfg, eval_period=STEPS,
                         log_period=1, verbose=False,
                         checkpoint_cfg=train_lib.CheckpointConfig(
                             best_metric="accuracy" if evaluate else None),
                         initial_checkpoint_path=checkpoint, **kwargs)


def job_prompts(job: pathlib.Path, names, step: int = STEPS) -> list[np.ndarray]:
  return [np.load(RunDir(job / name).prompt_path(step)) for name in names]
