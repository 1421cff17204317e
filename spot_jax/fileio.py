"""Writing directories so that a reader never sees a half-written one.

`staged_directory(path)` hands out a fresh path beside `path` to fill; only when the block
completes does it take `path`'s place (the old directory, if any, is moved aside first and
removed after). A failure leaves `path` as it was and no staging folder behind.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator


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
