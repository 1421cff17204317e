"""The kinds of gin files a training or evaluation command combines, checked before the rest.

A command gives a model file (gin/models/: sets MODEL, the frozen T5), a prompt file for prompt
methods (gin/prompts/: sets PROMPT, which a model file leaves None) and a run file (gin/runs/:
binds the function the program calls). One left out is named, with the folder to take it from,
as soon as the files are parsed: before the `--gin.X=V` overrides are judged, so an override
that only the missing file would have used (`--gin.PROMPT_LENGTH=10`) is not blamed for it.

  spot_jax.train: error: no prompt gin file: TRAINABLE='prompt' trains a prompt, and PROMPT is
  None; add a --gin_file from gin/prompts/ (e.g. gin/prompts/prompt_tuning_sampled_vocab.gin)
"""
from __future__ import annotations

from typing import Any, Sequence

from spot_jax.cli import gin_overrides
from spot_jax.errors import ConfigError

# The macros the shipped gin files agree on (each file's header says which it provides).
MODEL, PROMPT, TRAINABLE = "MODEL", "PROMPT", "TRAINABLE"
_UNSET = object()


def missing(kind: str, folder: str, example: str, why: str) -> ConfigError:
  """The one line for a kind of gin file left out: what shows it, then what to add."""
  return ConfigError(f"no {kind} gin file: {why}; add a --gin_file from {folder} (e.g. "
                     f"{example})")


def _macro(name: str) -> Any:
  """The value the files bind to macro `name`, or _UNSET."""
  return gin_overrides.bindings((name, gin_overrides.MACRO)).get("value", _UNSET)


def check(roots: Sequence[str], run_example: str) -> None:
  """Raises a one-line ConfigError naming the first kind of gin file the parsed files lack.

  Args:
    roots: the configurables the program calls ("spot_jax.train.train"); a run file binds them.
    run_example: the run file to suggest (the program's usual one).
  """
  selectors = gin_overrides.resolve_roots(roots)
  bound = {selector for _, selector in gin_overrides.config_keys()}
  if selectors is None or not set(selectors) <= bound:  # registered is not yet configured
    raise missing("run", "gin/runs/", run_example,
                  f"nothing configures {roots[0]}, which this program calls")
  read = gin_overrides.macros_read(selectors)
  if MODEL in read and _macro(MODEL) is _UNSET:
    raise missing("model", "gin/models/", "gin/models/t5_1_1_base.gin",
                  "nothing sets MODEL, the frozen T5 model")
  if PROMPT in read and TRAINABLE in read and _macro(TRAINABLE) == "prompt" and (
      _macro(PROMPT) in (None, _UNSET)):
    raise missing("prompt", "gin/prompts/", "gin/prompts/prompt_tuning_sampled_vocab.gin",
                  "TRAINABLE='prompt' trains a prompt, and PROMPT is None")
