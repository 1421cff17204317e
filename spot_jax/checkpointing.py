"""Checkpoints of the training state (orbax) and prompt exports (.npy).

Layout under MODEL_DIR:
  checkpoints/<step>/   latest training states (prompt params, optimizer state, step, rng,
                        data position); never the frozen backbone
  best/<step>/          the state with the best validation metric so far (+ best/metric.json)
  prompts/prompt_step_<step>.npy, prompts/prompt_best.npy   the effective prompt, for
                        serving, transfer (SPoT) and task embeddings

Every write goes to a temporary name first and is renamed into place, so a run killed at any
moment leaves either the previous or the new file, never a torn one.

A state that cannot be read (a truncated or lost file: disk full, a copy cut short) is told
apart from one that does not fit the run's configuration: its metadata is compared with the
run's state first (a mismatch is a `ConfigError`, and nothing is moved), then the arrays are
read. `restore_latest` falls back from a damaged state to the newest readable one and moves the
damaged directory aside to `<step>.corrupt` (orbax ignores such names and never deletes them).
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import pathlib
import re
import sys
import time
from typing import Any, Callable, Iterator, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from spot_jax.errors import ConfigError
from spot_jax.fileio import atomic_write_bytes

PROMPT_STEP_RE = re.compile(r"^prompt_step_(\d+)\.npy$")
CORRUPT_SUFFIX = ".corrupt"


class DamagedCheckpoint(Exception):
  """A saved state whose files cannot be read (raised by `Checkpointer.restore`).

  Attributes:
    step: the checkpoint's step.
    path: its directory.
    reason: one line from the reader, naming the array and the file that failed.
  """

  def __init__(self, step: int, path: pathlib.Path, reason: str):
    super().__init__(f"{path}: {reason}")
    self.step, self.path, self.reason = step, path, reason


def _manager(directory: pathlib.Path, max_to_keep: Optional[int]) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=False)
  return ocp.CheckpointManager(directory, options=options,
                               item_handlers=ocp.StandardCheckpointHandler())


def root_cause(error: BaseException) -> str:
  """The innermost cause's first line (tensorstore names the array and the file there)."""
  while error.__cause__ is not None or (error.__context__ is not None and not error.__suppress_context__):
    error = error.__cause__ or error.__context__
  text = " ".join(str(error).strip().split("\n")[0].split()) or type(error).__name__
  return text[:400]


@contextlib.contextmanager
def quiet_abandoned_reads() -> Iterator[None]:
  """Drops the tracebacks of reads orbax abandons when one array of a restore fails.

  orbax gathers one coroutine per array in a private event loop; when one read fails, the
  loop is closed with the others still pending. Each is freed (and printed by Python) when its
  tensorstore read completes in the background; they belong to the failure already reported.
  After a failure this waits a fraction of a second for those reads, then leaves a filter on
  `sys.unraisablehook` for the rest of the process that drops only reports of orbax's own
  coroutines: a read that completes later (a busy machine) stays silent too, and every other
  unraisable exception still reaches the previous hook. A read that fails while orbax's loop is
  still running reaches asyncio's "Task exception was never retrieved" log line instead: from the
  first failure on, `DropAbandonedReadErrors` keeps those of orbax's own code off the "asyncio"
  logger.
  """
  hook = sys.unraisablehook
  sys.unraisablehook = lambda unused: None
  failed = False
  try:
    yield
  except BaseException:
    failed = True
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, DropAbandonedReadErrors) for f in asyncio_log.filters):
      asyncio_log.addFilter(DropAbandonedReadErrors())
    for _ in range(10):
      gc.collect()
      time.sleep(0.05)
    raise
  finally:
    gc.collect()
    sys.unraisablehook = hook
    if failed and not isinstance(hook, DropAbandonedReads):
      sys.unraisablehook = DropAbandonedReads(hook)


def _in_orbax(filename: str) -> bool:
  return f"{os.sep}orbax{os.sep}" in filename


def is_orbax_coroutine(obj: Any) -> bool:
  """Whether `obj` is a coroutine defined in orbax's package."""
  code = getattr(obj, "cr_code", None)
  return code is not None and _in_orbax(code.co_filename)


def raised_in_orbax(error: Optional[BaseException]) -> bool:
  """Whether `error`'s traceback passes through orbax's package."""
  tb = getattr(error, "__traceback__", None)
  while tb is not None:
    if _in_orbax(tb.tb_frame.f_code.co_filename):
      return True
    tb = tb.tb_next
  return False


class DropAbandonedReads:
  """An unraisable-exception hook dropping orbax's abandoned read coroutines, forwarding the rest."""

  def __init__(self, forward: Callable[[Any], None]):
    self.forward = forward

  def __call__(self, args: Any) -> None:
    if not is_orbax_coroutine(args.object):
      self.forward(args)


class DropAbandonedReadErrors(logging.Filter):
  """A filter for the "asyncio" logger: drops "... exception was never retrieved" of orbax's reads."""

  def filter(self, record: logging.LogRecord) -> bool:
    unretrieved = record.getMessage().startswith(("Task exception was never retrieved",
                                                  "Future exception was never retrieved"))
    return not (unretrieved and record.exc_info and raised_in_orbax(record.exc_info[1]))


