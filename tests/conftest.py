"""Shared pytest fixtures: the real T5 artifacts in ../shared and fake CPU devices."""
from __future__ import annotations

import os
import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_T5 = REPO_ROOT.parent / "shared" / "fixtures" / "t5"


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
