"""`python -m benchmarks`: train-step speed, FLOPs, MFU and memory of each method on a random T5.

  python -m benchmarks --model=t5_small --batch_size=8 --input_length=128 \
      --target_length=16 --dropout_rate=0.1 --steps=5 --json=bench.json --markdown=bench.md

For each method it compiles the jitted train step (compile time measured on its own, and compile
plus first step), runs `--warmup` steps, then times `--steps` steps one by one and reports the
median step time, examples/s, tokens/s (input + target tokens), XLA's FLOPs per step (cost
analysis of the compiled step), MFU against the largest float32 matmul peak sampled through the
run (after every timed step; an MFU above 100% is flagged, not reported), the
median inference (teacher-forced scoring) step time, trainable parameters, trainable state bytes
and the process's peak host memory (ru_maxrss, cumulative over the rows of one run).
`--interleave` compares methods on a machine whose speed drifts: every step is built first, then
each round times one step of each method (order reversed every other round), and each row reports
its paired step-time ratio to the first method (the median over the rounds) beside its FLOP
ratio. `--input_lengths=64,128,256` runs every method at each length (interleaved: all in one
run, each length's rows paired with the first method at that length).
`--compilation_cache_dir` turns on JAX's persistent compilation cache, so a second run of the
same shape skips compiling. `--vs=peft` times the PyTorch + PEFT counterparts, `--vs=t5x` t5x's
train step of prompt-tuning's model and of spot-jax's contrib model (`bench.t5x_peer`), each in a
separate process (`peers.peft_train`, `peers.t5x_train`). Benchmark in float32 on CPUs without bf16
hardware. Targets for speed and memory live here and in docs/benchmarks.md, never in timed tests.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np

from spot_jax import cli, models, partitioning
from benchmarks.peers import compare_peft as peft_peer
from benchmarks.tables import markdown_table, paired_lines
from benchmarks.peers import compare_t5x as t5x_peer
from benchmarks.peers import worker as bench_worker
from spot_jax.cli import distributed, flags
from spot_jax import runtime
from spot_jax import train as train_lib
from spot_jax import validate
from benchmarks import common
from benchmarks.common import (DEFAULT_METHODS, METHODS, OVERRIDE_FLAGS, SHAPE_FIELDS,
                               T5X_DROPOUT_RNGS, bench_config, device_batch,
                                   hlo_op_counts, nbytes, timed, xla_flops)
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import config_by_name
from spot_jax.train.state import TrainState

@contextlib.contextmanager
def _bench_mesh():
  """The trainer's data-parallel mesh and logical rules; yields (replicated, batch-split) shardings.

  With several devices (--cpu_devices) the batch is split and the rest replicated.
  """
  mesh = partitioning.create_mesh(1)
  with jax.set_mesh(mesh), nn.logical_axis_rules(list(partitioning.logical_rules())):
    yield partitioning.replicated(mesh), partitioning.batch_sharding(mesh)


@dataclasses.dataclass
class _Run:
  """One method's compiled train step, its live state, and what building it measured."""
  model: models.EncoderDecoderModel
  step: Callable
  state: TrainState
  frozen: Any
  batch: Any
  metrics: Any
  row: dict  # the fields known before timing (shape, compile times, FLOPs, parameter counts)

  def time_step(self) -> float:
    """Runs one train step to completion; its wall time in seconds."""
    t0 = time.perf_counter()
    self.state, self.metrics = self.step(self.state, self.frozen, self.batch)
    jax.block_until_ready(self.metrics["loss"])
    return time.perf_counter() - t0