def _flat_shapes(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
  import jax.tree_util as tu  # pylint: disable=g-import-not-at-top
  out = {}
  for path, leaf in tu.tree_flatten_with_path(tree)[0]:
    name = "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
    out[name] = (tuple(leaf.shape), str(np.dtype(leaf.dtype)))
  return out


def describe_mismatch(stored: Any, wanted: Any) -> Optional[str]:
  """The first difference between a checkpoint's array metadata and the run's state, or None."""
  have, want = _flat_shapes(stored), _flat_shapes(wanted)
  for name in sorted(set(have) | set(want), key=lambda n: (not n.startswith("params"), n)):
    if name not in have:
      return f"this run has {name}, the checkpoint does not"
    if name not in want:
      return f"the checkpoint has {name}, this run does not"
    if have[name] != want[name]:
      return (f"{name} is {have[name][1]}{list(have[name][0])} in the checkpoint, "
              f"{want[name][1]}{list(want[name][0])} in this run")
  return None


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

  def __init__(self, model_dir: str | os.PathLike, *, keep: int = 2):
    if keep < 1:
      raise ConfigError(f"CheckpointConfig.keep={keep}; keep at least 1 training state (2 or more "
                        f"lets a restart fall back when the latest one is damaged)")
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
    """Restores checkpoint `step` onto the shardings of `abstract_state` (ShapeDtypeStructs).

    Raises:
      ConfigError: the checkpoint is readable but holds another configuration's state.
      DamagedCheckpoint: its files cannot be read.
    """
    return _restore(self._latest, step, self.model_dir / "checkpoints" / str(step), abstract_state)

  def restore_latest(self, abstract_state: Any, warn: Callable[[str], None] = print
                     ) -> tuple[Optional[Any], Optional[int]]:
    """The newest readable training state and its step; (None, None) when there is none yet.

    Damaged newer states are moved aside to `checkpoints/<step>.corrupt` with one warning line
    each, once an older readable state has been found. When no state is readable nothing is
    moved and a `ConfigError` names the directory (starting over silently would lose the run).
    """
    directory = self.model_dir / "checkpoints"
    damaged: list[DamagedCheckpoint] = []
    for step in sorted(self._latest.all_steps(), reverse=True):
      try:
        state = self.restore(step, abstract_state)
      except DamagedCheckpoint as e:
        damaged.append(e)
        continue
      for bad in damaged:
        aside = _move_aside(bad.path)
        warn(f"warning: the training state of step {bad.step} cannot be read ({bad.reason}); "
             f"moved it to {aside} and resumed from step {step}")
      if damaged:
        self._latest.reload()
      return state, step
    if damaged:
      steps = ", ".join(str(d.step) for d in damaged)
      raise ConfigError(f"no readable training state in {directory} (step {steps}: "
                        f"{damaged[0].reason}); nothing was changed: restore the files, or move "
                        f"{directory} aside (or use a new MODEL_DIR) to start over")
    return None, None

  def check_best(self, abstract_state: Any, warn: Callable[[str], None] = print) -> None:
    """Moves a damaged best/ state (and its metric.json) aside, so the next evaluation replaces it."""
    for step in self._best.all_steps():
      path = self.model_dir / "best" / str(step)
      try:
        _restore(self._best, step, path, abstract_state)
      except DamagedCheckpoint as e:
        aside = _move_aside(path)
        metric = self.model_dir / "best" / "metric.json"
        if metric.exists() and jax.process_index() == 0:
          os.replace(metric, aside / "metric.json")
        self._best.reload()
        warn(f"warning: the best state (step {step}) cannot be read ({e.reason}); moved it to "
             f"{aside}; the next evaluation starts a new best")

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


def _restore(manager: ocp.CheckpointManager, step: int, path: pathlib.Path, abstract_state: Any) -> Any:
  try:
    stored = manager.item_metadata(step)
  except Exception as e:  # pylint: disable=broad-except
    raise DamagedCheckpoint(step, path, root_cause(e)) from None
  if stored is None:
    raise DamagedCheckpoint(step, path, "its metadata is missing")
  mismatch = describe_mismatch(stored, abstract_state)
  if mismatch is not None:
    raise ConfigError(f"the checkpoint {path} does not match this run's configuration ({mismatch}); "
                      f"use a new MODEL_DIR or the configuration that wrote it")
  with quiet_abandoned_reads():
    try:
      return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
    except Exception as e:  # pylint: disable=broad-except
      raise DamagedCheckpoint(step, path, root_cause(e)) from None


def _move_aside(path: pathlib.Path) -> pathlib.Path:
  """Renames a damaged checkpoint to `<step>.corrupt` (or `.corrupt.N`); never deletes it.

  Only process 0 renames (every host of a multi-host run finds the same damage).
  """
  aside = path.with_name(path.name + CORRUPT_SUFFIX)
  n = 1
  while aside.exists():
    aside = path.with_name(f"{path.name}{CORRUPT_SUFFIX}.{n}")
    n += 1
  if jax.process_index() == 0:
    os.replace(path, aside)
  return aside
