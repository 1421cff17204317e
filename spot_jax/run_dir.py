"""The run directory: the one owner of its layout.

  checkpoints/<step>/            training states (orbax); <step>.corrupt: a damaged state moved aside
  best/<step>/, best/metric.json the state of the best evaluation so far and its metric
  prompts/prompt_step_<N>.npy    the effective prompt at step N; prompts/prompt_best.npy the best one
"""
from __future__ import annotations

import os
import pathlib
import re
from typing import Optional

PROMPT_STEP_RE = re.compile(r"^prompt_step_(\d+)\.npy$")
CORRUPT_SUFFIX = ".corrupt"


def latest_prompt_step(model_dir: str | os.PathLike) -> Optional[int]:
  """The highest N of prompts/prompt_step_N.npy under `model_dir`, or None."""
  folder = pathlib.Path(model_dir) / "prompts"
  steps = [int(m.group(1)) for p in (folder.glob("prompt_step_*.npy") if folder.is_dir() else [])
           if (m := PROMPT_STEP_RE.match(p.name))]
  return max(steps) if steps else None