def _prepare(method: str, config_name: str, batch_size: int, input_length: int, target_length: int,
             prompt_length: int, shardings, *, dropout_rate: float, warmup: int, seed: int,
             config_overrides: Optional[dict], dropout_rng: str) -> _Run:
  """Builds `method`'s model and state, compiles its train step
  (timed) and runs 1 + `warmup` steps."""
  kind, length = METHODS[method]
  length = prompt_length if length is None else length
  config = bench_config(config_name, config_overrides, dropout_rate)
  model = common.bench_model(kind, length, config, input_length)
  dummy = model.dummy_batch(input_length, target_length)
  frozen, params, tx, state_rng = common.initial_params(kind, model, dummy, seed)
  state = TrainState.create(params, tx, state_rng)
  batch = common.with_task_index(kind, device_batch(config.vocab_size, batch_size, input_length,
                                                   target_length, seed))
  rep, split = shardings
  state, frozen, batch = jax.device_put((state, frozen, batch), (rep, rep, split))

  t0 = time.perf_counter()
  traced = jax.jit(train_lib.make_train_step(model, tx, dropout_rng), donate_argnums=(0,),
                   in_shardings=(rep, rep, split),
                   out_shardings=(rep, rep)).trace(state, frozen, batch)
  trace_s = time.perf_counter() - t0
  lowered = traced.lower()
  lower_s = time.perf_counter() - t0
  step = lowered.compile()
  compile_s = time.perf_counter() - t0
  state, metrics = step(state, frozen, batch)
  jax.block_until_ready(metrics["loss"])
  first_step_s = time.perf_counter() - t0
  flops = xla_flops(step)  # XLA counts one device's share of an SPMD program
  flops = flops * jax.device_count() if flops else flops
  for _ in range(warmup):
    state, metrics = step(state, frozen, batch)
  jax.block_until_ready(metrics["loss"])
  row = {
      "method": method, "prompt_method": kind, "prompt_length": length if model.has_prompt else 0,
      "config": config_name, "config_overrides": dict(config_overrides or {}),
      "shape": {k: getattr(config, k) for k in SHAPE_FIELDS}, "batch_size": batch_size,
      "input_length": input_length, "target_length": target_length, "dropout_rate": dropout_rate,
      "trace_sec": trace_s, "lower_sec": lower_s, "compile_sec": compile_s,
      "compile_plus_first_step_sec": first_step_s, "hlo_ops": hlo_op_counts(lowered, step),
      "flops_per_step": flops,
      "trainable_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(state.params))),
      "trainable_state_bytes": nbytes(state.params) + nbytes(state.opt_state),
      "frozen_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(frozen))),
      "devices": jax.device_count(), "dropout_rng": dropout_rng, "malloc": runtime.applied(),
  }
  return _Run(model, step, state, frozen, batch, metrics, row)


def prepare_run(method: str, config_name: str, batch_size: int, input_length: int,
                target_length: int, prompt_length: int, **kwargs) -> _Run:
  """`method`'s compiled train step under the bench's mesh, after 1 + `warmup` steps.

  For a peer timing spot-jax's step in its own process (`peers.t5x_train --spot_jax_step`);
  `kwargs` are `_prepare`'s (dropout_rate, warmup, seed, config_overrides, dropout_rng).
  """
  with _bench_mesh() as shardings:
    return _prepare(method, config_name, batch_size, input_length, target_length, prompt_length,
                    shardings, **kwargs)


def _finish(run: _Run, times: Sequence[float], *, inference_steps: int,
            peak: Optional[common.MatmulPeak], timing: str) -> dict:
  """The result row: `run`'s build-time fields, its step times and its inference step."""
  merged = models.merge_params(run.frozen, run.state.params)
  score = jax.jit(run.model.score_batch)
  jax.block_until_ready(score(merged, run.batch))
  infer_s = float(np.median(timed(lambda: score(merged, run.batch), inference_steps)))
  step_s = float(np.median(times))
  row, flops = dict(run.row), run.row["flops_per_step"]
  batch_size, tokens = row["batch_size"], row["input_length"] + row["target_length"]
  row.update({
      "timing": timing, "steps": len(times), "step_sec_all": [float(t) for t in times],
      "step_sec_median": step_s, "step_sec_min": float(min(times)),
      "step_sec_max": float(max(times)), "steps_per_sec": 1.0 / step_s,
      "examples_per_sec": batch_size / step_s, "tokens_per_sec": batch_size * tokens / step_s,
      "inference_step_sec_median": infer_s,
      "achieved_flops_per_sec": flops / step_s if flops else None,
      **common.mfu(flops, step_s, peak.max if peak else None),
      "matmul_peak_flops_per_sec": peak.max if peak else None,
      "peak_host_memory_bytes": bench_worker.peak_host_memory_bytes(),
      "final_loss": float(run.metrics["loss"]),
      "load_average_1min": os.getloadavg()[0],  # other jobs on a shared machine distort timings
  })
  return row


