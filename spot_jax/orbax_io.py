"""Reading orbax states with one-line causes: the shared code of every reader of a run's states.

A state that cannot be read (a truncated or lost file: disk full, a copy cut short) raises
`DamagedCheckpoint` naming the array and the file; one whose metadata does not fit the reader's
tree is a `ConfigError` naming the first difference (`describe_mismatch`). orbax reads every array
in its own coroutine and abandons the others when one fails; `quiet_abandoned_reads` keeps their
leftover tracebacks off the terminal, so a damaged state is one line.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import pathlib
import sys
import time
from typing import Any, Callable, Iterator, Optional

import numpy as np
import orbax.checkpoint as ocp

from spot_jax.errors import ConfigError


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


def root_cause(error: BaseException) -> str:
  """The innermost cause's first line (tensorstore names the array and the file there)."""
  while (error.__cause__ is not None
         or (error.__context__ is not None and not error.__suppress_context__)):
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
    if failed:  # a restore that succeeds abandons nothing: no collection over the whole heap
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
  """An unraisable-exception hook dropping orbax's abandoned read coroutines,
  forwarding the rest."""

  def __init__(self, forward: Callable[[Any], None]):
    self.forward = forward

  def __call__(self, args: Any) -> None:
    if not is_orbax_coroutine(args.object):
      self.forward(args)


class DropAbandonedReadErrors(logging.Filter):
  """A filter for the "asyncio" logger: drops "... exception was never retrieved"
  of orbax's reads."""

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


def read_state(item_dir: pathlib.Path, sharding: Optional[Any] = None) -> Any:
  """A saved state's tree, every array placed with `sharding`; `DamagedCheckpoint` if unreadable.

  The shapes and dtypes come from the state's own metadata, so no target tree is needed.

  Args:
    item_dir: the state's item directory (`<step>/default`).
    sharding: where each array goes (default: this process's first device). Every process of a
      multi-process job calls this with the same arguments.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if sharding is None:
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  checkpointer = ocp.StandardCheckpointer()
  with quiet_abandoned_reads():
    try:
      absl_log = logging.getLogger("absl")
      level = absl_log.level
      absl_log.setLevel(logging.ERROR)  # "Metadata file does not exist" of the step directory
      try:
        metadata = checkpointer.metadata(item_dir)
      finally:
        absl_log.setLevel(level)
      tree = getattr(getattr(metadata, "item_metadata", metadata), "tree",
                     getattr(metadata, "item_metadata", metadata))
      target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding),
                            tree, is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"))
      return checkpointer.restore(item_dir, target)
    except Exception as e:  # pylint: disable=broad-except
      raise DamagedCheckpoint(_step_of(item_dir), item_dir.parent, root_cause(e)) from None


def _step_of(item_dir: pathlib.Path) -> int:
  name = item_dir.parent.name
  return int(name) if name.isdigit() else -1


def restore_checked(manager: ocp.CheckpointManager, step: int, path: pathlib.Path,
                    abstract_state: Any) -> Any:
  try:
    stored = manager.item_metadata(step)
  except Exception as e:  # pylint: disable=broad-except
    raise DamagedCheckpoint(step, path, root_cause(e)) from None
  if stored is None:
    raise DamagedCheckpoint(step, path, "its metadata is missing")
  mismatch = describe_mismatch(stored, abstract_state)
  if mismatch is not None:
    raise ConfigError(f"the checkpoint {path} does not match this run's configuration "
                      f"({mismatch}); use a new MODEL_DIR or the configuration that wrote it")
  with quiet_abandoned_reads():
    try:
      return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
    except Exception as e:  # pylint: disable=broad-except
      raise DamagedCheckpoint(step, path, root_cause(e)) from None


