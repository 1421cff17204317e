"""The flag vocabulary shared by the argparse programs (gin programs keep t5x's macro names).

  backbone  --model            a config name (t5_1_1_lm100k_base) or a gin model file
            --model_binding    gin bindings for a gin model file (repeatable)
            --checkpoint       the frozen backbone's checkpoint (omitted: the random backbone
                               of --seed)
            --seed
  lengths   --input_length, --target_length
  output    --output_dir       a directory the program writes
            --output           one file the program writes

A flag that was renamed is refused with one line naming its new spelling (`spot_jax.cli.renamed`,
applied by `spot_jax.cli.ArgumentParser` to every program). List-valued flags are checked entry
by entry (`int_list`, `name_list`, `pairs`), each message naming the flag, the entry and its index.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Optional, Sequence

from spot_jax.errors import ConfigError

def add_backbone(parser: argparse.ArgumentParser, *, required: bool = True, gin_files: bool = True,
                 checkpoint: bool = True, seed: bool = True, model_help: str = "",
                 checkpoint_help: str = "", seed_help: str = "", model_default: Optional[str] = None
                 ) -> None:
  """--model [--model_binding] [--checkpoint] [--seed]: the frozen backbone."""
  what = ("a config name (e.g. t5_1_1_lm100k_base) or a gin model file (e.g. "
          "gin/models/t5_1_1_lm100k_base.gin)" if gin_files else "a config name (e.g. t5_small)")
  parser.add_argument("--model", required=required, default=model_default,
                      help=model_help or f"the frozen backbone: {what}")
  if gin_files:
    parser.add_argument("--model_binding", action="append", default=[],
                        help="gin binding for a gin --model file, e.g. \"DROPOUT_RATE=0.0\" "
                             "(repeatable)")
  if checkpoint:
    parser.add_argument("--checkpoint", default=None,
                        help=checkpoint_help or "the frozen backbone's checkpoint: T5X, orbax or "
                        "Hugging Face directory (omitted: the random backbone of --seed, for "
                        "tests)")
  if seed:
    parser.add_argument("--seed", type=int, default=0,
                        help=seed_help
                        or "seed of the random backbone (no --checkpoint) and of the run")


def add_lengths(parser: argparse.ArgumentParser, input_length: Optional[int], target_length: int,
                input_help: str = "", target_help: str = "") -> None:
  """--input_length and --target_length (tokens, EOS included, prompt excluded)."""
  parser.add_argument("--input_length", type=int, default=input_length,
                      help=input_help or "encoder tokens per input (EOS included, prompt excluded)")
  parser.add_argument("--target_length", type=int, default=target_length,
                      help=target_help or "decoder tokens per target (EOS included)")


def add_output_dir(parser: argparse.ArgumentParser, help: str, *,  # pylint: disable=redefined-builtin
                   required: bool = False, default: Optional[str] = None) -> None:
  """--output_dir: a directory the program writes."""
  parser.add_argument("--output_dir", required=required, default=default, help=help)


def add_output(parser: argparse.ArgumentParser, help: str, *,  # pylint: disable=redefined-builtin
               required: bool = False) -> None:
  """--output: one file the program writes."""
  parser.add_argument("--output", required=required, default=None, help=help)


def _entries(flag: str, value: str) -> list[str]:
  entries = [v.strip() for v in value.split(",")]
  if entries == [""]:
    raise ConfigError(f"{flag} is empty; give comma-separated values")
  for i, entry in enumerate(entries):
    if not entry:
      raise ConfigError(f"{flag}={value!r}: entry {i} is empty; give comma-separated values "
                        f"without empty entries")
  return entries


def int_list(flag: str, value: str, minimum: Optional[int] = None) -> tuple[int, ...]:
  """Comma-separated integers, each checked (>= minimum); errors name the entry and its index."""
  out = []
  for i, entry in enumerate(_entries(flag, value)):
    try:
      number = int(entry)
    except ValueError:
      raise ConfigError(f"{flag}={value!r}: entry {i} ({entry!r}) is not an integer; give "
                        f"comma-separated integers, e.g. 0,1,2") from None
    if minimum is not None and number < minimum:
      raise ConfigError(f"{flag}={value!r}: entry {i} ({number}) must be >= {minimum}")
    out.append(number)
  return tuple(out)


def name_list(flag: str, value: str, valid: Optional[Sequence[str]] = None,
              unique: bool = True) -> tuple[str, ...]:
  """Comma-separated names, each one of `valid` if given; duplicates are refused if `unique`."""
  names = _entries(flag, value)
  seen = set()
  for i, name in enumerate(names):
    if valid is not None and name not in valid:
      raise ConfigError(f"{flag}={value!r}: entry {i} ({name!r}) is unknown; valid: "
                        f"{', '.join(valid)}")
    if unique and name in seen:
      raise ConfigError(f"{flag}={value!r}: entry {i} ({name!r}) repeats an earlier entry")
    seen.add(name)
  return tuple(names)


def pairs(flag: str, items: Sequence[str], example: str) -> dict[str, str]:
  """Repeated KEY=VALUE flags; a malformed or repeated item is named with its index."""
  out: dict[str, str] = {}
  for i, item in enumerate(items):
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
      raise ConfigError(f"{flag} entry {i} ({item!r}) is malformed; give KEY=VALUE, e.g. {example}")
    if key.strip() in out:
      raise ConfigError(f"{flag} entry {i} ({item!r}) repeats the key {key.strip()!r}")
    out[key.strip()] = value.strip()
  return out


def model_config(spec: str, bindings: Sequence[str] = (), **overrides):
  """The backbone config of `--model` (a T5 or decoder-only config name, or a gin model file),
  with `overrides` applied where the config has the field (a decoder-only config has no
  dropout: `dropout_rate=0.0` holds for it as it is).

  Raises:
    ConfigError: an unknown config name or gin file, or --model_binding without a gin file.
  """
  if spec.endswith(".gin"):
    from spot_jax.cli import model_flag  # pylint: disable=g-import-not-at-top
    config = model_flag.load_model(spec, bindings, allow_decoder=True)[0].config
  else:
    if bindings:
      raise ConfigError(f"--model_binding applies to a gin model file; --model={spec} is a config "
                        f"name (give --model=<file>.gin, or drop --model_binding)")
    from spot_jax.backbones import kinds  # pylint: disable=g-import-not-at-top
    decoders = kinds.named_configs("decoder")
    if spec in decoders:
      config = decoders[spec]
    else:
      from spot_jax.backbones.t5.config import config_by_name  # pylint: disable=g-import-not-at-top
      config = config_by_name(spec)
  fields = {f.name for f in dataclasses.fields(config)}
  overrides = {k: v for k, v in overrides.items() if k in fields}
  return dataclasses.replace(config, **overrides) if overrides else config