def round_order(num_methods: int, round_index: int) -> list[int]:
  """The order of the methods in one interleaved round: as given, reversed every other round."""
  order = list(range(num_methods))
  return order if round_index % 2 == 0 else order[::-1]


def bench_methods(methods: Sequence[str], config_name: str, batch_size: int, input_length: int,
                  target_length: int, steps: int, prompt_length: int, *, interleave: bool = False,
                  input_lengths: Optional[Sequence[int]] = None,
                  dropout_rate: float = 0.1, warmup: int = 1, inference_steps: int = 3,
                  seed: int = 0, peak: Optional[common.MatmulPeak] = None,
                  config_overrides: Optional[dict] = None, dropout_rng: str = "threefry"
                  ) -> list[dict]:
  """Compiles and times each method's train step (and its inference step); one row per method
  and input length (`input_lengths`, default [input_length]).

  Without `interleave` each (method, length) is built and timed in turn. With it every step is
  built first, then `steps` rounds run one step of each (`round_order`), so a change of the
  machine's speed during the run falls on every row alike; each row also gets
  `paired_step_ratio`: the median over the rounds of its step time over the first method's at
  the same input length in the same round, and `flop_ratio`, the same ratio of XLA's FLOPs.
  `config_overrides` are `T5Config` fields replacing the named config's (e.g. num_heads=8).
  With `peak`, the matmul peak is sampled after every timed step and each row's MFU divides by
  the largest sample so far (see `common.MatmulPeak`).
  """
  cases = [(m, length) for length in (input_lengths or [input_length]) for m in methods]
  rows = []
  for group in [cases] if interleave else [[c] for c in cases]:
    with _bench_mesh() as shardings:
      runs = [_prepare(m, config_name, batch_size, length, target_length, prompt_length,
                       shardings, dropout_rate=dropout_rate, warmup=warmup, seed=seed,
                       config_overrides=config_overrides, dropout_rng=dropout_rng)
              for m, length in group]
      times = [[] for _ in runs]
      for r in range(steps):
        for i in round_order(len(runs), r):
          times[i].append(runs[i].time_step())
          if peak is not None:
            peak.sample()
      rows += [_finish(run, t, inference_steps=inference_steps, peak=peak,
                       timing="interleaved" if interleave else "sequential")
               for run, t in zip(runs, times)]
  if interleave:
    for row in rows:
      first = next(r for r in rows if r["input_length"] == row["input_length"])
      row["paired_with"] = first["method"]
      row["paired_step_ratio"] = float(np.median(np.asarray(row["step_sec_all"])
                                                 / np.asarray(first["step_sec_all"])))
      if row["flops_per_step"] and first["flops_per_step"]:
        row["flop_ratio"] = row["flops_per_step"] / first["flops_per_step"]
  return rows


