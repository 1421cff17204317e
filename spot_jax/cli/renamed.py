"""Flag spellings: an old (renamed) flag or gin macro is refused in one line naming the new one,
and an unknown flag in one line naming the closest defined flag (the policy of every program;
`spot_jax.cli.runner.ArgumentParser` and `gin_flags` apply it)."""
from __future__ import annotations

from typing import Optional, Sequence

from spot_jax import validate

# Old spelling -> new spelling. Refused (never accepted silently) by every parser that defines
# the new flag and not the old one; see `spot_jax.cli.runner.ArgumentParser`.
RENAMED = {
    "--config_name": "--model",
    "--config": "--model",
    "--initial_checkpoint_path": "--checkpoint",
    "--inputs_length": "--input_length",
    "--targets_length": "--target_length",
    "--max_decode_length": "--target_length",
    "--out_dir": "--output_dir",
    "--work_dir": "--output_dir",
}
# Gin macros of the same policy (`--gin.OLD=...` is refused naming the new macro).
RENAMED_GIN = {
    "CHECKPOINT_DIR": "MODEL_DIR",  # spot_jax.eval reads a run directory like every program
}


def renamed_flag_message(argv: Sequence[str], defined: Sequence[str]) -> Optional[str]:
  """The refusal of the first old spelling in `argv` whose new name is in `defined`, or None."""
  for i, arg in enumerate(argv):
    old, sep, value = arg.partition("=")
    new = RENAMED.get(old)
    if new is None or old in defined or new not in defined:
      continue
    if not sep and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
      value, sep = argv[i + 1], "="
    return f"{old} was renamed {new}; use {new}{sep}{value}"
  return None


def closest_flags(unknown: Sequence[str], defined: Sequence[str]) -> list[str]:
  """The defined flag closest to each unknown "--flag" (or "--flag=..."), where one is close."""
  flags = [d for d in defined if d.startswith("--")]
  close = []
  for arg in unknown:
    name = arg.partition("=")[0]
    if name.startswith("--") and name not in flags:
      close += validate.close_names(name, flags, n=1, cutoff=0.75)
  return list(dict.fromkeys(close))


def unknown_flags_message(unknown: Sequence[str], defined: Sequence[str]) -> str:
  """"unrecognized arguments: --promt run1k; did you mean --prompt?" for the arguments a parser
  did not take."""
  close = closest_flags(unknown, defined)
  hint = f"; did you mean {' or '.join(close)}?" if close else ""
  return f"unrecognized arguments: {' '.join(unknown)}{hint}"
