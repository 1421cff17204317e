"""Running `python -m spot_jax.train` as a user does.

Shared by tests/e2e/test_train.py, tests/e2e/test_train_attempt_mpt.py,
tests/e2e/test_train_deep.py, tests/e2e/test_train_dept_residual_smop.py.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers import REPO


def _cmd(*args: str) -> list[str]:
  return [sys.executable, "-m", "spot_jax.train", *args]


def _env() -> dict:
  return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")


def _run(args, timeout=600) -> subprocess.CompletedProcess:
  return subprocess.run(_cmd(*args), cwd=REPO, env=_env(), capture_output=True, text=True,
                        timeout=timeout)


def _losses(stdout: str) -> list[float]:
  return [float(m.group(1)) for m in re.finditer(r"^step \d+/\d+ \| loss ([0-9.]+)", stdout, re.M)]
