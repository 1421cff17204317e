"""Quiet start-up of every spot-jax program: TensorFlow's and XLA's C++ log lines stay off.

Loading TensorFlow (seqio and tfds import it) prints a burst of C++ log lines to stderr before
anything can configure them:

  WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
  I0000 00:00:... port.cc:153] oneDNN custom operations are on. ...
  I0000 00:00:... cudart_stub.cc:31] Could not find cuda drivers on your machine, ...

twice (two of its shared libraries log while they load), and later TensorFlow and XLA log a
cuInit error on machines without CUDA and a warning each time seqio's in-memory cache of a run
shorter than an epoch is dropped. None of them is about the user's run, and they bury a
program's one-line error.

`quiet()` stops them at their source, in two ways, because one is not enough:
  - TF_CPP_MIN_LOG_LEVEL=3 in the environment (unless the user set a level) before TensorFlow or
    JAX load their C++ code: it silences everything logged after their logging is initialised
    (the cuInit error, the cache warnings, the CPU-feature note), in this process and in the
    processes it starts;
  - the lines above are logged while TensorFlow's libraries load, before that setting is read
    (TensorFlow 2.21 prints them at every level). They cannot be turned off, so stderr's file
    descriptor is captured while `tensorflow` is imported, and every line is written back except
    absl log lines below the level in effect (INFO at 1 and above, WARNING at 2, ERROR at 3)
    and absl's note that precedes them: the level TensorFlow itself would have applied.
Python's own warnings and errors are untouched, and failures still raise. One more kind of
noise is Python's: libraries repeat their advice through absl's logger (seqio warns "Using an
uncached FunctionDataset for training is not recommended ..." for every training stream, so a
study of 13 jobs printed it 56 times). `quiet()` lets each distinct absl warning through once per
process, and drops advice that cannot apply to a spot-jax run (`NOT_APPLICABLE`): seqio's
"It is highly recommended that you cache this task" warns that an uncached function dataset
reshuffles differently on a restart, but the trainer resumes every training stream at its
recorded position with its seed (`spot_jax.data`), so a restart reads the very batches it would
have read, and there is nothing to cache for the in-memory tasks (the toy model's, a TSV of
one's own).

It applies to programs only: `python -m spot_jax.<prog>` (the package's `__init__` calls it
while Python locates the module) and every `spot_jax.cli.runner.run`. Asking for the lines
back: SPOT_JAX_VERBOSE=1 (everything, as the libraries print it), or a TF_CPP_MIN_LOG_LEVEL of
one's own (0 shows everything; 1 and above hide what they hide in TensorFlow, also while it loads).
"""
from __future__ import annotations

import contextlib
import importlib.abc
import logging
import os
import re
import sys
import tempfile
from typing import Any, Callable, Iterator, Optional

VERBOSE_ENV = "SPOT_JAX_VERBOSE"
TF_LOG_ENV = "TF_CPP_MIN_LOG_LEVEL"
# Set beside TF_LOG_ENV when spot-jax chose its value, so a child process (a benchmark peer, a
# launched worker) knows the value is not the user's and quiets its own start-up too.
_DEFAULTED_ENV = "SPOT_JAX_TF_LOG_DEFAULTED"

# absl's C++ log lines (<severity><mmdd> <time> <thread> <file>:<line>] <message>), the note absl
# prints before the first of them, and the continuation line of TensorFlow's CPU-feature note.
_ABSL_LINE = re.compile(rb"^(?P<severity>[IWEF])\d{4} [\d:. ]+\d+ [\w.]+:\d+\] ")
_ABSL_NOTE = re.compile(rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are "
                        rb"written to STDERR")
_CPU_NOTE_TAIL = re.compile(rb"^To enable the following instructions: .* rebuild TensorFlow with "
                            rb"the appropriate compiler flags\.")
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}

_installed = False

# Beginnings of library warnings that never apply to a spot-jax run (see the module docstring).
NOT_APPLICABLE = (
    "Using an uncached FunctionDataset for training is not recommended since it often results "
    "in insufficient shuffling on restarts",
)


