"""Command-line plumbing shared by every `python -m spot_jax.<prog>` (nothing below imports it).

  runner          the error boundary: one line and exit 2 for user errors, 1 for bugs
  flags           the shared flag vocabulary (backbone, lengths, outputs) and list checks
  renamed         old flag and macro spellings, refused naming the new ones
  model_flag      --model as a config name or a gin model file
  gin_flags       t5x-style --gin_file / --gin.KEY=VALUE command lines
  gin_files       the kinds of gin files a command combines (models/, prompts/, runs/), checked
                  before the rest
  gin_overrides   gin files and overrides: one-line errors, overrides nothing uses are refused
  gin_settings    values type-checked against their parameters, errors named by their binding
  distributed     joining a multi-process job (jax.distributed)
"""
from spot_jax.cli.runner import (EXIT_BROKEN_PIPE, EXIT_INTERNAL_ERROR, EXIT_USER_ERROR,
                                 USER_ERRORS, ArgumentParser, UsageError, error_line,
                                 quiet_teardown, run)
from spot_jax.errors import one_line

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_INTERNAL_ERROR", "EXIT_USER_ERROR", "USER_ERRORS",
           "ArgumentParser", "UsageError", "error_line", "one_line", "quiet_teardown", "run"]
