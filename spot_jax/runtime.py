"""Process settings of a spot-jax program: host memory, JAX's compilation cache, XLA's compiles.

`enable_compilation_cache(dir)` turns on JAX's persistent compilation cache (see there).
`quick_compiles()` has XLA optimise its generated code less (see there).

Host memory: keep the CPU backend's per-step scratch block mapped between steps.

XLA:CPU allocates each execution's temporaries as one block (406 MB for T5-small Prompt Tuning at
batch 8) with malloc and frees it when the step ends. By default JAX runs a computation on one of
its worker threads, whose malloc arena cannot hold a block that large, so glibc maps it afresh on
every step and the kernel zero-fills it page by page: about 100k minor faults and 0.15 s of kernel
time per step on 2 cores, for memory that was just given back.

`keep_heap()` (SPOT_JAX_MALLOC=keep, the default of every `python -m spot_jax.<prog>`) does two
things, before JAX starts its CPU backend:
  - JAX runs single-device computations on the calling thread (`jax_cpu_enable_async_dispatch`
    off), so the block is malloc'd from the main heap;
  - glibc serves large blocks from that heap instead of mmap, and never trims its free top.
The block is then reused from step to step with no faults, and the step no longer hands off to a
worker thread. The process keeps its high-water mark of malloc'd memory instead of returning it,
which a training process reaches on every step anyway. Computations over several devices
(`--cpu_devices`) still run on JAX's threads. SPOT_JAX_MALLOC=system keeps the defaults of both.
Elsewhere than glibc nothing changes: the dispatch setting alone would not keep the block.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time
from typing import Optional

from spot_jax.errors import ConfigError

ENV = "SPOT_JAX_MALLOC"
MODES = ("keep", "system")

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1

_applied: Optional[str] = None


def mode() -> str:
  """The mode asked for by SPOT_JAX_MALLOC ("keep" by default)."""
  value = os.environ.get(ENV, "keep").strip().lower() or "keep"
  if value not in MODES:
    raise ConfigError(f"{ENV}={os.environ.get(ENV)!r}; valid: {', '.join(map(repr, MODES))}")
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


def _backend_started() -> bool:
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  return bool(getattr(xla_bridge, "_backends", None))


def keep_heap() -> str:
  """Applies SPOT_JAX_MALLOC once per process; returns what is in effect ("keep" or "system").

  The JAX part applies only if jax is imported and its backend not yet started (a program that
  never imports jax, such as the PyTorch peer of the benchmark, gets the glibc part alone).
  """
  global _applied
  if _applied is not None:
    return _applied
  if mode() == "system":
    _applied = "system"
    return _applied
  libc = _glibc()
  ok = libc is not None and all(libc.mallopt(param, value) == 1 for param, value in (
      (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _INT_MAX)))
  if ok and "jax" in sys.modules and not _backend_started():
    sys.modules["jax"].config.update("jax_cpu_enable_async_dispatch", False)
  _applied = "keep" if ok else "system"
  return _applied


def applied() -> str:
  """What `keep_heap` put in effect in this process ("system" if it has not run)."""
  return _applied or "system"


OPT_LEVEL_FLAG = "--xla_backend_optimization_level"
QUICK_OPT_LEVEL = 1  # XLA's default is 2


def quick_compiles(level: int = QUICK_OPT_LEVEL) -> bool:
  """Appends `--xla_backend_optimization_level=<level>` (1 by default) to XLA_FLAGS unless it
  names a level already.

  XLA reads XLA_FLAGS at its first compile, so this is called before any. The level is LLVM's
  optimisation of the code XLA generates itself (its fused elementwise loops; the matrix products
  are library calls): on the embedded toy T5 on 2 CPU cores it cut the 20-run train step's compile
  from 12.1 s to 8.9 s at the same step time (0.535 s against 0.541 s), and the demo's Prompt
  Tuning job trained the same prompts byte for byte. Used by `python -m spot_jax.demo`, whose
  jobs each compile a step and a decoder for a minute of training; a long run keeps XLA's
  default. The test suite asks for level 0: its tiny models' steps are compiled far more often
  than they run. Returns whether the flag is in effect for this process's compiles (False when a
  computation already started XLA, or XLA_FLAGS names another level).
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if OPT_LEVEL_FLAG in flags or ("jax" in sys.modules and _backend_started()):
    return f"{OPT_LEVEL_FLAG}={level}" in flags.split()
  os.environ["XLA_FLAGS"] = f"{flags} {OPT_LEVEL_FLAG}={level}".strip()
  return True