def _parse(argv: Sequence[str]):
  parser = cli.ArgumentParser(prog="benchmarks", description=__doc__.splitlines()[0])
  flags.add_backbone(parser, required=False, gin_files=False, checkpoint=False, seed=False,
                     model_help="a spot_jax.backbones.t5 config name (default t5_small; "
                                "t5_1_1_small_like "
                                "with --vs=t5x)")
  parser.add_argument("--methods", default=None,
                      help=f"comma-separated, from: {', '.join(METHODS)} (default "
                           f"{','.join(DEFAULT_METHODS)}; pt100 with --vs=t5x)")
  parser.add_argument("--batch_size", type=int, default=8)
  flags.add_lengths(parser, 128, 16)
  parser.add_argument("--input_lengths", default=None,
                      help="comma-separated input lengths, each method at each (with --interleave: "
                           "all in one interleaved run, ratios paired per length)")
  parser.add_argument("--prompt_length", type=int, default=100,
                      help="length for the methods named without one (prompt_tuning, "
                           "smop, residual)")
  parser.add_argument("--dropout_rate", type=float, default=0.1)
  parser.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
  parser.add_argument("--warmup", type=int, default=1, help="untimed steps after the first")
  parser.add_argument("--interleave", action="store_true",
                      help="build every method's step first, then time --steps rounds of one step "
                           "of each (order reversed every other round) and report each method's "
                           "paired step-time ratio to the first: for comparing methods on a "
                           "machine whose speed drifts")
  parser.add_argument("--inference_steps", type=int, default=3)
  parser.add_argument("--compilation_cache_dir", default=None,
                      help="JAX persistent compilation cache directory (a rerun skips compiling)")
  parser.add_argument("--json", default=None, help="write the result rows to this file")
  parser.add_argument("--markdown", default=None, help="write a Markdown table to this file")
  parser.add_argument("--vs", default="", choices=("", "peft", "t5x"),
                      help="also time the PyTorch + PEFT counterparts, or t5x's step of "
                           "prompt-tuning's model and of spot-jax's contrib model for the "
                           "prompt_tuning rows (separate processes; with --interleave the t5x "
                           "process also times spot-jax's step in interleaved rounds)")
  for name in OVERRIDE_FLAGS:
    parser.add_argument(f"--{name}", type=int, default=None,
                        help=f"override the config's {name}" + (" (encoder and decoder)"
                                                                 if name == "num_layers" else ""))
  parser.add_argument("--dropout_rng", default="threefry", choices=train_lib.DROPOUT_RNGS,
                      help="PRNG of the dropout masks (the trainer's DROPOUT_RNG)")
  parser.add_argument("--cpu_devices", default=None,
                      help="split the CPU into this many JAX devices and run the trainer's "
                           "data-parallel mesh over them (as `spot_jax.train --cpu_devices`)")
  parser.add_argument("--peer_malloc", default="system", choices=runtime.MODES,
                      help="host memory settings of the --vs peer's process: its defaults "
                           "(system), or spot-jax's own (keep; see SPOT_JAX_MALLOC)")
  return parser.parse_args(argv)


def _input_lengths(args) -> list[int]:
  """--input_lengths (comma-separated) when given, else [--input_length]."""
  if not args.input_lengths:
    return [args.input_length]
  try:
    return [int(t) for t in args.input_lengths.split(",")]
  except ValueError:
    raise ConfigError(f"--input_lengths={args.input_lengths!r} is not a comma-separated list of "
                      f"integers; e.g. --input_lengths=64,128,256") from None


