"""The flag vocabulary shared by the argparse programs (gin programs keep t5x's macro names).

  backbone  --model            a config name (t5_1_1_lm100k_base) or a gin model file
            --model_binding    gin bindings for a gin model file (repeatable)
            --checkpoint       the frozen backbone's checkpoint (omitted: the random backbone
                               of --seed)
            --seed
  lengths   --input_length, --target_length
  output    --output_dir       a directory the program writes
            --output           one file the program writes

A flag that was renamed is refused with one line naming its new spelling (`RENAMED`, applied by
`spot_jax.cli.ArgumentParser` to every program). List-valued flags are checked entry by entry
(`int_list`, `name_list`, `pairs`), each message naming the flag, the entry and its index.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Optional, Sequence

from spot_jax.errors import ConfigError

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
                        help="gin binding for a gin --model file, e.g. \"DROPOUT_RATE=0.0\" (repeatable)")
  if checkpoint:
    parser.add_argument("--checkpoint", default=None,
                        help=checkpoint_help or "the frozen backbone's checkpoint: T5X, orbax or Hugging "
                        "Face directory (omitted: the random backbone of --seed, for tests)")
  if seed:
    parser.add_argument("--seed", type=int, default=0,
                        help=seed_help or "seed of the random backbone (no --checkpoint) and of the run")


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


def positive(flag: str, value, minimum: int = 1) -> Optional[int]:
  """`value` (None passes) if it is an integer >= `minimum`; else a ConfigError naming `flag`."""
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    valid = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    raise ConfigError(f"{flag}={value!r} must be {valid}")
  return value


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
      raise ConfigError(f"{flag}={value!r}: entry {i} ({name!r}) is unknown; valid: {', '.join(valid)}")
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
  """The T5Config of `--model` (a config name or a gin model file), with `overrides` applied.

  Raises:
    ConfigError: an unknown config name or gin file, or --model_binding without a gin file.
  """
  if spec.endswith(".gin"):
    from spot_jax.spot import settings  # pylint: disable=g-import-not-at-top
    config = settings.load_model(spec, bindings)[0].config
  else:
    if bindings:
      raise ConfigError(f"--model_binding applies to a gin model file; --model={spec} is a config "
                        f"name (give --model=<file>.gin, or drop --model_binding)")
    from spot_jax.t5.config import config_by_name  # pylint: disable=g-import-not-at-top
    config = config_by_name(spec)
  return dataclasses.replace(config, **overrides) if overrides else config


def add_run_settings(parser: argparse.ArgumentParser, seed: bool = False) -> None:
  """The backbone, data, budget and metric flags of the SPoT layer's runs (study, retrieve);
  `run_settings` reads them."""
  add_backbone(parser, seed=seed, seed_help="seed of the runs (and of the random backbone "
               "without --checkpoint)")
  parser.add_argument("--task_module", default="tasks",
                      help="module(s) registering the tasks, comma-separated (default: tasks)")
  add_lengths(parser, 512, 16)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--train_steps", type=int, default=30000)
  parser.add_argument("--embedding_step", type=int, default=10000,
                      help="the early step whose prompt is the task embedding")
  parser.add_argument("--eval_period", type=int, default=1000)
  parser.add_argument("--checkpoint_period", type=int, default=None,
                      help="steps between checkpoints (default: --eval_period)")
  parser.add_argument("--eval_batch_size", type=int, default=32)
  parser.add_argument("--eval_num_examples", type=int, default=None)
  parser.add_argument("--prompt_length", type=int, default=100)
  parser.add_argument("--learning_rate", type=float, default=0.3)
  parser.add_argument("--metric", default="accuracy",
                      help="validation metric selecting the best prompt (default: accuracy)")
  parser.add_argument("--task_metric", action="append", default=[],
                      help="per-task metric, TASK=METRIC (repeatable), e.g. "
                           "spot_glue_stsb_v200=pearson_corrcoef")
  parser.add_argument("--metric_max", type=float, default=100.0,
                      help="best possible metric value (errors are metric_max - score)")


def run_settings(args: argparse.Namespace):
  """`spot.settings.RunSettings` from the `add_run_settings` flags, each checked by name."""
  from spot_jax.spot import settings  # pylint: disable=g-import-not-at-top
  for flag in ("input_length", "target_length", "batch_size", "eval_batch_size"):
    positive(f"--{flag}", getattr(args, flag))
  positive("--eval_num_examples", args.eval_num_examples)
  for flag in ("learning_rate", "metric_max"):
    if not getattr(args, flag) > 0:  # NaN fails too
      raise ConfigError(f"--{flag}={getattr(args, flag)} must be a positive number")
  positive("--prompt_length", args.prompt_length)
  if args.input_length < args.prompt_length:
    raise ConfigError(f"--input_length={args.input_length} is shorter than --prompt_length="
                      f"{args.prompt_length}; the input length counts real tokens only and must be "
                      f"at least the prompt length")
  task_metrics = pairs("--task_metric", args.task_metric, "spot_glue_stsb_v200=pearson_corrcoef")
  model, name = settings.load_model(args.model, args.model_binding)
  return settings.RunSettings(
      model=model, model_name=name, initial_checkpoint_path=args.checkpoint,
      task_module=args.task_module,
      lengths={"inputs": args.input_length, "targets": args.target_length},
      batch_size=args.batch_size, train_steps=args.train_steps,
      embedding_step=args.embedding_step, eval_period=args.eval_period,
      checkpoint_period=args.checkpoint_period,
      eval_batch_size=args.eval_batch_size, eval_num_examples=args.eval_num_examples,
      prompt_length=args.prompt_length, learning_rate=args.learning_rate, metric=args.metric,
      task_metrics=task_metrics, metric_max=args.metric_max,
      fingerprint=settings.model_fingerprint(model, args.checkpoint, 0))
