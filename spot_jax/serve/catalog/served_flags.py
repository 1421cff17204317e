"""The flags `python -m spot_jax.infer` and `python -m spot_jax.serve` share, and their --prompt
entries read as (name, path) pairs."""
from __future__ import annotations

import pathlib
from typing import Sequence

from spot_jax import cli
from spot_jax.cli import flags
from spot_jax.errors import ConfigError


def add_served_flags(p: cli.ArgumentParser) -> None:
  """The flags `infer` and `serve` share: the backbone, and the prompts served on it."""
  flags.add_backbone(p, required=False, model_help="the frozen backbone: a config name or a gin "
                     "model file (default: the one the --prompt run directories recorded)",
                     checkpoint_help="the frozen backbone's checkpoint (default: the runs' "
                     "recorded one with no --model, else the random backbone of --seed)",
                     seed_help="seed of the random backbone (no --checkpoint) and of sampling")
  p.add_argument("--allow_backbone_change", action="store_true", help="serve run directories "
                 "on the --model/--checkpoint given, although they recorded another backbone")
  p.add_argument("--prompt", action="append", default=[], metavar="NAME=PATH",
                 help="a prompt (repeatable)")


def prompt_specs(values: Sequence[str]) -> list[tuple[str, str]]:
  """--prompt's entries as (name, path): NAME=PATH, or PATH named by its file, folder or id.

  Raises:
    ConfigError: an entry without a name or a path, or a name given twice.
  """
  specs = []
  for i, v in enumerate(values):
    name, sep, path = v.partition("=")
    if not sep:  # a library entry is named by its id, anything else by its file or folder
      name, path = (v.rsplit("#", 1)[1] if "#" in v else pathlib.Path(v.rstrip("/")).stem), v
    if not name or not path:
      raise ConfigError(f"--prompt entry {i} ({v!r}) is malformed; use --prompt NAME=PATH or "
                        f"--prompt PATH")
    if name in (n for n, _ in specs):
      raise ConfigError(f"--prompt entry {i} ({v!r}) repeats the name {name!r}; give each prompt "
                        f"its own NAME=PATH")
    specs.append((name, path))
  return specs
