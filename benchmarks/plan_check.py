"""`python -m benchmarks.plan_check`: the planner's figure against a real step's peak memory.

  nice -n 10 python -m benchmarks.plan_check --model=llama_3_2_1b --num_layers=4 \
      --settings=float32:none,float32:full,bfloat16:none,bfloat16:full --markdown=/tmp/check.md

Each setting (weights:remat) runs in a process of its own on one CPU device: it compiles the
trainer's step ahead of time (`spot_jax.train.footprint`, the planner's total per device), then
resets the process's peak resident memory (/proc/self/clear_refs), notes the resident memory,
creates the frozen weights, the state and a batch (filled in place by one jitted function each:
no temporaries), runs the compiled step once and reads the peak (VmHWM). The real figure is
the peak minus the memory before the weights were created; glibc's defaults are kept
(SPOT_JAX_MALLOC=system), so a freed block leaves the resident set.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Sequence

from benchmarks import common
from spot_jax import cli, runtime, validate

WORKER_FLAG = "--worker="
TOLERANCE = 0.20  # |real - planned| / planned


def _status_kib(field: str) -> int:
  with open("/proc/self/status", encoding="ascii") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise RuntimeError(f"/proc/self/status has no {field}")


def _filled(tree: Any) -> Any:
  """Arrays of `tree`'s shapes, dtypes and shardings, made in place (no temporaries)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def fill(x):
    value = 0.01 if jnp.issubdtype(x.dtype, jnp.floating) else 1
    return jnp.full(x.shape, value, x.dtype)

  shardings = jax.tree.map(lambda x: x.sharding, tree)
  return jax.jit(lambda: jax.tree.map(fill, tree), out_shardings=shardings)()


def worker(spec: dict) -> dict:
  """One setting's planned and real bytes (run in a fresh process)."""
  import jax  # pylint: disable=g-import-not-at-top
  from benchmarks import plan_table  # pylint: disable=g-import-not-at-top
  from spot_jax import partitioning  # pylint: disable=g-import-not-at-top
  from spot_jax.train import footprint, optimizers, plan  # pylint: disable=g-import-not-at-top
  model = plan_table.build_model(spec["model"], spec["prompt_length"], spec["num_layers"],
                                 overrides=spec.get("overrides"))
  setting = plan.Setting(weights=spec["weights"], remat=spec["remat"], fsdp=False,
                         batch_size=spec["batch_size"])
  model = plan.apply(model, setting)
  mesh = partitioning.create_mesh(1, jax.devices()[:1])
  tx = optimizers.adamw(learning_rate=1e-3)
  lengths = {"inputs": spec["input_length"], "targets": spec["target_length"]}
  planned = footprint.measure(model, tx, lengths, setting.batch_size, mesh)
  step, state, frozen, batch = footprint.build(model, tx, lengths, setting.batch_size, mesh)
  compiled = footprint.compile_step(step, state, frozen, batch, mesh)
  with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
    f.write("5")  # the peak restarts from here: compiling is not the step's memory
  before = _status_kib("VmRSS")
  frozen, state, batch = _filled(frozen), _filled(state), _filled(batch)
  state, metrics = compiled(state, frozen, batch)
  jax.block_until_ready((state, metrics))
  real = (_status_kib("VmHWM") - before) * 1024
  return {**spec, "planned": planned.as_dict(), "real": real}


def run_setting(spec: dict) -> dict:
  """`worker(spec)` in a fresh process (its own peak memory)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", **{runtime.ENV: "system"})
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-m", "benchmarks.plan_check",
                         WORKER_FLAG + json.dumps(spec)], capture_output=True, text=True,
                        env=env, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    last = (proc.stderr.strip().splitlines() or ["?"])[-1]
    raise RuntimeError(f"plan_check worker failed: {last}")
  return json.loads(lines[-1])


def check(model: str, settings: Sequence[tuple[str, str]], *, num_layers: int, batch_size: int,
          input_length: int, target_length: int, prompt_length: int,
          overrides: Any = None) -> list[dict]:
  """Each setting's planned and real bytes, and their ratio (`overrides`: config fields)."""
  rows = []
  for weights, remat in settings:
    row = run_setting(dict(model=model, num_layers=num_layers, weights=weights, remat=remat,
                           batch_size=batch_size, input_length=input_length,
                           target_length=target_length, prompt_length=prompt_length,
                           overrides=overrides))
    row["ratio"] = row["real"] / row["planned"]["total"]
    rows.append(row)
  return rows


def markdown(rows: Sequence[dict]) -> str:
  mib = 1 << 20
  lines = ["| weights | remat | planned (MiB) | real peak (MiB) | real / planned |",
           "| --- | --- | --- | --- | --- |"]
  for r in rows:
    lines.append(f"| {r['weights']} | {r['remat']} | {r['planned']['total'] / mib:.0f} "
                 f"| {r['real'] / mib:.0f} | {r['ratio']:.3f} |")
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
  parser = cli.ArgumentParser(prog="benchmarks.plan_check", description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="llama_3_2_1b")
  parser.add_argument("--num_layers", type=int, default=4)
  parser.add_argument("--settings", default="float32:none,float32:full,bfloat16:none,"
                                            "bfloat16:full")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--input_length", type=int, default=384)
  parser.add_argument("--target_length", type=int, default=128)
  parser.add_argument("--prompt_length", type=int, default=100)
  parser.add_argument("--json", default=None)
  parser.add_argument("--markdown", default=None)
  args = parser.parse_args(argv)
  for flag in ("num_layers", "batch_size", "input_length", "target_length", "prompt_length"):
    validate.positive_int(getattr(args, flag), f"--{flag}")
  settings = [tuple(s.strip().split(":")) for s in args.settings.split(",") if s.strip()]
  if not settings or any(len(s) != 2 for s in settings):
    raise validate.ConfigError(f"--settings={args.settings!r} must be weights:remat pairs, "
                               f"e.g. float32:none,bfloat16:full")
  files = common.output_files(args)
  rows = check(args.model, settings, num_layers=args.num_layers, batch_size=args.batch_size,
               input_length=args.input_length, target_length=args.target_length,
               prompt_length=args.prompt_length)
  table = markdown(rows)
  print(table)
  common.write_outputs(files, {"rows": rows}, table)
  return 0


if __name__ == "__main__":
  if len(sys.argv) == 2 and sys.argv[1].startswith(WORKER_FLAG):
    print(json.dumps(worker(json.loads(sys.argv[1][len(WORKER_FLAG):]))))
    sys.exit(0)
  sys.exit(cli.run(main, sys.argv[1:], "benchmarks.plan_check"))