def user_wants_logs(environ=os.environ) -> bool:
  """True when the user asked for every library line as printed (SPOT_JAX_VERBOSE)."""
  return environ.get(VERBOSE_ENV, "").strip() not in ("", "0")


def _user_level(environ=os.environ) -> Optional[int]:
  """The TF_CPP_MIN_LOG_LEVEL the user set (None: unset, or set by spot-jax for a parent)."""
  if TF_LOG_ENV not in environ or environ.get(_DEFAULTED_ENV) == "1":
    return None
  try:
    return int(environ[TF_LOG_ENV])
  except ValueError:
    return 0  # TensorFlow reads an unparsable level as 0


def quiet() -> None:
  """Turns the start-up log lines off for this process (idempotent; see the module docstring)."""
  global _installed
  if _installed or user_wants_logs():
    return
  _installed = True
  level = _user_level()
  if level is None:
    level = 3
    os.environ[TF_LOG_ENV] = "3"
    os.environ[_DEFAULTED_ENV] = "1"
  if level > 0 and "tensorflow" not in sys.modules:
    sys.meta_path.insert(0, _QuietTensorFlowImport(level))
  logging.getLogger("absl").addFilter(_EachWarningOnce())


class _EachWarningOnce(logging.Filter):
  """Lets each distinct warning (logger and text) through the first time only, and none of
  `NOT_APPLICABLE`; other levels pass."""

  def __init__(self):
    super().__init__()
    self._seen: set[tuple[str, str]] = set()

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno != logging.WARNING:
      return True
    key = (record.name, record.getMessage())
    if key in self._seen or key[1].startswith(NOT_APPLICABLE):
      return False
    self._seen.add(key)
    return True


def quiet_if_module_run() -> None:
  """`quiet()` when Python is locating the module of `python -m` (sys.argv[0] is then "-m")."""
  if sys.argv[:1] == ["-m"]:
    quiet()


def below(level: int) -> Callable[[bytes], bool]:
  """A predicate: is a stderr line absl's log line of a severity below `level` (or its note)?"""

  def noise(line: bytes) -> bool:
    found = _ABSL_LINE.match(line)
    if found:
      return _SEVERITY[found["severity"]] < level
    return bool(_ABSL_NOTE.match(line) or _CPU_NOTE_TAIL.match(line))

  return noise


@contextlib.contextmanager
def stderr_filtered(noise: Callable[[bytes], bool]) -> Iterator[None]:
  """Captures file descriptor 2 (C++ and Python writes alike); afterwards writes back every
  line for which `noise` is false, in order."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [line for line in captured.read().splitlines(keepends=True) if not noise(line)]
      if kept:
        os.write(2, b"".join(kept))


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` as usual, and runs its import under `stderr_filtered`.

  It stays installed until TensorFlow is actually imported: libraries probe for it first
  (etils' paths call `importlib.util.find_spec("tensorflow")` when orbax reads a checkpoint),
  and a probe must not use up the one filtered import.
  """

  def __init__(self, level: int):
    self._level = level

  def find_spec(self, name, path, target=None):
    if name != "tensorflow":
      return None
    for finder in sys.meta_path:
      if finder is self or not hasattr(finder, "find_spec"):
        continue
      spec = finder.find_spec(name, path, target)
      if spec is not None:
        break
    else:
      return None
    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
      spec.loader = _FilteredLoader(spec.loader, below(self._level), self)
    return spec


class _FilteredLoader(importlib.abc.Loader):
  """A loader that runs another's `exec_module` with stderr filtered (once: it then removes
  `finder`, the `_QuietTensorFlowImport` that made it, from sys.meta_path)."""

  def __init__(self, loader, noise: Callable[[bytes], bool], finder: Optional[Any] = None):
    self._loader = loader
    self._noise = noise
    self._finder = finder

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    # The module's spec must name the real loader (importlib.resources and pkgutil read it).
    module.__spec__.loader = module.__loader__ = self._loader
    if self._finder in sys.meta_path:
      sys.meta_path.remove(self._finder)
    with stderr_filtered(self._noise):
      self._loader.exec_module(module)

  def __getattr__(self, name):
    return getattr(self._loader, name)
