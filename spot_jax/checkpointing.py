"""Checkpoints of the training state (orbax) and prompt exports (.npy).

Layout under MODEL_DIR:
  checkpoints/<step>/   latest training states (prompt params, optimizer state, step, rng,
                        data position); never the frozen backbone
  best/<step>/          the state with the best validation metric so far (+ best/metric.json)
  prompts/prompt_step_<step>.npy, prompts/prompt_best.npy   the effective prompt, for
                        serving, transfer (SPoT) and task embeddings

Every write goes to a temporary name first and is renamed into place, so a run killed at any
moment leaves either the previous or the new file, never a torn one.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import tempfile
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from spot_jax.errors import ConfigError

PROMPT_STEP_RE = re.compile(r"^prompt_step_(\d+)\.npy$")


def _manager(directory: pathlib.Path, max_to_keep: Optional[int]) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=False)
  return ocp.CheckpointManager(directory, options=options)


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
  """Writes `data` to `path` through a temporary file and an atomic rename."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def save_npy(path: pathlib.Path, array: np.ndarray) -> None:
  """Atomically saves one array as .npy."""
  import io  # pylint: disable=g-import-not-at-top
  buf = io.BytesIO()
  np.save(buf, np.asarray(array), allow_pickle=False)
  atomic_write_bytes(path, buf.getvalue())


def latest_prompt_step(model_dir: str | os.PathLike) -> Optional[int]:
  """The highest N of prompts/prompt_step_N.npy under `model_dir`, or None."""
  folder = pathlib.Path(model_dir) / "prompts"
  steps = [int(m.group(1)) for p in (folder.glob("prompt_step_*.npy") if folder.is_dir() else [])
           if (m := PROMPT_STEP_RE.match(p.name))]
  return max(steps) if steps else None


class Checkpointer:
  """Saves and restores training states of one run directory.

  Attributes:
    model_dir: the run directory.
  """

  def __init__(self, model_dir: str | os.PathLike, *, keep: int = 1):
    self.model_dir = pathlib.Path(model_dir)
    self._latest = _manager(self.model_dir / "checkpoints", keep)
    self._best = _manager(self.model_dir / "best", 1)

  def latest_step(self) -> Optional[int]:
    return self._latest.latest_step()

  def save(self, step: int, state: Any) -> None:
    """Saves `state` (a pytree of arrays) as checkpoint `step` (replacing one of that step)."""
    if step in self._latest.all_steps():
      return
    self._latest.save(step, args=ocp.args.StandardSave(state))
    self._latest.wait_until_finished()

  def restore(self, step: int, abstract_state: Any) -> Any:
    """Restores checkpoint `step` onto the shardings of `abstract_state` (ShapeDtypeStructs)."""
    try:
      return self._latest.restore(step, args=ocp.args.StandardRestore(abstract_state))
    except (ValueError, KeyError, TypeError) as e:
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise ConfigError(f"the checkpoint {self.model_dir / 'checkpoints' / str(step)} does not match "
                        f"this run's configuration ({first[:300]}); use a new MODEL_DIR or the "
                        f"configuration that wrote it") from None

  def best_metric(self) -> Optional[float]:
    path = self.model_dir / "best" / "metric.json"
    if not path.exists():
      return None
    return float(json.loads(path.read_text())["value"])

  def save_best(self, step: int, state: Any, metric_name: str, value: float) -> None:
    """Keeps `state` as the best one (the caller decides that it is better)."""
    if step not in self._best.all_steps():
      self._best.save(step, args=ocp.args.StandardSave(state))
      self._best.wait_until_finished()
    record = {"step": int(step), "metric": metric_name, "value": float(value)}
    atomic_write_bytes(self.model_dir / "best" / "metric.json", json.dumps(record).encode())

  def export_prompt(self, name: str, array: np.ndarray) -> pathlib.Path:
    """Writes prompts/<name>.npy atomically and returns its path."""
    path = self.model_dir / "prompts" / f"{name}.npy"
    save_npy(path, np.asarray(jax.device_get(array), np.float32))
    return path

  def close(self) -> None:
    self._latest.close()
    self._best.close()
