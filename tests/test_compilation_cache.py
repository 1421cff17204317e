"""runtime.enable_compilation_cache: the folder a program is given is the one JAX writes to."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]

PROGRAM = """
import sys
import jax
from spot_jax import runtime
jax.jit(lambda x: x + 1)(1.0).block_until_ready()  # JAX opens its cache: the environment's folder
runtime.enable_compilation_cache(sys.argv[1])
jax.jit(lambda x: x * 3.0 - 2.0)(1.0).block_until_ready()
"""


def _entries(folder: pathlib.Path) -> list[str]:
  return sorted(p.name for p in folder.iterdir() if p.name.endswith("-cache")) if folder.exists() else []


def test_the_given_folder_wins_over_the_environments_cache_opened_before(tmp_path):
  # A user's JAX_COMPILATION_CACHE_DIR (or an earlier program in the same process) opens JAX's
  # cache at the first compile; a later COMPILATION_CACHE_DIR / --compilation_cache_dir must still
  # get the executables compiled after it (JAX opens its cache once per process unless reset).
  env_cache, given = tmp_path / "from_env", tmp_path / "given"
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env.update(JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(env_cache),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
             PYTHONPATH=str(REPO))
  proc = subprocess.run([sys.executable, "-c", PROGRAM, str(given)], env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert len(_entries(env_cache)) == 1, _entries(env_cache)  # the first compile only
  assert len(_entries(given)) == 1, _entries(given)           # the one after the call