def enable_compilation_cache(cache_dir: Optional[str], max_bytes: Optional[int] = None,
                             what: str = "COMPILATION_CACHE_DIR") -> None:
  """Turns on JAX's persistent compilation cache in `cache_dir` (every entry kept, or the most
  recently used up to `max_bytes`); None: off.

  A later process compiling the same step (a study's next run, a restart, each length bucket
  of a rerun) then loads the executable instead of compiling it. This folder wins over a cache
  JAX opened before (from JAX_COMPILATION_CACHE_DIR at an earlier compile, or an earlier call):
  JAX opens its cache once per process, so that one is closed and the next compile opens this.
  """
  if not cache_dir:
    return
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  from spot_jax import fileio  # pylint: disable=g-import-not-at-top
  if "://" not in str(cache_dir):
    cache_dir = str(fileio.writable_dir(cache_dir, what))
  jax.config.update("jax_compilation_cache_dir", str(cache_dir))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  if max_bytes is not None:
    jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
  compilation_cache.reset_cache()


SERVING_CACHE_ENV = "SPOT_JAX_COMPILATION_CACHE"
SERVING_CACHE_MAX_BYTES = 1 << 30  # least recently used entries go beyond this


def default_serving_cache() -> Optional[str]:
  """The persistent compilation cache `spot_jax.infer` uses unless told otherwise:
  $SPOT_JAX_COMPILATION_CACHE, else $XDG_CACHE_HOME/spot_jax/jax (~/.cache/spot_jax/jax);
  None when that variable is "none" or no home is known."""
  value = os.environ.get(SERVING_CACHE_ENV)
  if value is not None:
    return None if value.strip().lower() in ("", "none") else value
  home = os.path.expanduser("~")  # "~" itself when no home is known
  base = os.environ.get("XDG_CACHE_HOME") or (None if home == "~" else os.path.join(home, ".cache"))
  return None if base is None else os.path.join(base, "spot_jax", "jax")


def seconds_since_start() -> Optional[float]:
  """Wall seconds since this process started (its exec, from /proc/self/stat), None off Linux.

  What a user waits for includes the interpreter's own start and every import before `main`;
  a timer started in `main` would miss them. Resolution: one clock tick (10 ms).
  """
  try:
    with open("/proc/self/stat", encoding="ascii") as f:
      after_name = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces
    start = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, ticks since boot
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start
  except (OSError, ValueError, IndexError, AttributeError):
    return None


def exit_now(status: int) -> None:
  """Ends a finished command at once: flushes logs and stdio, then `os._exit(status)`.

  A serving process's work is done (its outputs renamed into place) when `main` returns; the
  interpreter's own teardown would still garbage-collect JAX's and flax's object graph and
  its traced programs, 0.3-0.7 s of a toy model's command measured on 2 cores. Only for
  commands whose results are all on disk when `main` returns. Under several processes
  (`jax.distributed`) the ordinary exit runs instead: its shutdown tells the coordinator that
  this process is done, so the others do not see it vanish.
  """
  if "jax" in sys.modules and sys.modules["jax"].process_count() > 1:
    sys.exit(status)
  import logging  # pylint: disable=g-import-not-at-top
  logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access


def enable_serving_cache(value: Optional[str], prog: str) -> None:
  """JAX's compilation cache for a serving program's --compilation_cache_dir `value`.

  None is the default serving cache, which serving goes on without (one note line) where it
  cannot be written; 'none' turns the cache off; a folder given that cannot be used is refused.
  """
  cache = default_serving_cache() if value is None else value
  try:
    if cache and cache.strip().lower() != "none":
      enable_compilation_cache(cache, max_bytes=SERVING_CACHE_MAX_BYTES,
                               what="--compilation_cache_dir")
  except ConfigError as e:
    if value is not None:
      raise
    print(f"{prog}: note: no compilation cache ({e})", file=sys.stderr)
