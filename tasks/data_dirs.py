"""Where task data lives: the TFDS data_dir and the local-files directory.

Both are looked up when a dataset is built, not when tasks are registered, so
they can be set after `import tasks`.

Attributes:
  TFDS_ENV: environment variable naming the TFDS data_dir (TFDS's own).
  FILES_ENV: environment variable naming the local-files directory.
"""
from __future__ import annotations

import os
from typing import Optional

from spot_jax.errors import ConfigError

TFDS_ENV = "TFDS_DATA_DIR"
FILES_ENV = "SPOT_JAX_DATA_DIR"

_tfds_data_dir: Optional[str] = None
_files_dir: Optional[str] = None


class DataNotFoundError(ConfigError):
  """A task's data is not prepared locally (raised before any network access); a user error:
  the command lines report it in one line (it was a FileNotFoundError, which they count as a
  bug)."""


def set_tfds_data_dir(path: Optional[str]) -> None:
  """Sets the TFDS data_dir used by every TFDS-backed task (None: back to the env)."""
  global _tfds_data_dir
  _tfds_data_dir = os.fspath(path) if path is not None else None


def tfds_data_dir() -> str:
  """The TFDS data_dir: the setter's value, else `$TFDS_DATA_DIR`, else ~/tensorflow_datasets."""
  return (_tfds_data_dir or os.environ.get(TFDS_ENV)
          or os.path.join(os.path.expanduser("~"), "tensorflow_datasets"))


def set_files_dir(path: Optional[str]) -> None:
  """Sets the directory of local jsonl/csv/tsv files (None: back to the env)."""
  global _files_dir
  _files_dir = os.fspath(path) if path is not None else None


def files_dir() -> Optional[str]:
  """The local-files directory: the setter's value, else `$SPOT_JAX_DATA_DIR`, else None."""
  return _files_dir or os.environ.get(FILES_ENV)
