"""t5x-style command lines: --gin_file (repeatable), --gin_search_paths, --gin.KEY=VALUE.

Gin files and their `include`s are found relative to the working directory first, then to each
`--gin_search_paths` directory, then to the repository root, so `--gin_file=gin/...` works from
any directory. gin logs an "ERROR:root:Path not found: ..." record for each place a file is not;
those records are dropped while the files are parsed (a file found nowhere is still one error
line naming the places searched).

Errors a user can cause end the program with one line on stderr and exit status 2 (`--debug`
shows the traceback instead), naming what caused them: a gin file that does not parse (the file
and line, through includes) or binds an unknown name, a `--gin.X=V` override that does not parse
or that the final configuration never uses (`gin_overrides`; `--allow_unused_gin_overrides`
lets it pass), a value of the wrong type for its parameter, and a value a configurable refuses
(`gin_settings`: the macro or binding that supplied it). Multi-process flags: `distributed`.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import pathlib
from typing import Callable, Optional, Sequence

from spot_jax import cli
from spot_jax import paths
from spot_jax.cli import distributed
from spot_jax.cli import renamed
from spot_jax.cli import gin_files
from spot_jax.cli import gin_overrides
from spot_jax.cli import gin_settings
from spot_jax.errors import ConfigError


def parse_args(argv: Sequence[str], prog: str, description: str,
               add_arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None
               ) -> argparse.Namespace:
  """Parses gin flags; `--gin.X=V` becomes the binding "X=V" (t5x's convention).

  `add_arguments` adds a program's own flags (`spot_jax.plan`'s --devices, ...).
  """
  parser = cli.ArgumentParser(prog=prog, description=description)
  if add_arguments is not None:
    add_arguments(parser)
  parser.add_argument("--gin_file", action="append", default=[],
                      help="gin file to parse (repeatable; later files override earlier ones)")
  parser.add_argument("--gin_search_paths", action="append", default=[],
                      help="comma-separated directories searched for gin files and their includes")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="a gin binding such as \"TRAIN_STEPS=100\" (repeatable)")
  parser.add_argument("--allow_unused_gin_overrides", action="store_true",
                      help="accept --gin.X overrides that the configuration never uses (by "
                           "default they are an error: they would change nothing)")
  distributed.add_arguments(parser)
  parser.add_argument("--cpu_devices", default=None,
                      help="split a CPU host into this many JAX devices (one data-parallel batch "
                           "shard each; e.g. the number of cores); BATCH_SIZE must divide by it")
  args, rest = parser.parse_known_args(list(argv))
  for item in rest:
    if item.startswith("--gin.") and "=" in item:
      key, value = item[len("--gin."):].split("=", 1)
      args.gin_bindings.append(f"{key}={value}")
    else:
      close = renamed.closest_flags([item], parser.defined_flags())
      hint = (f"did you mean {' or '.join(close)}?" if close
              else "gin overrides look like --gin.TRAIN_STEPS=100")
      parser.error(f"unrecognised argument {item!r}; {hint}")
  if not args.gin_file:
    parser.error("at least one --gin_file is required, e.g. --gin_file=gin/runs/prompt_tune.gin")
  return args


def search_paths(extra: Sequence[str]) -> list[str]:
  """Where gin files are looked for, in order: the working directory, `extra`, the spot-jax root
  (the rule of `spot_jax.paths`, which INITIAL_CHECKPOINT_PATH follows too)."""
  return paths.search_roots(extra)


def parse_gin(args: argparse.Namespace, roots: Optional[Sequence[str]] = None,
              run_example: str = "gin/runs/prompt_tune.gin") -> None:
  """Registers search paths, parses the files, checks that each kind of gin file is there
  (`gin_files`), then parses each binding (t5x order), finalizes, and checks the configuration:
  unused overrides and the types of the values it binds.

  Args:
    args: from `parse_args`.
    roots: the configurables the program calls ("spot_jax.train.train"); overrides they never
      reach are refused. None: the configurables the files bind that nothing references.
    run_example: the run file a command without one is told to add.

  Raises:
    ConfigError: one line naming the gin file (and line) or the --gin.X override at fault.
  """
  import gin  # pylint: disable=g-import-not-at-top
  roots_here = search_paths(args.gin_search_paths)
  for path in roots_here:
    gin.add_config_file_search_path(path)
  for f in args.gin_file:
    if not any(pathlib.Path(p, f).is_file() for p in roots_here) and not pathlib.Path(f).is_file():
      raise ConfigError(f"--gin_file={f}: not found in {roots_here}; the shipped ones are under "
                        f"gin/ (models/, prompts/, runs/)")
  for f in args.gin_file:
    gin_overrides.parse_file(f)
  from_files = gin_overrides.config_keys()
  if roots is not None:
    gin_files.check(roots, run_example)
  for binding in getattr(args, "gin_defaults", ()):  # a program's own defaults, never "unused"
    gin_overrides.parse_override(binding)
  keys = []
  for binding in args.gin_bindings:
    old = binding.partition("=")[0].strip()
    if old in renamed.RENAMED_GIN:
      raise ConfigError(f"--gin.{old} was renamed {renamed.RENAMED_GIN[old]}; use "
                        f"--gin.{renamed.RENAMED_GIN[old]}={binding.partition('=')[2]}")
    gin_overrides.parse_override(binding)
    keys.append(gin_overrides.override_key(binding))
  gin_overrides.finalize()
  selectors = (gin_overrides.resolve_roots(roots) if roots is not None
               else gin_overrides.default_roots(from_files))
  if selectors is None:
    return
  if args.gin_bindings and not getattr(args, "allow_unused_gin_overrides", False):
    gin_overrides.check_unused(args.gin_bindings, keys, selectors)
  gin_settings.check_types(gin_overrides.used_keys(selectors))


_calling_roots = False  # True while a gin program's roots run (`operative_config`)


def call_roots(roots: Sequence[str]) -> int:
  """A gin program's whole work: calls each configurable of `roots` ("module.function", as
  `run` takes them) with its gin bindings."""
  import gin  # pylint: disable=g-import-not-at-top
  global _calling_roots
  _calling_roots = True
  try:
    for root in roots:
      module, _, name = root.rpartition(".")
      gin.get_configurable(getattr(importlib.import_module(module), name))()
  finally:
    _calling_roots = False
  return 0


def operative_config() -> Optional[str]:
  """The gin configuration the running program's calls read so far (gin's operative config, as
  t5x saves it in config.gin); None outside a gin program's roots (a call from Python)."""
  if not _calling_roots:
    return None
  import gin  # pylint: disable=g-import-not-at-top
  return gin.operative_config_str()


