"""Shared pytest fixtures: the real T5 artifacts in ../shared and fake CPU devices."""
from __future__ import annotations

import os
import pathlib

import pytest
from spot_jax import runtime
from tests.helpers import REPO as REPO_ROOT

# The tests' tiny models compile far more often than they run: XLA's LLVM backend at level 0 for
# the pytest processes and every program they start that keeps XLA_FLAGS (a level set in
# XLA_FLAGS by the caller is kept). The matrix products are library calls either way.
runtime.quick_compiles(level=0)

SHARED_T5 = REPO_ROOT.parent / "shared" / "fixtures" / "t5"

# `spot_jax.infer` keeps a persistent compilation cache in ~/.cache by default; the tests (and the
# programs they start) run without it unless a test asks for one, and never write to the home.
os.environ["SPOT_JAX_COMPILATION_CACHE"] = "none"

# The programs the tests start (training, eval, infer, the launchers' processes, ...) share JAX's
# persistent compilation cache for the session, in the session's temporary folder: most of them
# compile the same few tiny-model programs, and on 2 cores compiling is a third of a short run.
# The first program to need an executable compiles it; later ones load it. A size limit turns on
# JAX's file lock around reads and writes, so a process never reads an entry still being written.
# The pytest processes themselves keep JAX's default (jax is imported before the variables are
# set, and reads them only once), so in-process tests compile as a user's program does.
# Tests that set JAX_COMPILATION_CACHE_DIR for their programs keep their own.
import jax  # pylint: disable=g-import-not-at-top,unused-import,wrong-import-position

SHARED_CACHE_SETTINGS = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
                         "JAX_COMPILATION_CACHE_MAX_SIZE": str(1 << 34)}


@pytest.fixture(scope="session", autouse=True)
def _programs_share_a_compilation_cache(tmp_path_factory):
  if os.environ.get("SPOT_JAX_TEST_SHARED_CACHE", "1") == "0":  # off: every program compiles
    yield
    return
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the session's folder, shared by the workers
  cache = root / "xla_cache"
  cache.mkdir(exist_ok=True)
  with pytest.MonkeyPatch.context() as patch:
    for key, value in {"JAX_COMPILATION_CACHE_DIR": str(cache), **SHARED_CACHE_SETTINGS}.items():
      patch.setenv(key, value)
    yield


@pytest.fixture(scope="session")
def t5_fixtures() -> pathlib.Path:
  """The folder of real T5 artifacts (vocabulary, tiny T5X checkpoint); skips when absent."""
  if not (SHARED_T5 / "t5_vocab").exists():
    pytest.skip(f"real T5 fixtures not found at {SHARED_T5} (they live in ../shared "
                "beside the repo)")
  return SHARED_T5


@pytest.fixture(scope="session")
def t5_vocab_path(t5_fixtures: pathlib.Path) -> str:
  """Path of the real T5 SentencePiece model (cc_all.32000)."""
  return str(t5_fixtures / "t5_vocab")


@pytest.fixture(scope="module")
def real_vocab():
  """The real T5 vocabulary as the tasks load it (SPOT_JAX_VOCAB set for the module);
  skips when absent."""
  vocab_file = SHARED_T5 / "t5_vocab"
  if not vocab_file.exists():
    pytest.skip(f"real T5 vocabulary not found at {vocab_file} (../shared/fixtures is "
                "beside the repo)")
  import tasks  # pylint: disable=g-import-not-at-top
  old = os.environ.get("SPOT_JAX_VOCAB")
  os.environ["SPOT_JAX_VOCAB"] = str(vocab_file)
  yield tasks.get_vocabulary()
  if old is None:
    del os.environ["SPOT_JAX_VOCAB"]
  else:
    os.environ["SPOT_JAX_VOCAB"] = old
