"""The base install a newcomer makes: a virtual environment with `pip install -e <repo>` and no
extras, made once per test session (pip's cache makes a rebuild quick)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest
from tests.helpers import REPO


def clean_env(venv: pathlib.Path, cache_home: pathlib.Path) -> dict:
  """A user's shell with `venv` activated: none of the test session's JAX, TensorFlow or
  spot-jax settings, and caches under `cache_home` instead of the home folder."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_", "XLA_", "TF_", "SPOT_JAX_", "PYTEST_"))
         and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
  path = [p for p in env.get("PATH", "").split(os.pathsep)
          if p and pathlib.Path(p).resolve() != pathlib.Path(sys.executable).parent.resolve()]
  env.update(PATH=os.pathsep.join([str(venv / "bin"), *path]), VIRTUAL_ENV=str(venv),
             JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(cache_home))
  return env


@pytest.fixture(scope="session")
def base_venv(tmp_path_factory, request) -> pathlib.Path:
  """A venv holding spot-jax from `pip install -e <repo>` alone (no test extras)."""
  venv = tmp_path_factory.mktemp("newcomer") / "venv"
  start = time.monotonic()
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
  proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                         "-e", str(REPO)], capture_output=True, text=True, timeout=1800,
                        env=clean_env(venv, venv.parent / "cache"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  seconds = time.monotonic() - start
  reporter = request.config.pluginmanager.get_plugin("terminalreporter")
  if reporter is not None:
    reporter.write_line(f"tests/e2e: the base-install venv took {seconds:.0f} s")
  return venv
