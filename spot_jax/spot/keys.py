"""Short content keys of the SPoT layer's results, so that no rerun replaces an earlier one.

A run's key is a hash of everything that determines what it trains: the task, the seed, the
frozen model's fingerprint, the data lengths and budgets, the metric that picks the best
prompt, the prompt method and the exact values of its starting prompt. Two calls with the same
key make the same run (the second reuses or resumes the first); any difference gives another
key, hence another directory. What only changes how a run is watched or saved (verbose output,
`checkpoint_period`) is left out, so a resume with another checkpoint period still resumes.

A retrieval's key adds the library's content (every entry's id, task, model and arrays), the
strategies and their options to the key of its settings.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from spot_jax.spot.library import Entry
from spot_jax.spot.settings import RunSettings

LENGTH = 12  # hex digits: 48 bits, ample for the results of one output folder


def digest(value: Any) -> str:
  """The short hash of a JSON-able value (key order does not matter)."""
  text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)
  return hashlib.sha256(text.encode()).hexdigest()[:LENGTH]


def array_digest(array: np.ndarray) -> str:
  """The hash of an array's dtype, shape and values (float32, as the runs use it)."""
  array = np.ascontiguousarray(np.asarray(array, np.float32))
  h = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
  h.update(array.tobytes())
  return h.hexdigest()[:LENGTH]


def settings_record(settings: RunSettings, task: str, seed: int, evaluate: bool = True) -> dict:
  """What of `settings` determines a run of `task` with `seed` (JSON-able)."""
  return {"task": task, "seed": seed, "backbone": settings.fingerprint_for(seed)["id"],
          "task_module": settings.task_module, "lengths": dict(settings.lengths),
          "batch_size": settings.batch_size, "train_steps": settings.train_steps,
          "embedding_step": settings.embedding_step, "prompt_length": settings.prompt_length,
          "learning_rate": settings.learning_rate,
          "evaluation": ({"metric": settings.metric_for(task), "period": settings.eval_period,
                          "batch_size": settings.eval_batch_size,
                          "num_examples": settings.eval_num_examples} if evaluate else None)}


def run_key(settings: RunSettings, task: str, seed: int, *, init: Optional[np.ndarray] = None,
            smop: Optional[Mapping[str, int]] = None, evaluate: bool = True) -> str:
  """The key of a run of `task` with `seed` from `init` (SMoP: `smop`), evaluated or not."""
  return digest({"run": settings_record(settings, task, seed, evaluate),
                 "init": None if init is None else array_digest(init),
                 "smop": None if smop is None else {k: int(v) for k, v in smop.items()}})


def library_record(entries: Sequence[Entry]) -> list[dict]:
  """The content of library entries that a retrieval reads, in id order."""
  return [{"id": e.id, "task": e.task, "model": e.fingerprint.get("id"),
           "prompt": array_digest(e.prompt), "embedding": array_digest(e.embedding)}
          for e in sorted(entries, key=lambda e: e.id)]
