"""The trainer's progress lines: rates and the ETA count steps after the compiling first step.

A real smoke run (the byte-level tiny T5, 30 steps, a line every step): its first step compiles
for seconds, each later step takes milliseconds. The line at the first step has no rate yet and
says so; the next line's rate is of the order of the others' and its ETA of the time the run then
took.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
LINE = re.compile(r"^step (\d+)/(\d+) \| .* \| ([\d.]+) steps/s \| [\d.]+ ex/s \| ETA (\S+)$")


def _seconds(duration: str) -> float:
  found = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
  hours, minutes, seconds = (int(g or 0) for g in found.groups())
  return 3600 * hours + 60 * minutes + seconds


def _train(model_dir: pathlib.Path, steps: int, log_period: int) -> tuple[list[str], list[float]]:
  """The progress lines of a smoke run, and when each reached stdout."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
  proc = subprocess.Popen(
      [sys.executable, "-m", "spot_jax.train", "--gin_file=gin/test/smoke.gin",
       f"--gin.MODEL_DIR='{model_dir}'", "--gin.train.train.eval_cfg=None",
       f"--gin.TRAIN_STEPS={steps}", f"--gin.CHECKPOINT_PERIOD={steps}",
       f"--gin.train.train.log_period={log_period}"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  lines, times = [], []
  for line in proc.stdout:
    if line.startswith("step "):
      lines.append(line.rstrip("\n"))
      times.append(time.perf_counter())
  err = proc.stderr.read()
  assert proc.wait(timeout=600) == 0, err[-3000:]
  return lines, times


def test_rates_and_eta_leave_the_compiling_step_out(tmp_path):
  lines, times = _train(tmp_path / "run", steps=30, log_period=1)
  # The first step compiled (seconds; each later step takes milliseconds): no rate yet.
  assert lines[0].startswith("step 1/30 | loss ") and lines[0].endswith(" | ETA after compile"), lines
  assert "steps/s" not in lines[0]
  parsed = [LINE.match(line) for line in lines[1:]]
  assert [int(p[1]) for p in parsed] == list(range(2, 31)), lines
  # From the second line on, the rate times post-compile steps only: its ETA is of the order of
  # the time the run then took (counting the compilation made it 20-100x longer).
  eta, taken = _seconds(parsed[0][4]), times[-1] - times[1]
  assert eta <= 4 * taken + 2, (lines[:3], taken)
  rates = sorted(float(p[3]) for p in parsed)
  assert float(parsed[0][3]) > rates[len(rates) // 2] / 10, lines[:3]
