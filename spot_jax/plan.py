"""`python -m spot_jax.plan`: the memory a training run (or serving) needs per device.

  python -m spot_jax.plan --gin_file=gin/models/llama_3_1_8b.gin \
    --gin_file=gin/prompts/prompt_tuning_uniform.gin --gin_file=gin/runs/prompt_tune.gin \
    --gin.PROMPT_LENGTH=100 --gin.BATCH_SIZE=8 \
    --gin.TASK_FEATURE_LENGTHS="{'inputs': 384, 'targets': 128}" \
    --devices=8 --device_memory=24GiB

The same gin files and overrides as `python -m spot_jax.train` (MODEL_DIR and the task may be
left out: nothing is read or written). The trainer's step is compiled ahead of time on abstract
weights, on this host's CPU split into `--devices` devices; see `spot_jax.train.plan`.
`--for=serve --slots=N --max_length=L`: weights plus the key/value cache of N sequences of L.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from spot_jax import validate
from spot_jax.cli import gin_flags

ROOTS = ("spot_jax.train.train",)
GIN_ROOTS = ROOTS
# Macros the run files require that the planner never reads (a user's value still wins).
PLACEHOLDERS = ("MODEL_DIR='/nonexistent/spot_jax.plan'",
                "MIXTURE_OR_TASK_NAME='spot_jax.plan: no task is read'")


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--devices", type=int, default=1,
                      help="devices to plan for (the mesh: devices / NUM_PARTITIONS x "
                           "NUM_PARTITIONS); this host's CPU is split into as many")
  parser.add_argument("--device_memory", default=None,
                      help="memory of one device, e.g. 24GiB, 80GB: say whether the setting fits, "
                           "and if not, name the nearest that does (exit 2)")
  parser.add_argument("--for", dest="purpose", default="train", choices=("train", "serve"),
                      help="train (the train step) or serve (weights + key/value cache)")
  parser.add_argument("--slots", type=int, default=8, help="--for=serve: sequences served at once")
  parser.add_argument("--max_length", type=int, default=2048,
                      help="--for=serve: positions per sequence (prompt and generated tokens)")
  parser.add_argument("--json", default=None,
                      help="also write the figures (bytes per device) to this JSON file")


def before_jax(args: argparse.Namespace) -> None:
  """The planner compiles on CPU, split into --devices devices, before JAX starts."""
  args.cpu_devices = validate.positive_int(args.devices, "--devices")
  if args.device_memory is not None:
    validate.byte_size(args.device_memory, "--device_memory")
  if args.json:
    validate.output_file(args.json, "--json")
  import jax  # pylint: disable=g-import-not-at-top
  try:
    jax.config.update("jax_platforms", "cpu")
  except RuntimeError:  # already started (a caller's process): its CPU devices are used
    pass
  args.gin_defaults = [b for b in PLACEHOLDERS
                       if not any(g.startswith(b.split("=")[0] + "=") for g in args.gin_bindings)]


def main(args: argparse.Namespace) -> int:
  import gin  # pylint: disable=g-import-not-at-top
  from spot_jax import train  # pylint: disable=g-import-not-at-top
  from spot_jax.train import plan  # pylint: disable=g-import-not-at-top
  bound = gin.get_bindings(train.train)
  common = {"model": bound["model"], "devices": args.devices,
            "num_partitions": bound.get("num_partitions", 1), "fsdp": bound.get("fsdp", False),
            "device_memory": args.device_memory}
  if args.purpose == "serve":
    plan.plan_serving(slots=validate.positive_int(args.slots, "--slots"),
                               max_length=validate.positive_int(args.max_length, "--max_length"),
                               json_path=args.json, **common)
    return 0
  plan.plan_training(train_dataset_cfg=bound["train_dataset_cfg"],
                     optimizer=bound.get("optimizer"),
                     shard_prompt_embed=bound.get("shard_prompt_embed", False),
                     dropout_rng=bound.get("dropout_rng", "threefry"),
                     trainable=bound.get("trainable", "prompt"), seeds=bound.get("seeds"),
                     tasks=bound.get("tasks"), json_path=args.json, **common)
  return 0


def run(argv: Sequence[str]) -> int:
  return gin_flags.run(main, argv, "spot_jax.plan", __doc__.splitlines()[0], ROOTS,
                       add_arguments=add_arguments, before_jax=before_jax)


if __name__ == "__main__":
  sys.exit(run(sys.argv[1:]))
