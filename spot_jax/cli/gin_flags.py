"""t5x-style command lines: --gin_file (repeatable), --gin_search_paths, --gin.KEY=VALUE.

Gin files and their `include`s are found relative to the working directory first, then to each
`--gin_search_paths` directory, then to the repository root, so `--gin_file=gin/...` works from
any directory. gin logs an "ERROR:root:Path not found: ..." record for each place a file is not;
those records are dropped while the files are parsed (a file found nowhere is still one error
line naming the places searched).

Errors a user can cause (unknown gin parameter, unknown task, missing checkpoint, ...) end the
program with one line on stderr naming the problem and exit status 2; `--debug` shows the
traceback instead. An override that the final configuration never uses is such an error too
(`spot_jax.cli.gin_overrides`), unless `--allow_unused_gin_overrides` is given.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pathlib
from typing import Callable, Iterator, Optional, Sequence

from spot_jax import cli
from spot_jax.cli import gin_overrides
from spot_jax.cli import distributed

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def parse_args(argv: Sequence[str], prog: str, description: str) -> argparse.Namespace:
  """Parses gin flags; `--gin.X=V` becomes the binding "X=V" (t5x's convention)."""
  parser = cli.ArgumentParser(prog=prog, description=description)
  parser.add_argument("--gin_file", action="append", default=[],
                      help="gin file to parse (repeatable; later files override earlier ones)")
  parser.add_argument("--gin_search_paths", action="append", default=[],
                      help="comma-separated directories searched for gin files and their includes")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="a gin binding such as \"TRAIN_STEPS=100\" (repeatable)")
  parser.add_argument("--multiprocess", action="store_true",
                      help="call jax.distributed.initialize() first (multi-host pods/clusters); "
                           "also enabled by SPOT_JAX_MULTIPROCESS=1 or by any of the flags below")
  parser.add_argument("--allow_unused_gin_overrides", action="store_true",
                      help="accept --gin.X overrides that the configuration never uses (by "
                           "default they are an error: they would change nothing)")
  parser.add_argument("--coordinator_address", default=None,
                      help="HOST:PORT of process 0 (GPU hosts, local CPU processes; TPU VMs detect it)")
  parser.add_argument("--num_processes", default=None, help="processes in the job")
  parser.add_argument("--process_id", default=None, help="this process's index, 0..num_processes-1")
  parser.add_argument("--heartbeat_timeout", default=None,
                      help="seconds after which a silent process counts as dead (jax's default 100)")
  parser.add_argument("--cpu_devices", default=None,
                      help="split a CPU host into this many JAX devices (one data-parallel batch "
                           "shard each; e.g. the number of cores); BATCH_SIZE must divide by it")
  parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
  args, rest = parser.parse_known_args(list(argv))
  for item in rest:
    if item.startswith("--gin.") and "=" in item:
      key, value = item[len("--gin."):].split("=", 1)
      args.gin_bindings.append(f"{key}={value}")
    else:
      parser.error(f"unrecognised argument {item!r}; gin overrides look like --gin.TRAIN_STEPS=100")
  if not args.gin_file:
    parser.error("at least one --gin_file is required, e.g. --gin_file=gin/runs/prompt_tune.gin")
  return args


def search_paths(extra: Sequence[str]) -> list[str]:
  """Where gin files are looked for, in order: the working directory, `extra`, the repository."""
  paths: list[str] = [os.getcwd()]
  for item in extra:
    paths.extend(p for p in item.split(",") if p)
  paths.append(str(REPO_ROOT))
  return list(dict.fromkeys(paths))  # a directory given twice is searched once


class _PathNotFoundFilter(logging.Filter):
  """Drops gin's "Path not found: <file>" records (one per search path that lacks a file)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and record.msg.startswith("Path not found:"))


@contextlib.contextmanager
def _quiet_search() -> Iterator[None]:
  """While gin searches its paths, its misses are not logged (gin logs to the root logger)."""
  quiet = _PathNotFoundFilter()
  logging.getLogger().addFilter(quiet)
  try:
    yield
  finally:
    logging.getLogger().removeFilter(quiet)


def parse_gin(args: argparse.Namespace, roots: Optional[Sequence[str]] = None) -> None:
  """Registers search paths, parses the files, then each binding (t5x order), and finalizes.

  Args:
    args: from `parse_args`.
    roots: the configurables the program calls ("spot_jax.train.train"); overrides they never
      reach are refused. None: the configurables the files bind that nothing references.
  """
  import gin  # pylint: disable=g-import-not-at-top
  paths = search_paths(args.gin_search_paths)
  for path in paths:
    gin.add_config_file_search_path(path)
  for f in args.gin_file:
    if not any(pathlib.Path(p, f).is_file() for p in paths) and not pathlib.Path(f).is_file():
      raise FileNotFoundError(f"gin file {f!r} not found in {paths}; "
                              f"the shipped ones are under gin/ (models/, prompts/, runs/)")
  with _quiet_search():
    gin.parse_config_files_and_bindings(args.gin_file, [], finalize_config=False)
  from_files = set(gin.config._CONFIG)  # pylint: disable=protected-access
  keys = []
  for binding in args.gin_bindings:
    gin_overrides.parse_override(binding)
    keys.append(gin_overrides.override_key(binding))
  gin.finalize()
  if args.gin_bindings and not getattr(args, "allow_unused_gin_overrides", False):
    selectors = (gin_overrides.resolve_roots(roots) if roots is not None
                 else gin_overrides.default_roots(from_files))
    if selectors is not None:
      gin_overrides.check_unused(args.gin_bindings, keys, selectors)


def run(main: Callable[[argparse.Namespace], Optional[int]], argv: Sequence[str], prog: str,
        description: str, roots: Optional[Sequence[str]] = None) -> int:
  """Parses flags and gin, runs `main`; user errors become one line + exit 2 (`spot_jax.cli`).

  `roots` names the configurables `main` calls (e.g. ("spot_jax.train.train",)), which decide
  whether an override is used (see `parse_gin`).
  """

  def program(argv: Sequence[str]) -> Optional[int]:
    args = parse_args(argv, prog, description)
    distributed.set_cpu_devices(args.cpu_devices)
    dist = distributed.resolve(args.coordinator_address, args.num_processes, args.process_id,
                               args.heartbeat_timeout)
    if args.multiprocess or os.environ.get("SPOT_JAX_MULTIPROCESS") == "1" or dist.explicit:
      distributed.initialize(dist)
    parse_gin(args, roots)
    try:
      return main(args)
    except Exception as e:  # pylint: disable=broad-except
      lost = distributed.explain_peer_loss(e)
      if lost is None:
        raise
      raise lost from e

  return cli.run(program, argv, prog)
