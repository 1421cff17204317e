"""Training states of one run directory (orbax): save, restore with fallback, the best state.

The paths are the run directory's (`spot_jax.run_dir.RunDir`): checkpoints/<step>/ (the latest
states: prompt params, optimizer state, step, rng, data position; never the frozen backbone) and
best/<step>/ + best/metric.json (the state of the best evaluation). Every write goes to a
temporary name first and is renamed into place, so a run killed at any moment leaves either the
previous or the new state, never a torn one.

A state that cannot be read (a truncated or lost file: disk full, a copy cut short) is told
apart from one that does not fit the run's configuration: its metadata is compared with the
run's state first (a mismatch is a `ConfigError`, and nothing is moved), then the arrays are
read. `restore_latest` falls back from a damaged state to the newest readable one and moves the
damaged directory aside to `<step>.corrupt` (orbax ignores such names and never deletes them).
"""
from __future__ import annotations

import os
import pathlib
from typing import Any, Callable, Optional, Union

import jax
import orbax.checkpoint as ocp

from spot_jax.errors import ConfigError
from spot_jax.orbax_io import DamagedCheckpoint, restore_checked
from spot_jax.run_dir import CORRUPT_SUFFIX, BestMetric, RunDir


def _manager(directory: pathlib.Path, max_to_keep: Optional[int]) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                         enable_async_checkpointing=False)
  return ocp.CheckpointManager(directory, options=options,
                               item_handlers=ocp.StandardCheckpointHandler())


class Checkpointer:
  """Saves and restores training states of one run directory.

  Attributes:
    run_dir: the `RunDir`.
  """

  def __init__(self, run_dir: Union[RunDir, str, os.PathLike], *, keep: int = 2):
    if keep < 1:
      raise ConfigError(f"CheckpointConfig.keep={keep}; keep at least 1 training state (2 or more "
                        f"lets a restart fall back when the latest one is damaged)")
    self.run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    self._latest = _manager(self.run_dir.checkpoints, keep)
    self._best = _manager(self.run_dir.best, 1)

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
    return restore_checked(self._latest, step, self.run_dir.state_path(step), abstract_state)

  def restore_latest(self, abstract_state: Any, warn: Callable[[str], None] = print
                     ) -> tuple[Optional[Any], Optional[int]]:
    """The newest readable training state and its step; (None, None) when there is none yet.

    Damaged newer states are moved aside to `checkpoints/<step>.corrupt` with one warning line
    each, once an older readable state has been found. When no state is readable nothing is
    moved and a `ConfigError` names the directory (starting over silently would lose the run).
    """
    directory = self.run_dir.checkpoints
    damaged: list[DamagedCheckpoint] = []
    for step in reversed(self.run_dir.state_steps()):
      try:
        state = self.restore(step, abstract_state)
      except DamagedCheckpoint as e:
        damaged.append(e)
        continue
      for bad in damaged:
        aside = self.move_aside(bad.step)
        warn(f"warning: the training state of step {bad.step} cannot be read ({bad.reason}); "
             f"moved it to {aside} and resumed from step {step}")
      return state, step
    if damaged:
      steps = ", ".join(str(d.step) for d in damaged)
      raise ConfigError(f"no readable training state in {directory} (step {steps}: "
                        f"{damaged[0].reason}); nothing was changed: restore the files, or move "
                        f"{directory} aside (or use a new MODEL_DIR) to start over")
    return None, None

  def move_aside(self, step: int) -> pathlib.Path:
    """Moves the damaged checkpoints/<step> aside (see `_move_aside`); returns its new path."""
    aside = _move_aside(self.run_dir.state_path(step))
    self._latest.reload()
    return aside

  def check_best(self, abstract_state: Any, warn: Callable[[str], None] = print) -> None:
    """Moves a damaged best/ state (and its metric.json) aside,
    so the next evaluation replaces it."""
    for step in self.run_dir.best_steps():
      path = self.run_dir.best_state_path(step)
      try:
        restore_checked(self._best, step, path, abstract_state)
      except DamagedCheckpoint as e:
        aside = _move_aside(path)
        metric = self.run_dir.metric_path
        if metric.exists() and jax.process_index() == 0:
          os.replace(metric, aside / "metric.json")
        self._best.reload()
        warn(f"warning: the best state (step {step}) cannot be read ({e.reason}); moved it to "
             f"{aside}; the next evaluation starts a new best")

  def best_metric(self) -> Optional[float]:
    best = self.run_dir.best_metric()
    return None if best is None else best.value

  def save_best(self, step: int, state: Any, metric_name: str, value: float) -> None:
    """Keeps `state` as the best one (the caller decides that it is better)."""
    if step not in self._best.all_steps():
      self._best.save(step, args=ocp.args.StandardSave(state))
      self._best.wait_until_finished()
    if jax.process_index() == 0:
      self.run_dir.write_best_metric(BestMetric(int(step), metric_name, float(value)))

  def close(self) -> None:
    self._latest.close()
    self._best.close()


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
