"""Host memory: keep the CPU backend's per-step scratch buffer mapped between steps.

XLA:CPU allocates each execution's temporaries as one block (about 400 MB for a T5-small train
step at batch 8) with malloc, from one of its worker threads, and frees it when the step ends.
glibc serves a block that large with a fresh mmap from any thread that is not on its main arena,
so every step page-faults the whole block in again: about 100k minor faults and 0.15 s of kernel
time per step on 2 cores, for memory that was just given back.

`keep_heap()` makes glibc keep such blocks: one arena for every thread, no mmap for large blocks,
no trimming of the heap's free top. The block is then reused from step to step with no faults.
The process holds on to its high-water mark of malloc'd memory instead of returning it, which is
what a training process does anyway. It must run before JAX starts its CPU backend (worker threads
pick their arena on their first malloc); the command lines do it first thing (`cli.run`).
Set SPOT_JAX_MALLOC=system to keep glibc's defaults. Elsewhere than glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Optional

ENV = "SPOT_JAX_MALLOC"
MODES = ("keep", "system")

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_INT_MAX = 2**31 - 1

_applied: Optional[str] = None

# The same settings as glibc's environment variables, for a process started from here.
GLIBC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(_INT_MAX)}


def mode() -> str:
  """The mode asked for by SPOT_JAX_MALLOC ("keep" by default)."""
  value = os.environ.get(ENV, "keep").strip().lower() or "keep"
  if value not in MODES:
    raise ValueError(f"{ENV}={os.environ.get(ENV)!r}; valid: {', '.join(map(repr, MODES))}")
  return value


def _glibc() -> Optional[ctypes.CDLL]:
  name = ctypes.util.find_library("c")
  if not name:
    return None
  try:
    libc = ctypes.CDLL(name)
  except OSError:
    return None
  return libc if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version") else None


def keep_heap() -> str:
  """Applies SPOT_JAX_MALLOC once per process; returns what is in effect.

  "keep" (glibc, applied), "system" (asked for, or not glibc: nothing changed). Call it before
  the first JAX computation.
  """
  global _applied
  if _applied is not None:
    return _applied
  wanted = mode()
  libc = _glibc() if wanted == "keep" else None
  if libc is None:
    _applied = "system"
    return _applied
  ok = all(libc.mallopt(param, value) == 1 for param, value in (
      (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _INT_MAX)))
  _applied = "keep" if ok else "system"
  return _applied


def applied() -> str:
  """What is in effect in this process: "keep" after `keep_heap` applied it, or when the process
  was started with `GLIBC_ENV`; "system" otherwise."""
  if _applied == "keep" or all(os.environ.get(k) == v for k, v in GLIBC_ENV.items()):
    return "keep"
  return "system"
