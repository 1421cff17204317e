"""`python -m benchmarks.plan_table`: per-device memory of the trainer's step at real sizes.

  nice -n 10 python -m benchmarks.plan_table --markdown=/tmp/plan_table.md --json=/tmp/plan.json

For each model of `--models` (published shapes), the planner's measurement
(`spot_jax.train.plan.Planner`: the trainer's step compiled ahead of time on abstract weights,
XLA's memory analysis per device) of Prompt Tuning with `--prompt_length` tokens, AdamW, batch
`--batch_size` x (`--input_length` + `--target_length`) tokens, for every frozen weight format
(float32, bfloat16, and int8 / int4 of bfloat16 weights where qwix is installed) and remat none
and full. Activations are float32 with float32 weights and bfloat16 otherwise (`activations`,
as a bfloat16 model computes in transformers). Models in `FSDP_MODELS` are planned over
`--fsdp_devices` devices with FSDP=True, the others on one device. Each cell is compiled at
`--extrapolate_from` N and 2N layers (a T5's encoder and decoder both) and extrapolated linearly
to full depth; `--extrapolate_from=0` compiles at full depth (minutes per cell on 2 cores).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any, Optional, Sequence

from benchmarks import common
from spot_jax import cli, validate

MODELS = ("llama_3_2_3b", "llama_3_1_8b", "gemma_3_4b", "gemma_3_27b", "llama_3_1_70b",
          "t5_1_1_xxl")
FSDP_MODELS = ("gemma_3_27b", "llama_3_1_70b")
REMATS = ("none", "full")
GOALS = {  # (model, weights, remat): GiB per device
    ("llama_3_1_8b", "int8", "full"): 16.0,
    ("llama_3_2_3b", "bfloat16", "full"): 10.0,
    ("llama_3_1_70b", "bfloat16", "full"): 40.0,
}


def build_model(name: str, prompt_length: int, num_layers: Optional[int] = None,
                activation_dtype: str = "float32", overrides: Optional[dict] = None):
  """The prompted model of a registered config name (T5 or decoder-only), at `num_layers`
  layers (None: all; a T5 keeps its encoder and decoder depths equal), with `overrides` of its
  config's fields."""
  from spot_jax import models, prompts  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones import kinds  # pylint: disable=g-import-not-at-top
  prompt = prompts.PromptTuning(length=prompt_length)
  if name in kinds.named_configs("decoder"):
    from benchmarks.decoder_train_step import reduced_config  # pylint: disable=g-import-not-at-top
    from spot_jax.backbones import decoder  # pylint: disable=g-import-not-at-top
    config = reduced_config(name, num_layers).replace(dtype=activation_dtype,
                                                      **(overrides or {}))
    return models.DecoderOnlyModel(decoder.DecoderLM(config, prompt=prompt), z_loss=0.0)
  from spot_jax.backbones import t5  # pylint: disable=g-import-not-at-top
  config = t5.config_by_name(name, dtype=activation_dtype)
  if num_layers is not None:
    config = config.replace(num_encoder_layers=num_layers, num_decoder_layers=num_layers)
  config = config.replace(**(overrides or {}))
  return models.EncoderDecoderModel(t5.Transformer(config, prompt=prompt), z_loss=0.0)


def weight_formats() -> tuple[str, ...]:
  """The frozen weight formats this installation can plan."""
  from spot_jax.train import plan  # pylint: disable=g-import-not-at-top
  return plan.weight_formats()


def activations(weights: str, args) -> str:
  """The activation dtype of a row: `--activations`, or "auto": float32 with float32 weights,
  else bfloat16."""
  if args.activations != "auto":
    return args.activations
  return "float32" if weights == "float32" else "bfloat16"


def planner_for(name: str, devices: int, args, num_layers: Optional[int] = None,
                activation_dtype: str = "float32"):
  """The planner of one model at the table's batch on `devices` devices (at `num_layers`
  layers, else `--num_layers`)."""
  import jax  # pylint: disable=g-import-not-at-top
  from spot_jax import partitioning  # pylint: disable=g-import-not-at-top
  from spot_jax.train import optimizers, plan  # pylint: disable=g-import-not-at-top
  model = build_model(name, args.prompt_length, num_layers or args.num_layers,
                      activation_dtype=activation_dtype)
  mesh = partitioning.create_mesh(1, jax.devices()[:devices])
  return plan.Planner(model, optimizers.adamw(learning_rate=1e-3),
                      {"inputs": args.input_length, "targets": args.target_length}, mesh)


def depth_of(name: str) -> int:
  """Layers of a registered config (a T5's encoder layers)."""
  from spot_jax.backbones import kinds  # pylint: disable=g-import-not-at-top
  config = kinds.named_configs("decoder").get(name)
  return config.num_layers if config is not None else kinds.named_configs("t5")[
      name].num_encoder_layers


def extrapolated(found: Any, deeper: Any, depth: int, at: int) -> dict[str, Any]:
  """Bytes at `depth` layers from measurements at `at` and 2 * `at` layers (linear per layer)."""
  out = {}
  for key, value in found.as_dict().items():
    step = (deeper.as_dict()[key] - value) / at
    out[key] = value if key == "devices" else value + step * (depth - at)
  return out


