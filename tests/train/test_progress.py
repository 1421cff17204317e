"""The trainer's progress lines: rates and the ETA count steps after the compiling first step.

A real smoke run (the byte-level tiny T5, 30 steps, a line every step, an evaluation at step 15):
its first step and its evaluation compile for seconds, each later step takes milliseconds. The
line at the first step has no rate yet and says so; the lines after it and after the evaluation
give an ETA of the order of the time the run then took.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time
from tests.helpers import REPO

LINE = re.compile(r"^step (\d+)/(\d+) \| .* \| ([\d.]+) steps/s \| [\d.]+ ex/s \| ETA (\S+)$")


def _seconds(duration: str) -> float:
  found = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
  hours, minutes, seconds = (int(g or 0) for g in found.groups())
  return 3600 * hours + 60 * minutes + seconds


def _train(model_dir: pathlib.Path, steps: int, log_period: int, eval_period: int
           ) -> tuple[list[str], list[float]]:
  """The progress lines of a smoke run, and when each reached stdout."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
  proc = subprocess.Popen(
      [sys.executable, "-m", "spot_jax.train", "--gin_file=gin/test/smoke.gin",
       f"--gin.MODEL_DIR='{model_dir}'", f"--gin.EVAL_PERIOD={eval_period}",
       "--gin.EVAL_NUM_EXAMPLES=16", f"--gin.TRAIN_STEPS={steps}",
       f"--gin.CHECKPOINT_PERIOD={steps}",
       f"--gin.train.train.log_period={log_period}"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  lines, times = [], []
  for line in proc.stdout:
    if line.startswith(("step ", "eval step ")):
      lines.append(line.rstrip("\n"))
      times.append(time.perf_counter())
  err = proc.stderr.read()
  assert proc.wait(timeout=600) == 0, err[-3000:]
  return lines, times


def test_rates_and_eta_leave_compilation_and_evaluation_out(tmp_path):
  lines, times = _train(tmp_path / "run", steps=30, log_period=1, eval_period=15)
  # The first step compiled (seconds; each later step takes milliseconds): no rate yet.
  assert lines[0].startswith("step 1/30 | loss "), lines
  assert lines[0].endswith(" | ETA after compile"), lines
  assert "steps/s" not in lines[0]
  evaluation = lines.index(next(l for l in lines if l.startswith("eval step 15:")))
  steps = [int(line.split()[1].split("/")[0]) for line in lines if line.startswith("step ")]
  assert steps == list(range(1, 31)), lines
  parsed = {i: LINE.match(line) for i, line in enumerate(lines[1:], 1) if line.startswith("step ")}
  assert None not in parsed.values(), lines
  # The lines after the first step and after the evaluation (which compiles its own functions):
  # their ETA is of the order of the time the run then took (counting the compilation or the
  # evaluation made it 20-100x longer).
  for i in (1, evaluation + 1):
    eta, taken = _seconds(parsed[i][4]), times[-1] - times[i]
    assert eta <= 4 * taken + 2, (lines[i - 1:i + 2], taken)
