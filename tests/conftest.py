"""Shared pytest fixtures: the real T5 artifacts in ../shared and fake CPU devices."""
from __future__ import annotations

import os
import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_T5 = REPO_ROOT.parent / "shared" / "fixtures" / "t5"

# `spot_jax.infer` keeps a persistent compilation cache in ~/.cache by default; the tests (and the
# programs they start) run without it unless a test asks for one, and never write to the home.
os.environ["SPOT_JAX_COMPILATION_CACHE"] = "none"


@pytest.fixture(scope="session")
def t5_fixtures() -> pathlib.Path:
  """The folder of real T5 artifacts (vocabulary, tiny T5X checkpoint); skips when absent."""
  if not (SHARED_T5 / "t5_vocab").exists():
    pytest.skip(f"real T5 fixtures not found at {SHARED_T5} (they live in ../shared beside the repo)")
  return SHARED_T5


@pytest.fixture(scope="session")
def t5_vocab_path(t5_fixtures: pathlib.Path) -> str:
  """Path of the real T5 SentencePiece model (cc_all.32000)."""
  return str(t5_fixtures / "t5_vocab")


@pytest.fixture(scope="module")
def real_vocab():
  """The real T5 vocabulary as the tasks load it (SPOT_JAX_VOCAB set for the module); skips when absent."""
  vocab_file = SHARED_T5 / "t5_vocab"
  if not vocab_file.exists():
    pytest.skip(f"real T5 vocabulary not found at {vocab_file} (../shared/fixtures is beside the repo)")
  import tasks  # pylint: disable=g-import-not-at-top
  old = os.environ.get("SPOT_JAX_VOCAB")
  os.environ["SPOT_JAX_VOCAB"] = str(vocab_file)
  yield tasks.get_vocabulary()
  if old is None:
    del os.environ["SPOT_JAX_VOCAB"]
  else:
    os.environ["SPOT_JAX_VOCAB"] = old
