"""`python -m benchmarks.runs`: K prompt runs in one jitted step against one run alone.

  python -m benchmarks.runs --models=t5_1_1_toy,t5_small --runs=1,2,4,5,8 --steps=9

For each model and K it builds the trainer's own K-run step (`spot_jax.train.step.make_runs_step`:
the train step vmapped over a leading runs axis of the state and the batch, the frozen weights
unbatched) on K independently initialised prompts and K different batches, and times it. K = 1
is the trainer's single-run step (`make_train_step`), the step a run alone takes. The K steps of
one model are built first and then timed in interleaved rounds (order reversed every other
round), so a change of the machine's speed falls on every row alike; each row reports its median
step time, the wall time per run (step / K), examples per second over all K runs, and
`wall_vs_one`: the median over the rounds of its step time over the single run's in the same
round, i.e. what K runs cost in the wall time of one. The data pipeline, evaluation and
checkpoints are not part of the step and are not timed here.

Targets (docs/benchmarks.md) live here, never in timed tests.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np

from spot_jax import backbone as backbone_lib
from spot_jax import cli, models, partitioning, validate
from benchmarks import common
from benchmarks.peers import worker as bench_worker
from spot_jax.cli import flags
from spot_jax.errors import ConfigError
from spot_jax.train import optimizers
from spot_jax.train import run_spec as runs_lib
from spot_jax.train.state import TrainState
from spot_jax.train.step import make_runs_step, make_train_step

PROG = "benchmarks.runs"
DEFAULT_MODELS = ("t5_1_1_toy", "t5_small")
DEFAULT_RUNS = (1, 2, 4, 5, 8)
GOAL_RUNS, GOAL_RATIO = common.GOAL_RUNS, common.GOAL_RATIO


@dataclasses.dataclass
class _Case:
  """One K: its compiled step, live stacked state and batch, and what building it measured."""
  runs: int
  step: Callable
  state: TrainState
  frozen: Any
  batch: Any
  row: dict

  def time_step(self) -> float:
    t0 = time.perf_counter()
    self.state, metrics = self.step(self.state, self.frozen, self.batch)
    jax.block_until_ready(metrics["loss"])
    return time.perf_counter() - t0


def _prepare(model_name: str, method: str, runs: int, batch_size: int, input_length: int,
             target_length: int, dropout_rate: float, warmup: int, seed: int) -> _Case:
  """Builds K runs of `method` on `model_name`, compiles their step (timed) and warms it up."""
  kind, length = common.METHODS[method]
  config = common.bench_config(model_name, None, dropout_rate)
  model = common.bench_model(kind, length, config, input_length)
  dummy = model.dummy_batch(input_length, target_length)
  backbone_rng, prompt_rng, state_rng = backbone_lib.seed_keys(seed)
  frozen = common.init_backbone(model, backbone_rng, dummy)
  init_prompt = jax.jit(lambda r, f: models.unbox(model.init_prompt(r, f, dummy)))
  tx = optimizers.two_learning_rates() if kind == "dept" else optimizers.adafactor()
  states = [TrainState.create(init_prompt(jax.random.fold_in(prompt_rng, k), frozen), tx,
                              jax.random.fold_in(state_rng, k)) for k in range(runs)]
  batches = [common.with_task_index(kind, common.device_batch(
      config.vocab_size, batch_size, input_length, target_length, seed + k)) for k in range(runs)]
  if runs == 1:
    state, batch, fn = states[0], batches[0], make_train_step(model, tx)
  else:
    state, batch, fn = runs_lib.stack(states), runs_lib.stack(batches), make_runs_step(model, tx)
  t0 = time.perf_counter()
  step = jax.jit(fn, donate_argnums=(0,)).lower(state, frozen, batch).compile()
  compile_s = time.perf_counter() - t0
  flops = common.xla_flops(step)
  for _ in range(1 + warmup):
    state, metrics = step(state, frozen, batch)
  jax.block_until_ready(metrics["loss"])
  row = {"model": model_name, "method": method, "runs": runs, "batch_size": batch_size,
         "input_length": input_length, "target_length": target_length,
         "dropout_rate": dropout_rate, "compile_sec": compile_s, "flops_per_step": flops,
         "trainable_state_bytes": common.nbytes(state.params) + common.nbytes(state.opt_state),
         "frozen_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(frozen)))}
  return _Case(runs, step, state, frozen, batch, row)


def bench_model_runs(model_name: str, method: str, runs: Sequence[int], *, batch_size: int,
                     input_length: int, target_length: int, steps: int, warmup: int = 1,
                     dropout_rate: float = 0.1, seed: int = 0) -> list[dict]:
  """One row per K in `runs` (which must hold 1, the baseline), timed in interleaved rounds."""
  mesh = partitioning.create_mesh(1)
  with jax.set_mesh(mesh), nn.logical_axis_rules(list(partitioning.logical_rules())):
    cases = [_prepare(model_name, method, k, batch_size, input_length, target_length,
                      dropout_rate, warmup, seed) for k in runs]
    times = [[] for _ in cases]
    for r in range(steps):
      order = list(range(len(cases)))
      for i in (order if r % 2 == 0 else order[::-1]):
        times[i].append(cases[i].time_step())
  one = np.asarray(times[list(runs).index(1)])
  rows = []
  for case, t in zip(cases, times):
    step_s = float(np.median(t))
    rows.append({**case.row, "steps": len(t), "step_sec_all": [float(x) for x in t],
                 "step_sec_median": step_s, "sec_per_run": step_s / case.runs,
                 "examples_per_sec": case.runs * batch_size / step_s,
                 "wall_vs_one": float(np.median(np.asarray(t) / one)),
                 "peak_host_memory_bytes": bench_worker.peak_host_memory_bytes(),
                 "load_average_1min": os.getloadavg()[0]})
  return rows


_COLUMNS = (("model", "model", "{}"), ("K runs", "runs", "{}"),
            ("step s (median)", "step_sec_median", "{:.4f}"),
            ("s per run", "sec_per_run", "{:.4f}"),
            ("ex/s (all runs)", "examples_per_sec", "{:.1f}"),
            ("wall vs. one run", "wall_vs_one", "{:.2f}x"),
            ("GFLOP/step", "flops_per_step", "{:.2f}"), ("compile s", "compile_sec", "{:.1f}"))


def markdown_table(rows: Sequence[dict]) -> str:
  """The rows as a GitHub Markdown table."""
  def cell(row, key, fmt):
    value = row.get(key)
    if value is None:
      return "-"
    return fmt.format(value / 1e9 if key == "flops_per_step" else value)
  lines = ["| " + " | ".join(c[0] for c in _COLUMNS) + " |",
           "|" + "|".join("---" for _ in _COLUMNS) + "|"]
  lines += ["| " + " | ".join(cell(r, k, f) for _, k, f in _COLUMNS) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def goal_lines(rows: Sequence[dict]) -> list[str]:
  """The K-runs goal, per model measured at K = GOAL_RUNS: met or not, with the number."""
  lines = []
  for row in rows:
    if row["runs"] == GOAL_RUNS:
      verdict = "met" if row["wall_vs_one"] <= GOAL_RATIO else "not met"
      lines.append(f"{row['model']}: {GOAL_RUNS} runs in one step take {row['wall_vs_one']:.2f}x "
                   f"the wall time of one run (goal <= {GOAL_RATIO:g}x: {verdict})")
  return lines


def _parse(argv: Sequence[str]):
  parser = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                      help="comma-separated spot_jax.backbones.t5 config names")
  parser.add_argument("--method", default="pt100", help=f"one of {', '.join(common.METHODS)}")
  parser.add_argument("--runs", default=",".join(map(str, DEFAULT_RUNS)),
                      help="comma-separated K values (1, the single run, is always included)")
  parser.add_argument("--batch_size", type=int, default=8, help="examples per run and step")
  flags.add_lengths(parser, 128, 16)
  parser.add_argument("--dropout_rate", type=float, default=0.1)
  parser.add_argument("--steps", type=int, default=9, help="timed interleaved rounds (median)")
  parser.add_argument("--warmup", type=int, default=1, help="untimed steps after the first")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default=None, help="write the rows as JSON here")
  parser.add_argument("--markdown", default=None, help="write the table as Markdown here")
  return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
  args = _parse(argv)
  model_names = flags.name_list("--models", args.models)
  for name in model_names:
    common.bench_config(name)  # an unknown config name is one line before anything runs
  flags.name_list("--method", args.method, list(common.METHODS))
  if common.METHODS[args.method][0] == "model_tuning":
    raise ConfigError(f"--method={args.method} trains every weight; K runs share a frozen "
                      f"backbone, give a prompt method (e.g. pt100)")
  runs = sorted(set(flags.int_list("--runs", args.runs, minimum=1)) | {1})
  for flag in ("batch_size", "input_length", "target_length", "steps"):
    validate.positive_int(getattr(args, flag), f"--{flag}", optional=True)
  validate.positive_int(args.warmup, "--warmup", minimum=0, optional=True)
  validate.fraction(args.dropout_rate, "--dropout_rate", low_closed=True)
  outputs = common.output_files(args)
  rows = []
  for name in model_names:
    rows += bench_model_runs(name, args.method, runs, batch_size=args.batch_size,
                             input_length=args.input_length, target_length=args.target_length,
                             steps=args.steps, warmup=args.warmup, dropout_rate=args.dropout_rate,
                             seed=args.seed)
  table = markdown_table(rows)
  print(table + "\n".join(goal_lines(rows)))
  common.write_outputs(outputs, rows, table)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], PROG))
