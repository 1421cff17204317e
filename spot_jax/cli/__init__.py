"""Command-line plumbing shared by every `python -m spot_jax.<prog>` (nothing below imports it).

  runner          the error boundary: one line and exit 2 for user errors, 1 for bugs
  gin_flags       t5x-style --gin_file / --gin.KEY=VALUE command lines
  gin_overrides   overrides that the configuration never uses are refused
  distributed     joining a multi-process job (jax.distributed)
"""
from spot_jax.cli.runner import (EXIT_INTERNAL_ERROR, EXIT_USER_ERROR, USER_ERRORS, ArgumentParser,
                                 UsageError, error_line, one_line, quiet_teardown, run)

__all__ = ["EXIT_INTERNAL_ERROR", "EXIT_USER_ERROR", "USER_ERRORS", "ArgumentParser", "UsageError",
           "error_line", "one_line", "quiet_teardown", "run"]
