"""The environment and log filters of the command-line tests.

Shared by tests/data/test_bucketing.py, tests/e2e/test_cli_errors.py.
"""
from __future__ import annotations

import os
import re

from tests.helpers import REPO

# Library notes printed while loading, before a program's own output, in the past
# (spot_jax/quiet_logs.py now keeps them off; other tests still filter with this).
STARTUP_NOTE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\) is called "
                          r"are written to STDERR"
                          r"|[IWE]\d{4} [\d:. ]+\d+ [\w.]+:\d+\] .*"
                          r"|WARNING:absl:.*)$")


def _env() -> dict:
  return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