def run(main: Callable[[argparse.Namespace], Optional[int]], argv: Sequence[str], prog: str,
        description: str, roots: Optional[Sequence[str]] = None,
        run_example: str = "gin/runs/prompt_tune.gin",
        add_arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None,
        before_jax: Optional[Callable[[argparse.Namespace], None]] = None) -> int:
  """Parses flags and gin, runs `main`; user errors become one line + exit 2 (`spot_jax.cli`).

  `roots` names the configurables `main` calls (e.g. ("spot_jax.train.train",)), which decide
  whether an override is used (see `parse_gin`). `add_arguments` adds the program's own flags;
  `before_jax(args)` runs before JAX starts its backends (e.g. to set the CPU device count).
  """

  def program(argv: Sequence[str]) -> Optional[int]:
    args = parse_args(argv, prog, description, add_arguments)
    if before_jax is not None:
      before_jax(args)
    distributed.set_cpu_devices(args.cpu_devices)
    distributed.setup(args)
    parse_gin(args, roots, run_example)
    try:
      return main(args)
    except ConfigError as e:
      raise gin_settings.name_setting(e) from e
    except Exception as e:  # pylint: disable=broad-except
      lost = distributed.explain_peer_loss(e)
      if lost is None:
        raise
      raise lost from e

  return cli.run(program, argv, prog)


@dataclasses.dataclass(frozen=True)
class Program:
  """A gin program (`spot_jax.train`, `spot_jax.eval`): its name, its --help line, the
  configurables (`roots`, as `run` takes them) its main calls with their gin bindings, and the
  run file that binds them (suggested to a command that gives none)."""
  name: str
  description: str
  roots: tuple[str, ...]
  run_example: str = "gin/runs/prompt_tune.gin"

  def main(self, args: argparse.Namespace) -> int:
    del args  # everything comes through gin
    return call_roots(self.roots)

  def __call__(self, argv: Sequence[str]) -> int:
    return run(self.main, argv, self.name, self.description, self.roots, self.run_example)
