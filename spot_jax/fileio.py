"""Writing files and directories so that a reader never sees a half-written one.

`atomic_open(path)` writes a temporary file beside `path` and renames it over `path` only when
the block completes. `staged_directory(path)` does the same for a directory: it hands out a fresh
path beside `path` to fill, which takes `path`'s place at the end (the old directory, if any, is
moved aside first and removed after). A failure leaves `path` as it was and nothing behind.
`writable_dir(path, flag)` checks a command's output folder before the command does its work
(`validate.output_file` checks an output file); `read_text`, `read_json` and `read_npy` read a
file a user named, any failure one ConfigError line naming it.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import tempfile
from typing import IO, Iterator, Optional

import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError, one_line

# A name that is one folder or file name on every platform: a run's folder, a library entry's id.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb",
                encoding: Optional[str] = None) -> Iterator[IO]:
  """A file at `path` that appears only if the block completes (temporary file, fsync, rename).

  A failure inside the block removes the temporary file and leaves any previous `path` as it was.
  """
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, mode, encoding=encoding) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Writes `data` to `path` through a temporary file and an atomic rename."""
  with atomic_open(path, "wb") as f:
    f.write(data)


def writable_dir(path: str | os.PathLike, what: str) -> pathlib.Path:
  """Creates directory `path` and proves it writable; returns it absolute (orbax wants that).

  Raises:
    ConfigError: one line naming `what` (e.g. "MODEL_DIR", "--output_dir") and the reason.
  """
  folder = pathlib.Path(path).expanduser().absolute()
  if folder.exists() and not folder.is_dir():
    raise ConfigError(f"{what} {str(folder)!r} is a file, not a directory; give a directory you "
                      "can create and write to")
  try:
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".spot_jax_write_test.{os.getpid()}"  # per process: hosts may share it
    probe.write_bytes(b"ok")
    probe.unlink()
  except OSError as e:
    raise ConfigError(f"{what} {str(folder)!r} is not writable ({e.strerror or e}); give a "
                      f"directory you can create and write to") from None
  return folder


def creatable_dir(path: str | os.PathLike, what: str) -> pathlib.Path:
  """Checks, creating nothing, that `writable_dir(path)` will succeed; returns `path` absolute.

  For a command that may still refuse its input: it checks here, refuses, and only then makes
  the directory, so a refusal leaves nothing behind. The nearest existing folder (the directory
  itself, or the ancestor it would be made in) must take a new file (a probe is written and
  removed).

  Raises:
    ConfigError: one line naming `what` and the reason.
  """
  folder = pathlib.Path(path).expanduser().absolute()
  existing = folder
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  if not existing.is_dir():
    where = "" if existing == folder else f" ({str(existing)!r} is a file)"
    raise ConfigError(f"{what} {str(folder)!r} cannot be a directory{where}; give a directory "
                      f"you can create and write to")
  reason = validate.write_refused(existing, ".spot_jax_write_test.")
  if reason:
    raise ConfigError(f"{what} {str(folder)!r} is not writable ({reason}); give a "
                      f"directory you can create and write to")
  return folder


def read_text(path: str | os.PathLike, what: str) -> str:
  """The UTF-8 text of a file the user named.

  Raises:
    ConfigError: one line naming `what` (e.g. "--input") when it is missing, a directory,
      unreadable or not UTF-8 text.
  """
  try:
    return pathlib.Path(path).read_text(encoding="utf-8")
  except OSError as e:
    raise ConfigError(f"{what} {str(path)!r} cannot be read ({e.strerror or e}); give a readable "
                      f"file") from None
  except UnicodeDecodeError as e:
    raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start}); "
                      f"give a text file") from None


def read_json(path: str | os.PathLike, what: str):
  """The decoded JSON of a file the user named (errors as `read_text`, or malformed JSON)."""
  text = read_text(path, what)
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise ConfigError(f"{what} {str(path)!r} is not valid JSON ({e.msg} at line {e.lineno}); "
                      f"give the file unchanged or rewrite it") from None


def read_npy(path: str | os.PathLike, what: str) -> np.ndarray:
  """The array of a .npy file the user named (no pickles).

  Raises:
    ConfigError: one line naming `what` when it is missing, unreadable, truncated or not .npy.
  """
  try:
    return np.load(path, allow_pickle=False)
  except (OSError, ValueError, EOFError) as e:
    why = getattr(e, "strerror", None) or one_line(e)
    raise ConfigError(f"{what} {str(path)!r} is not a readable .npy file ({why}); give an array "
                      f"saved with numpy.save") from None


@contextlib.contextmanager
def staged_directory(path: str | os.PathLike) -> Iterator[str]:
  """Yields a not-yet-existing directory path; on success it replaces `path` by renames.

  The caller checks whether replacing an existing `path` is allowed (its own message).
  """
  path = os.path.abspath(os.fspath(path))
  parent = os.path.dirname(path)
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
  try:
    fresh = os.path.join(staging, "new")
    yield fresh
    if os.path.exists(path):
      os.rename(path, os.path.join(staging, "old"))
    os.rename(fresh, path)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def save_npy(path: pathlib.Path, array: np.ndarray) -> None:
  """Atomically saves one array as .npy."""
  import io  # pylint: disable=g-import-not-at-top
  buf = io.BytesIO()
  np.save(buf, np.asarray(array), allow_pickle=False)
  atomic_write_bytes(path, buf.getvalue())
