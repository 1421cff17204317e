"""The error boundary shared by every command line (`python -m spot_jax.<prog>`, `python -m tasks`).

A user error (`ConfigError`, and `UsageError` for the command line itself) ends the program with
exactly one line on stderr, `spot_jax.<prog>: error: <what is wrong>; <what would be valid>`, and
exit status 2. Anything else is a bug: one line `spot_jax.<prog>: error: internal error: <Type>:
<line> (rerun with --debug for the traceback)` and exit status 1. `--debug`, which every parser
built on `ArgumentParser` takes, shows the traceback instead. Libraries' start-up log lines are
kept off (`spot_jax.quiet_logs`), so the one line is the only one.

  def main(argv):
    parser = cli.ArgumentParser(prog="spot_jax.infer", description=...)
    args = parser.parse_args(argv)
    ...

  if __name__ == "__main__":
    sys.exit(cli.run(main, sys.argv[1:], "spot_jax.infer"))
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
from typing import Callable, NoReturn, Optional, Sequence

from spot_jax import runtime
from spot_jax import quiet_logs
from spot_jax.cli import renamed
from spot_jax.errors import ConfigError, one_line

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process ended by SIGPIPE

# Errors a user's input can cause: only those raised as such. Anything else is a bug.
USER_ERRORS = (ConfigError,)


class UsageError(ConfigError):
  """A command-line argument is missing, unknown or malformed."""


class ArgumentParser(argparse.ArgumentParser):
  """argparse for `run`: a usage error raises `UsageError` (one line through `run`) instead of
  exiting, every parser (subcommands too) takes `--debug`, a renamed flag's old spelling
  (`renamed.RENAMED`) is refused with one line naming the new one, and an unknown flag with one
  line naming the closest defined flag."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.add_argument("--debug", action="store_true",
                      help="on an error, show the traceback instead of one line")

  def parse_known_args(self, args=None, namespace=None):
    argv = list(sys.argv[1:] if args is None else args)
    self._given = argv
    message = renamed.renamed_flag_message(argv, list(self._option_string_actions))
    if message:
      self.error(message)
    return super().parse_known_args(argv, namespace)

  def parse_args(self, args=None, namespace=None):
    """argparse's, with the flag closest to each unknown one suggested ("did you mean")."""
    namespace, unknown = self.parse_known_args(args, namespace)
    if unknown:
      self.error(renamed.unknown_flags_message(unknown, self.defined_flags(namespace)))
    return namespace

  def defined_flags(self, namespace: Optional[argparse.Namespace] = None) -> list[str]:
    """This parser's flags, and those of the subcommand `namespace` chose."""
    names = list(self._option_string_actions)
    for action in self._actions:
      if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
        chosen = action.choices.get(getattr(namespace, action.dest, None) or "")
        if isinstance(chosen, ArgumentParser):
          names += chosen.defined_flags(namespace)
    return names

  def error(self, message: str) -> NoReturn:
    if message.startswith("the following arguments are required"):
      # A required flag misspelled is reported missing before the unknown flags are.
      for arg in getattr(self, "_given", []):
        close = renamed.closest_flags([arg], self.defined_flags())
        if close:
          message += f"; {arg.partition('=')[0]} is unknown: did you mean {close[0]}?"
    raise UsageError(f"{message} (see --help)")


def error_line(prog: str, message: str) -> str:
  """`<prog>: error: <message>` with `prog` as the user typed it after `python -m`."""
  return f"{prog}: error: {message}"


def run(main: Callable[[Sequence[str]], Optional[int]], argv: Sequence[str], prog: str,
        keep_heap: bool = True) -> int:
  """Runs `main(argv)` and turns its failures into one stderr line and an exit status.

  Args:
    main: the program; returns an exit status (None means 0).
    argv: the arguments after the program name.
    prog: the program's name in messages, e.g. "spot_jax.train".
    keep_heap: first apply `runtime.keep_heap()` (SPOT_JAX_MALLOC), before JAX starts. The
      benchmark's peer processes pass False unless asked: they run as their users run them.

  Returns:
    The exit status: main's, 2 for a user error, 1 for an unexpected one, 130 on Ctrl-C, 141
    (as for SIGPIPE) when whoever reads the output stopped early (`... | head`), silently.
  """
  argv = list(argv)
  debug = "--debug" in argv
  quiet_logs.quiet()
  try:
    if keep_heap:
      runtime.keep_heap()
    status = int(main(argv) or 0)
    sys.stdout.flush()  # here, not at exit, so a reader that went away is caught below
    return status
  except SystemExit:
    raise
  except BrokenPipeError:
    # The reader of stdout closed it (`| head`): not an error of the program. Later writes and
    # the interpreter's final flush go nowhere instead of raising again.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_BROKEN_PIPE
  except KeyboardInterrupt:
    _print(error_line(prog, "interrupted"))
    return 130
  except USER_ERRORS as e:
    if debug:
      raise
    _print(error_line(prog, one_line(e)))
    quiet_teardown()
    return EXIT_USER_ERROR
  except Exception as e:  # pylint: disable=broad-except
    if debug:
      raise
    _print(error_line(prog, f"internal error: {type(e).__name__}: {one_line(e)} "
                            f"(rerun with --debug for the traceback)"))
    quiet_teardown()
    return EXIT_INTERNAL_ERROR


def quiet_teardown() -> None:
  """After the error line, nothing else: drops exceptions raised while the process winds down.

  Background libraries (orbax's asyncio reads, tensorstore callbacks) can leave coroutines
  and callbacks behind when an error interrupts them; Python would print each one's traceback
  at garbage collection or from its thread ("Event loop is closed"). The error has already been
  reported in one line, so these are noise. `--debug` never reaches here.
  """
  sys.unraisablehook = _drop
  threading.excepthook = _drop
  gc.collect()


def _drop(unused_args) -> None:
  return None


def _print(line: str) -> None:
  sys.stdout.flush()
  print(line, file=sys.stderr, flush=True)
