"""`python -m benchmarks.jobs`: K whole prompt runs in one trainer job against one run alone.

  python -m benchmarks.jobs --runs=1,2,4,5,8 --repeats=3 --json=jobs.json --markdown=jobs.md

What a user waits for when seeds are batched: every K is one fresh process that trains K whole
runs of the embedded demo's earlier recipe, fixed here so that rows compare across sessions
(`recipe()`: Prompt Tuning, 20 tokens, input length 40, 60 steps at batch 8, warm-up and decay,
evaluation of 200 validation examples at the end, a checkpoint and the prompt exports) on
the toy T5, seeds 0..K-1 of one target task, as one trainer call with K runs on its runs axis
(`spot_jax.demo.methods.run_job`), and reports the trainer call's wall time: set-up, data
pipelines, compiles (no persistent compilation cache), the steps, evaluation and checkpoints.
The processes run in `--repeats` rounds, every K once per round (order reversed every other
round); a row gives the median over rounds, the time per run, and `wall_vs_one`: the median over
rounds of its time over the K = 1 process's time in the same round. `benchmarks.runs` times
the step alone.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

from spot_jax import cli, validate
from benchmarks import common
from spot_jax.cli import flags

PROG = "benchmarks.jobs"
DEFAULT_RUNS = (1, 2, 4, 5, 8)
GOAL_RUNS, GOAL_RATIO = common.GOAL_RUNS, common.GOAL_RATIO


def recipe():
  """The demo's recipe as docs/benchmarks.md measured it: 20 tokens, input 40, 60 steps (the demo's
  default is now 10 tokens, input 37, 40 steps; docs/embedded.md)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from spot_jax.demo import methods  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(methods.Settings(), prompt_length=20, input_length=40, target_steps=60,
                             source_steps=120)


def _worker(k: int, task: str, out_dir: str) -> dict:
  """Trains K runs in this process; -> the trainer call's wall seconds and the runs' scores."""
  from spot_jax.demo import methods  # pylint: disable=g-import-not-at-top
  settings = recipe()
  requests = [methods.request(task, seed) for seed in range(k)]
  started = time.perf_counter()
  job_recipe = methods.recipe("pt", settings, methods.sampled_vocab_rows())
  result = methods.run_job(job_recipe, requests, settings, pathlib.Path(out_dir))
  seconds = time.perf_counter() - started
  return {"k": k, "seconds": seconds, "scores": [methods.accuracy(o) for o in result.outcomes]}


def _run_worker(k: int, task: str, work: str) -> dict:
  out_dir = tempfile.mkdtemp(prefix=f"k{k}-", dir=work)
  env = {**os.environ, "SPOT_JAX_COMPILATION_CACHE": "none"}
  proc = subprocess.run([sys.executable, "-m", "benchmarks.jobs", "--worker", f"--k={k}",
                         f"--task={task}", f"--work_dir={out_dir}"],
                        capture_output=True, text=True, env=env)
  if proc.returncode != 0:
    raise RuntimeError(f"the K={k} job failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(runs: Sequence[int], repeats: int, task: str, log=print) -> list[dict]:
  """The rows: every K's median job wall time, per run and paired against K = 1."""
  order = sorted(set(runs) | {1})
  times: dict[int, list[float]] = {k: [] for k in order}
  scores: dict[int, list] = {}
  with tempfile.TemporaryDirectory(prefix="spot_bench_jobs_") as work:
    for r in range(repeats):
      for k in (order if r % 2 == 0 else order[::-1]):
        got = _run_worker(k, task, work)
        times[k].append(got["seconds"])
        scores[k] = got["scores"]
        log(f"round {r + 1}/{repeats}: K={k} {got['seconds']:.1f} s")
  rows = []
  for k in order:
    median = statistics.median(times[k])
    ratios = [t / one for t, one in zip(times[k], times[1])]
    rows.append({"runs": k, "job_sec_median": round(median, 2), "sec_per_run": round(median / k, 2),
                 "wall_vs_one": round(statistics.median(ratios), 3),
                 "job_sec_all": [round(t, 2) for t in times[k]], "scores": scores[k]})
  return rows


def markdown(rows: Sequence[dict], task: str, repeats: int) -> str:
  lines = [f"`python -m {PROG}`: K whole runs of the demo's recipe on `{task}` (toy T5), one "
           f"trainer job per K in a fresh process, median of {repeats} interleaved rounds", "",
           "| K runs | job wall s (median) | wall s per run | K runs / one run (paired) |",
           "|---|---|---|---|"]
  lines += [f"| {r['runs']} | {r['job_sec_median']:.1f} | {r['sec_per_run']:.1f} | "
            f"{r['wall_vs_one']:.2f}x |" for r in rows]
  goal = next((r for r in rows if r["runs"] == GOAL_RUNS), None)
  if goal is not None:
    verdict = "met" if goal["wall_vs_one"] <= GOAL_RATIO else "NOT met"
    lines += ["", f"{GOAL_RUNS} runs in {goal['wall_vs_one']:.2f}x the wall time of one "
                  f"(goal at most {GOAL_RATIO:g}x: {verdict})"]
  return "\n".join(lines) + "\n"


def _parser() -> cli.ArgumentParser:
  p = cli.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  p.add_argument("--runs", default=",".join(map(str, DEFAULT_RUNS)),
                 help="comma list of K (K = 1 always runs: the reference)")
  p.add_argument("--repeats", type=int, default=3, help="rounds of processes (median)")
  p.add_argument("--task", default="sum", help="a target of the embedded suite (tasks/embedded.py)")
  p.add_argument("--json", default=None)
  p.add_argument("--markdown", default=None)
  # The worker process's own flags (not for users).
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--k", type=int, default=1, help=argparse.SUPPRESS)
  p.add_argument("--work_dir", default=None, help=argparse.SUPPRESS)
  return p


def main(argv: Sequence[str]) -> Optional[int]:
  args = _parser().parse_args(argv)
  if args.worker:
    print(json.dumps(_worker(args.k, args.task, args.work_dir)))
    return 0
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  validate.one_of(args.task, "--task", suite.TARGETS + suite.HARD_TARGETS)
  runs = flags.int_list("--runs", args.runs, minimum=1)
  validate.positive_int(args.repeats, "--repeats", optional=True)
  outputs = common.output_files(args)
  rows = measure(runs, args.repeats, args.task)
  table = markdown(rows, args.task, args.repeats)
  print(table)
  common.write_outputs(outputs, {"task": args.task, "repeats": args.repeats, "rows": rows}, table)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], PROG))
