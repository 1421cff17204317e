"""runtime.enable_compilation_cache: the folder a program is given is the one JAX writes to."""
from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys
from tests.helpers import REPO


PROGRAM = """
import sys
import jax
from spot_jax import runtime
jax.jit(lambda x: x + 1)(1.0).block_until_ready()  # JAX opens its cache: the environment's folder
runtime.enable_compilation_cache(sys.argv[1])
jax.jit(lambda x: x * 3.0 - 2.0)(1.0).block_until_ready()
"""


def _entries(folder: pathlib.Path) -> list[str]:
  return (sorted(p.name for p in folder.iterdir() if p.name.endswith("-cache"))
          if folder.exists() else [])


def test_the_given_folder_wins_over_the_environments_cache_opened_before(tmp_path):
  # A user's JAX_COMPILATION_CACHE_DIR (or an earlier program in the same process) opens JAX's
  # cache at the first compile; a later COMPILATION_CACHE_DIR / --compilation_cache_dir must still
  # get the executables compiled after it (JAX opens its cache once per process unless reset).
  env_cache, given = tmp_path / "from_env", tmp_path / "given"
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env.update(JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(env_cache),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", PYTHONPATH=str(REPO))
  proc = subprocess.run([sys.executable, "-c", PROGRAM, str(given)], env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert len(_entries(env_cache)) == 1, _entries(env_cache)  # the first compile only
  assert len(_entries(given)) == 1, _entries(given)           # the one after the call


SIZED_PROGRAM = """
import sys
import jax
from spot_jax import runtime
runtime.enable_compilation_cache(sys.argv[1], runtime.SERVING_CACHE_MAX_BYTES)
jax.jit(lambda x: x * 3.0 - 2.0)(1.0).block_until_ready()
"""


def test_a_size_limited_cache_as_infer_opens_it_is_written_without_a_warning(tmp_path):
  # spot_jax.infer keeps its cache under a size limit, for which JAX locks the cache's files
  # with `filelock`; without that package JAX warns and writes nothing.
  folder = tmp_path / "cache"
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  proc = subprocess.run([sys.executable, "-c", SIZED_PROGRAM, str(folder)], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "arning" not in proc.stderr and "filelock" not in proc.stderr, proc.stderr
  assert len(_entries(folder)) == 1, _entries(folder)


def test_the_base_install_requires_what_the_cache_needs():
  # Nothing else guarantees filelock: JAX imports it optionally, and in a test environment it
  # arrives with torch. `pip install -e .` must bring it.
  tree = ast.parse((REPO / "setup.py").read_text())
  (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and any(k.arg == "install_requires" for k in n.keywords)]
  (requires,) = [k.value for k in call.keywords if k.arg == "install_requires"]
  names = {re.split(r"[<>=!~\[ ;]", ast.literal_eval(e))[0].lower() for e in requires.elts}
  assert "filelock" in names, sorted(names)
