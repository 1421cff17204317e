"""Where a relative path given to a program points: one rule for every program and record.

A relative path a user gives (a `--gin_file` and its `include`s, an INITIAL_CHECKPOINT_PATH) is
looked for in the working directory first, then in any extra folders the program was given
(`--gin_search_paths`), then under the spot-jax root: the checkout with `pip install -e .`, the
folder holding the installed package otherwise. So the repository's own relative paths
(`gin/models/t5_1_1_toy.gin`, `spot_jax/embedded/toy_t5/checkpoint`) work from any directory.

`find` returns the absolute path it found; the trainer loads that path, fingerprints it and
writes it into run.json, so every later reader (eval, infer, export, a resumed run) opens the
files the run was trained on, whatever its working directory.
"""
from __future__ import annotations

import os
import pathlib
from typing import Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]


def search_roots(extra: Sequence[str] = ()) -> list[str]:
  """The folders a relative path is looked for in, in order: here, `extra`, the spot-jax root.

  Args:
    extra: more folders (each item may be a comma-separated list, as `--gin_search_paths`).
  """
  roots: list[str] = [os.getcwd()]
  for item in extra:
    roots.extend(p for p in str(item).split(",") if p)
  roots.append(str(ROOT))
  return list(dict.fromkeys(roots))  # a folder given twice is searched once


def is_remote(path: str | os.PathLike) -> bool:
  """A URL-like path (gs://, s3://, ...): never looked up locally."""
  return "://" in os.fspath(path)


def find(path: str | os.PathLike, extra: Sequence[str] = ()) -> str:
  """The absolute path `path` names by the rule above; remote paths are returned unchanged.

  A relative path found under no root is returned unchanged: the caller's check names it and
  the folders searched (`search_roots`).
  """
  path = os.fspath(path)
  if is_remote(path) or os.path.isabs(path):
    return path
  for root in search_roots(extra):
    candidate = os.path.join(root, path)
    if os.path.exists(candidate):
      return os.path.normpath(candidate)
  return path
