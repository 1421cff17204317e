"""The run directory: the one owner of its layout.

  checkpoints/<step>/            training states (orbax); <step>.corrupt: a damaged state moved aside
  best/<step>/, best/metric.json the state of the best evaluation so far and its metric
  prompts/prompt_step_<N>.npy    the effective prompt at step N; prompts/prompt_best.npy the best one
  prompts/<name>_step_<N>.npy    arrays a method exports beside its prompt (DePT: offset_...), and
                                 prompts/<name>_best.npy; see `companion_file`
"""
from __future__ import annotations

import os
import pathlib
import re
from typing import Optional

PROMPT_STEP_RE = re.compile(r"^prompt_step_(\d+)\.npy$")
PROMPT_FILE_RE = re.compile(r"^prompt_(step_\d+|best)\.npy$")  # an exported prompt
CORRUPT_SUFFIX = ".corrupt"


def latest_prompt_step(model_dir: str | os.PathLike) -> Optional[int]:
  """The highest N of prompts/prompt_step_N.npy under `model_dir`, or None."""
  folder = pathlib.Path(model_dir) / "prompts"
  steps = [int(m.group(1)) for p in (folder.glob("prompt_step_*.npy") if folder.is_dir() else [])
           if (m := PROMPT_STEP_RE.match(p.name))]
  return max(steps) if steps else None


def companion_file(prompt_file: str | os.PathLike, name: str) -> pathlib.Path:
  """The array `name` exported beside a prompt file.

  prompts/prompt_step_<N>.npy -> prompts/<name>_step_<N>.npy; prompt_best.npy -> <name>_best.npy.
  """
  path = pathlib.Path(prompt_file)
  if not path.name.startswith("prompt_"):
    raise ValueError(f"{path.name} is not an exported prompt file (prompt_step_<N>.npy or "
                     f"prompt_best.npy)")
  return path.with_name(name + path.name[len("prompt"):])
