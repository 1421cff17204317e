"""Running `python -m spot_jax.train` as a user does.

Shared by tests/e2e/test_eval.py, tests/e2e/test_train.py, tests/e2e/test_train_attempt_mpt.py,
tests/e2e/test_train_deep.py, tests/e2e/test_train_dept_residual_smop.py.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Sequence

from tests.helpers import REPO, cli_error_runner


def _cmd(*args: str) -> list[str]:
  return [sys.executable, "-m", "spot_jax.train", *args]


def _env() -> dict:
  return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")


def _run(args, timeout=600) -> subprocess.CompletedProcess:
  return subprocess.run(_cmd(*args), cwd=REPO, env=_env(), capture_output=True, text=True,
                        timeout=timeout)


def _losses(stdout: str) -> list[float]:
  return [float(m.group(1)) for m in re.finditer(r"^step \d+/\d+ \| loss ([0-9.]+)", stdout, re.M)]


def run_in_one_process(cases: Sequence[tuple[str, Sequence[str]]],
                       timeout: float = 1800) -> list[subprocess.CompletedProcess]:
  """Runs each (module, args) of `cases` in turn, each exactly as `python -m module *args` would,
  in one Python process (tests/helpers/cli_error_runner.py), which then exits: one start-up
  (imports, JAX's backend) for all of them. -> their results, in order (stdout and stderr apart).

  For runs whose process of their own proves nothing more: not for a run a test kills, nor one
  that needs another JAX backend (`--cpu_devices` other than 1)."""
  results = cli_error_runner.run_cases(
      [{"module": m, "args": list(a), "model_dir": None} for m, a in cases],
      dict(_env(), PYTHONPATH=str(REPO)), timeout)
  return [subprocess.CompletedProcess([m, *a], r["code"], r["stdout"], r["stderr"])
          for (m, a), r in zip(cases, results)]