def main(argv: Sequence[str]) -> int:
  args = _parse(argv)
  if args.model is None:
    args.model = "t5_1_1_small_like" if args.vs == "t5x" else "t5_small"
  if args.methods is None:
    args.methods = "pt100" if args.vs == "t5x" else ",".join(DEFAULT_METHODS)
  # a method may repeat: --interleave times A, B, A to see the drift of A against itself
  methods = list(flags.name_list("--methods", args.methods, list(METHODS), unique=False))
  outputs = common.output_files(args)
  config_by_name(args.model)
  overrides = {k: validate.positive_int(getattr(args, k), f"--{k}")
               for k in OVERRIDE_FLAGS if getattr(args, k) is not None}
  lengths = _input_lengths(args)
  for flag in ("batch_size", "target_length", "steps", "prompt_length", "inference_steps"):
    validate.positive_int(getattr(args, flag), f"--{flag}")
  for length in lengths:
    validate.positive_int(length, "--input_lengths" if args.input_lengths else "--input_length")
  validate.positive_int(args.warmup, "--warmup", minimum=0)
  validate.fraction(args.dropout_rate, "--dropout_rate", low_closed=True)
  if args.vs == "t5x":
    if not any(METHODS[m][0] == "prompt_tuning" for m in methods):
      raise ConfigError("--vs=t5x compares Prompt Tuning; put pt100, pt20 or prompt_tuning "
                        "in --methods")
    if args.dropout_rng not in T5X_DROPOUT_RNGS:
      raise ConfigError(f"--vs=t5x with --dropout_rng={args.dropout_rng}: t5x has no such setting; "
                        f"valid: {' or '.join(f'{k} ({v})' for k, v in T5X_DROPOUT_RNGS.items())}")
    common.t5x_shape(bench_config(args.model, overrides))
    if not common.t5x_importable():
      raise ConfigError(f"--vs=t5x: t5x, flaxformer or prompt_tuning is not importable; "
                        f"{common.PYTHONPATH_HINT}")
  distributed.set_cpu_devices(args.cpu_devices)
  if args.batch_size % jax.device_count():
    raise ConfigError(f"--batch_size={args.batch_size} must be divisible by the "
                      f"{jax.device_count()} devices (--cpu_devices)")
  if args.compilation_cache_dir:
    runtime.enable_compilation_cache(args.compilation_cache_dir)
  peak = common.MatmulPeak()
  print(f"float32 matmul peak: {peak.sample(10) / 1e9:.1f} GFLOP/s on {jax.devices()[0]} (sampled "
        f"again after every timed step; MFUs divide by the largest sample)", flush=True)
  kwargs = dict(dropout_rate=args.dropout_rate, warmup=args.warmup,
                inference_steps=args.inference_steps, peak=peak, config_overrides=overrides,
                dropout_rng=args.dropout_rng)
  shape = (args.model, args.batch_size, args.input_length, args.target_length, args.steps,
           args.prompt_length)
  if args.interleave:
    rows = bench_methods(methods, *shape, interleave=True, input_lengths=lengths, **kwargs)
    print(markdown_table(rows) + "".join(line + "\n" for line in paired_lines(rows)), end="",
          flush=True)
  else:
    rows = []
    for method, length in [(m, t) for t in lengths for m in methods]:  # printed when measured
      rows += bench_methods([method], *shape, input_lengths=[length], **kwargs)
      print(markdown_table(rows[-1:]).splitlines()[-1] if len(rows) > 1 else markdown_table(rows),
            end="\n" if len(rows) > 1 else "", flush=True)
  if args.vs == "peft":
    for row in rows:
      peft_row = peft_peer.run_peft(row, args.steps, args.warmup, peak.max, args.peer_malloc)
      if peft_row is not None:
        peft_row.update(common.mfu(peft_row["flops_per_step"], peft_row["step_sec_median"],
                                   peak.max))
        row["peft"] = peft_row
        print(f"PEFT {peft_row['method']} for {row['method']}: {peft_row['step_sec_median']:.3f} "
              f"s/step; spot-jax {peft_row['speedup_of_spot_jax']:.2f}x faster", flush=True)
  if args.vs == "t5x":
    for row in rows:
      peers = t5x_peer.run_t5x(row, args.steps, args.warmup, args.compilation_cache_dir,
                               args.peer_malloc, args.interleave)
      if peers is not None:
        row.update(peers)
        print("".join(line + "\n" for line in t5x_peer.summary_lines(row)), end="", flush=True)
  for row in rows:  # every MFU over the largest peak of the whole run
    row.pop("mfu_flagged", None)
    row.update(common.mfu(row["flops_per_step"], row["step_sec_median"], peak.max),
               matmul_peak_flops_per_sec=peak.max)
  flagged = [r["method"] for r in rows if r.get("mfu_flagged")]
  if flagged:
    print(f"MFU flagged (above 100% against the largest matmul peak of the run, so the machine's "
          f"speed moved between the samples and the steps): {', '.join(flagged)}", flush=True)
  meta = {"devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
          "matmul_peak_flops_per_sec": peak.max, "matmul_peak_samples": peak.samples,
          "argv": list(argv), "rows": rows}
  common.write_outputs(outputs, meta, (
      f"float32 matmul peak {peak.max / 1e9:.1f} GFLOP/s (largest of {len(peak.samples)} "
      f"samples); `python -m benchmarks {' '.join(argv)}`\n\n" + markdown_table(rows)
      + "".join(f"\n{line}\n" for line in paired_lines(rows)) + peft_peer.table(rows)
      + t5x_peer.table(rows)))
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "benchmarks"))