def rows_of(name: str, args, log) -> list[dict[str, Any]]:
  """One model's cells: every weight format x remat policy (extrapolated from
  `--extrapolate_from` and twice as many layers unless it is 0 or reaches full depth)."""
  from spot_jax.train import plan  # pylint: disable=g-import-not-at-top
  fsdp = name in FSDP_MODELS
  devices = args.fsdp_devices if fsdp else 1
  at = args.extrapolate_from
  at = at if at and args.num_layers is None and 2 * at < depth_of(name) else None
  rows = []
  for weights in args.weights or weight_formats():
    dtype = activations(weights, args)
    planner = planner_for(name, devices, args, at, dtype)
    deeper = planner_for(name, devices, args, 2 * at, dtype) if at else None
    for remat in args.remats:
      setting = plan.Setting.of_format(weights, remat, fsdp, args.batch_size)
      t0 = time.perf_counter()
      found = planner.measure(setting)
      figures = found.as_dict()
      if deeper is not None:
        figures = extrapolated(found, deeper.measure(setting), depth_of(name), at)
      seconds = time.perf_counter() - t0
      goal = GOALS.get((name, weights, remat))
      row = dict(model=name, **dataclasses.asdict(setting), format=weights, activations=dtype,
                 **figures, compile_s=round(seconds, 1), goal_gib=goal,
                 extrapolated_from=None if at is None else [at, 2 * at])
      rows.append(row)
      log(f"{name} {weights} remat={remat} devices={devices}: "
          f"{figures['total'] / (1 << 30):.2f} GiB ({seconds:.0f} s)")
  return rows


def markdown(rows: Sequence[dict], args) -> str:
  """The table: one line per model, its weight formats' figures side by side."""
  gib = (1 << 30)
  depth = ("full depth" if not args.extrapolate_from else
           f"extrapolated linearly to full depth from {args.extrapolate_from} and "
           f"{2 * args.extrapolate_from} layers")
  formats = list(dict.fromkeys(r["format"] for r in rows))
  lines = [f"GiB per device; Prompt Tuning ({args.prompt_length} tokens), AdamW, batch "
           f"{args.batch_size} x ({args.input_length} + {args.target_length}) tokens; {depth}.",
           "", f"| model | devices | {' / '.join(formats)}: frozen weights | remat none: total "
           "| remat full: total | goal (remat full) |", "| --- | --- | --- | --- | --- | --- |"]
  cells = {(r["model"], r["format"], r["remat"]): r for r in rows}
  for name in dict.fromkeys(r["model"] for r in rows):
    mine = [r for r in rows if r["model"] == name]
    cell = lambda f, remat, key: (  # noqa: E731
        "-" if (name, f, remat) not in cells else f"{cells[name, f, remat][key] / gib:.2f}")
    frozen = {r["format"]: f"{r['frozen'] / gib:.2f}" for r in mine}
    goals = [f"{r['format']} <= {r['goal_gib']:g}: " + (
        "met" if r["total"] / gib <= r["goal_gib"] else "missed")
             for r in mine if r["goal_gib"] is not None and r["remat"] == "full"]
    devices = f"{mine[0]['devices']}" + (" FSDP" if mine[0]["fsdp"] else "")
    lines.append(f"| {name} | {devices} | {' / '.join(frozen.get(f, '-') for f in formats)} "
                 f"| {' / '.join(cell(f, 'none', 'total') for f in formats)} "
                 f"| {' / '.join(cell(f, 'full', 'total') for f in formats)} "
                 f"| {'; '.join(goals)} |")
  return "\n".join(lines) + "\n"


def parse(argv: Sequence[str]) -> argparse.Namespace:
  parser = cli.ArgumentParser(prog="benchmarks.plan_table", description=__doc__.splitlines()[0])
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--num_layers", type=int, default=None,
                      help="every model at this depth (default: full depth)")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--input_length", type=int, default=384)
  parser.add_argument("--target_length", type=int, default=128)
  parser.add_argument("--prompt_length", type=int, default=100)
  parser.add_argument("--fsdp_devices", type=int, default=8)
  parser.add_argument("--weights", default=None,
                      help="frozen weight formats (default: every one available)")
  parser.add_argument("--remats", default=",".join(REMATS), help="remat policies")
  parser.add_argument("--extrapolate_from", type=int, default=2,
                      help="compile at N and 2N layers and extrapolate linearly to full depth "
                           "(0: compile at full depth)")
  parser.add_argument("--activations", default="auto",
                      help="activation dtype: float32, bfloat16, or auto (float32 with float32 "
                           "weights, else bfloat16)")
  parser.add_argument("--json", default=None)
  parser.add_argument("--markdown", default=None)
  args = parser.parse_args(argv)
  for flag in ("batch_size", "input_length", "target_length", "prompt_length", "fsdp_devices"):
    validate.positive_int(getattr(args, flag), f"--{flag}")
  validate.positive_int(args.num_layers, "--num_layers", optional=True)
  validate.positive_int(args.extrapolate_from, "--extrapolate_from", minimum=0)
  validate.one_of(args.activations, "--activations", ("auto", "float32", "bfloat16"))
  args.weights = [validate.one_of(w, "--weights", weight_formats())
                  for w in (args.weights or "").split(",") if w]
  args.remats = [validate.one_of(r, "--remats", ("none", "full", "save_dots"))
                 for r in args.remats.split(",") if r]
  from spot_jax.backbones import kinds  # pylint: disable=g-import-not-at-top
  known = [n for kind in kinds.KINDS for n in kinds.named_configs(kind)]
  args.models = [validate.one_of(m.strip(), "--models", known)
                 for m in args.models.split(",") if m.strip()]
  return args


def main(argv: Sequence[str]) -> int:
  args = parse(argv)
  files = common.output_files(args)
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", args.fsdp_devices)
  rows = []
  for name in args.models:
    rows.extend(rows_of(name, args, lambda line: print(line, file=sys.stderr, flush=True)))
    common.write_outputs(files, {"rows": rows}, markdown(rows, args))  # so far, kept if stopped
  table = markdown(rows, args)
  print(table)
  common.write_outputs(files, {"rows": rows, "args": {k: v for k, v in vars(args).items()
                                                       if k not in ("json", "markdown")}}, table)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "benchmarks.plan_table"))
