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
from tests.helpers.train_cli import run_in_one_process

TASK = "spot_synthetic_sentiment_v100"
COMMON = ["--gin_file=gin/test/smoke.gin"]


def _run(module: str, args, timeout=600) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _predictions(path: pathlib.Path) -> list[str]:
  return [json.loads(line)["prediction"] for line in path.read_text().splitlines()]


STEPS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[pathlib.Path, dict]:
  """A smoke run evaluated by the trainer at its last step (checkpoints 2 and 4), then `python -m
  spot_jax.eval` on it for the tests below that need no process of their own, all in one process
  (each as `python -m` would): -> (run directory, {case: result})."""
  run = tmp_path_factory.mktemp("smoke")
  outs = {name: tmp_path_factory.mktemp(name.replace(" ", "_"))
          for name in ("checkpoint_dir", "prompt_file", "both")}
  by_dir, by_file = (f"--gin.MODEL_DIR='{run}'",
                     f"--gin.PROMPT_FILE='{run / 'prompts' / 'prompt_best.npy'}'")
  cases = {"train": ("spot_jax.train",
                     [*COMMON, f"--gin.MODEL_DIR='{run}'", f"--gin.TRAIN_STEPS={STEPS}",
                      f"--gin.EVAL_PERIOD={STEPS}", "--gin.CHECKPOINT_PERIOD=2",
                      "--gin.EVAL_NUM_EXAMPLES=32"]),
           "checkpoint_dir": ("spot_jax.eval", _eval_args(outs["checkpoint_dir"], by_dir)),
           "prompt_file": ("spot_jax.eval", _eval_args(outs["prompt_file"], by_file)),
           "both": ("spot_jax.eval", _eval_args(outs["both"], by_dir) + [by_file])}
  results = dict(zip(cases, run_in_one_process(list(cases.values()))))
  assert results["train"].returncode == 0, results["train"].stderr[-3000:]
  return run, {name: (results[name], outs.get(name)) for name in cases}


def _eval_args(out: pathlib.Path, source: str) -> list[str]:
  return ["--gin_file=gin/models/t5_1_1_byte_tiny.gin", "--gin_file=gin/test/smoke_prompt.gin",
          "--gin_file=gin/runs/eval.gin", f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.EVAL_NUM_EXAMPLES=32",
          f"--gin.OUTPUT_DIR='{out}'", source]


@pytest.mark.parametrize("source", ["checkpoint_dir", "prompt_file"])
def test_eval_matches_training_evaluation(runs, source):
  trained, results = runs
  proc, out = results[source]
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads((out / "metrics.json").read_text())
  assert record["split"] == "validation"
  train_metrics = [json.loads(l)
                   for l in (trained / "eval" / f"{TASK}-metrics.jsonl").read_text().splitlines()]
  assert record["metrics"][TASK]["accuracy"] == train_metrics[-1]["accuracy"]
  ours = sorted(out.glob(f"{TASK}-*.jsonl"))
  ours = [p for p in ours if not p.name.endswith("-metrics.jsonl")]
  assert len(ours) == 1
  assert _predictions(ours[0]) == _predictions(trained / "eval" / f"{TASK}-{STEPS:06d}.jsonl")


def test_eval_needs_exactly_one_source(runs):
  proc, _ = runs[1]["both"]
  assert proc.returncode == 2
  assert "Traceback" not in proc.stderr
  assert "exactly one of MODEL_DIR" in proc.stderr


def test_eval_falls_back_past_a_damaged_newest_state(runs, tmp_path):
  """The newest state (checkpoints/4) truncated: eval evaluates checkpoints/2 and says so in one
  stderr warning naming both; exit 0; unlike the trainer it moves nothing (the run is read-only).
  A process of its own, so the teardown of a real process after a damaged read is checked too."""
  run = tmp_path / "run"
  shutil.copytree(runs[0], run)
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2", "4"]
  for f in (run / "checkpoints" / "4").glob("default/ocdbt.process_0/d/*"):
    os.truncate(f, 10)
  before = tree_hash(run)
  out = tmp_path / "out"
  proc = _run("spot_jax.eval", _eval_args(out, f"--gin.MODEL_DIR='{run}'") +
              ["--gin.CHECKPOINT_STEP='latest'"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stderr.splitlines()
  assert len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith(f"warning: the training state {run / 'checkpoints' / '4'} "
                             "cannot be read ("), lines[0]
  assert lines[0].endswith(f"; used {run / 'checkpoints' / '2'} instead"), lines[0]
  assert "warning" not in proc.stdout
  assert json.loads((out / "metrics.json").read_text())["source"] == str(run / "checkpoints" / "2")
  assert tree_hash(run) == before
