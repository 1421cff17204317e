"""`python -m spot_jax.eval` reproduces the trainer's own evaluation of the saved prompt, and falls
back past a damaged newest state as the trainer does (without moving anything)."""
from __future__ import annotations

import json
import os
import shutil
import pathlib
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.helpers.cli_error_runner import tree_hash

TASK = "spot_synthetic_sentiment_v100"
COMMON = ["--gin_file=gin/test/smoke.gin"]


def _run(module: str, args, timeout=600) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _predictions(path: pathlib.Path) -> list[str]:
  return [json.loads(line)["prediction"] for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> pathlib.Path:
  run = tmp_path_factory.mktemp("smoke")
  proc = _run("spot_jax.train", [*COMMON, f"--gin.MODEL_DIR='{run}'", "--gin.TRAIN_STEPS=30",
                                 "--gin.EVAL_PERIOD=30", "--gin.CHECKPOINT_PERIOD=10",
                                 "--gin.EVAL_NUM_EXAMPLES=32"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  return run


def _eval_args(out: pathlib.Path, source: str) -> list[str]:
  return ["--gin_file=gin/models/t5_1_1_byte_tiny.gin", "--gin_file=gin/test/smoke_prompt.gin",
          "--gin_file=gin/runs/eval.gin", f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.EVAL_NUM_EXAMPLES=32",
          f"--gin.OUTPUT_DIR='{out}'", source]


@pytest.mark.parametrize("source", ["checkpoint_dir", "prompt_file"])
def test_eval_matches_training_evaluation(trained, tmp_path, source):
  arg = (f"--gin.MODEL_DIR='{trained}'" if source == "checkpoint_dir"
         else f"--gin.PROMPT_FILE='{trained / 'prompts' / 'prompt_best.npy'}'")
  proc = _run("spot_jax.eval", _eval_args(tmp_path, arg))
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads((tmp_path / "metrics.json").read_text())
  assert record["split"] == "validation"
  train_metrics = [json.loads(l)
                   for l in (trained / "eval" / f"{TASK}-metrics.jsonl").read_text().splitlines()]
  assert record["metrics"][TASK]["accuracy"] == train_metrics[-1]["accuracy"]
  ours = sorted(tmp_path.glob(f"{TASK}-*.jsonl"))
  ours = [p for p in ours if not p.name.endswith("-metrics.jsonl")]
  assert len(ours) == 1
  assert _predictions(ours[0]) == _predictions(trained / "eval" / f"{TASK}-000030.jsonl")


def test_eval_needs_exactly_one_source(trained, tmp_path):
  proc = _run("spot_jax.eval", _eval_args(tmp_path, f"--gin.MODEL_DIR='{trained}'") +
              [f"--gin.PROMPT_FILE='{trained / 'prompts' / 'prompt_best.npy'}'"])
  assert proc.returncode == 2
  assert "Traceback" not in proc.stderr
  assert "exactly one of MODEL_DIR" in proc.stderr


def test_eval_falls_back_past_a_damaged_newest_state(trained, tmp_path):
  """The newest state (checkpoints/30) truncated: eval evaluates checkpoints/20 and says so in one
  stderr warning naming both; exit 0; unlike the trainer it moves nothing (the run is read-only)."""
  run = tmp_path / "run"
  shutil.copytree(trained, run)
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["20", "30"]
  for f in (run / "checkpoints" / "30").glob("default/ocdbt.process_0/d/*"):
    os.truncate(f, 10)
  before = tree_hash(run)
  out = tmp_path / "out"
  proc = _run("spot_jax.eval", _eval_args(out, f"--gin.MODEL_DIR='{run}'") +
              ["--gin.CHECKPOINT_STEP='latest'"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stderr.splitlines()
  assert len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith(f"warning: the training state {run / 'checkpoints' / '30'} "
                             "cannot be read ("), lines[0]
  assert lines[0].endswith(f"; used {run / 'checkpoints' / '20'} instead"), lines[0]
  assert "warning" not in proc.stdout
  assert json.loads((out / "metrics.json").read_text())["source"] == str(run / "checkpoints" / "20")
  assert tree_hash(run) == before
