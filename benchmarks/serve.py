"""`python -m benchmarks.serve`: many-task serving, three ways, on the same requests.

  python -m benchmarks.serve --model=t5_1_1_small_like --methods=pt100,smop4x5 \
      --workloads=64x2,8x16,1x128 --tasks=generate,score --vs=peft \
      --json=serve.json --markdown=serve.md

A workload PxN is a queue of P * N requests (P prompts, N requests each, shuffled; see
`serve_workload`) on a random T5 of the `--model` shape (default T5-small's: 6+6 layers, d_model
512, 8 heads of 64, with T5.1.1's gated-GELU MLP and untied output layer; a random model with
T5's tied output layer echoes the decoder's start token, so every greedy answer would be padding
and the prediction checks would compare nothing), served
  mixed       by spot-jax in batches of `--batch_size` rows in arrival order, each row with its
              own prompt (one compiled function for any mix: `spot_jax.serve.Server`);
  one-prompt  by spot-jax one prompt at a time: each prompt's requests in batches of
              min(--batch_size, N) (what a server with one prompt per call does);
  peft        by PyTorch + PEFT in its own process (`benchmarks.peers.peft_serve`, --vs=peft): the
              same weights (exported to a Hugging Face directory), each prompt a PEFT adapter
              loaded once, then per prompt `set_adapter` and batches of min(--batch_size, N).
Tasks: `generate` (greedy, --target_length tokens), `score` (rank --num_labels class labels by
log-likelihood, one pass of B * C rows), `beam` (beam search, --num_beams; not by default).

Before any timing, every mixed row's predictions are checked against the one-prompt path:
identical tokens (generate, beam) or the same label with log-likelihoods within 1e-4 (score); a
difference stops the benchmark. The PEFT rows report how many predictions equal spot-jax's.
Each way then serves the whole queue `--repeats` times (spot-jax's two ways alternate); the
rows give the median pass: examples/s, generated tokens/s (up to and including EOS), p50/p95
latency (a request's completion time from the start of its pass: the queue arrives at once),
compile s (the first, untimed pass minus the median pass: compiling and loading), calls per
pass and the process's peak RSS. SMoP has no PEFT counterpart (PEFT has no routed mixture of
prompts): its rows are spot-jax only.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional, Sequence

import numpy as np

from spot_jax import cli, runtime
from spot_jax import validate
from benchmarks import common, serve_workload
from spot_jax.errors import ConfigError

TASKS = ("generate", "score", "beam")
SERVE_METHODS = ("pt100", "pt20", "smop4x5")  # Prompt Tuning and SMoP rows of common.METHODS
PEFT_PACKAGES = ("torch", "transformers", "peft", "safetensors")
SCORE_TOLERANCE = 1e-4


def build_table(method: str, num_prompts: int, config, seed: int):
  """`num_prompts` random prompts of `method` (PT: [L, E] uniform(-0.5, 0.5); SMoP 4xl with a
  random router, linear routing) stacked in a `PromptTable`."""
  from spot_jax.serve.catalog.table import PromptTable, ServedPrompt  # pylint: disable=g-import-not-at-top
  kind, length = common.METHODS[method]
  rs = np.random.RandomState(seed + 1)
  emb = config.emb_dim
  entries = []
  for i in range(num_prompts):
    if kind == "smop":
      prompts = rs.uniform(-0.5, 0.5, (4, max(1, length // 4), emb))
      router = rs.normal(0.0, emb ** -0.5, (emb, 4))
      entries.append(ServedPrompt(f"p{i}", prompts, router, "linear", method))
    else:
      entries.append(ServedPrompt(f"p{i}", rs.uniform(-0.5, 0.5, (length, emb)), source=method))
  return PromptTable(entries, emb)


def random_backbone(config, seed: int):
  """The random frozen T5 of `config` (the trainer's backbone key of `seed`), on the device."""
  import jax  # pylint: disable=g-import-not-at-top
  from spot_jax import backbone as backbone_lib, models  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.t5 import Transformer  # pylint: disable=g-import-not-at-top
  model = models.EncoderDecoderModel(Transformer(config))
  dummy = model.dummy_batch(4, 4)
  return jax.jit(lambda r: models.unbox(model.init_backbone(r, dummy)))(
      backbone_lib.seed_keys(seed)[0])


def batches(workload, mode: str, batch_size: int) -> list[tuple[list[int], int]]:
  """[(request indices, rows of the call)]: "mixed" in arrival order, "one-prompt" per prompt
  group in calls of min(batch_size, group size) rows; a short last batch is padded."""
  if mode == "mixed":
    return [(c, batch_size)
            for c in serve_workload.chunks(range(workload.num_requests), batch_size)]
  out = []
  for _, idx in serve_workload.prompt_groups(workload):
    size = min(batch_size, len(idx))
    out += [(c, size) for c in serve_workload.chunks(idx, size)]
  return out


def serve_pass(server, workload, task: str, mode: str, batch_size: int) -> dict:
  """Serves the whole queue once; outputs per request and when each request completed."""
  outputs: list[Any] = [None] * workload.num_requests
  done = np.zeros(workload.num_requests)
  calls = batches(workload, mode, batch_size)
  t0 = time.perf_counter()
  for batch, size in calls:
    rows = batch + [batch[0]] * (size - len(batch))  # padded rows repeat a real one (same prompt)
    names = [workload.request_prompts[i] for i in rows]
    tokens = workload.tokens[rows]
    if task == "score":
      result = server.classify(names, tokens, workload.labels)  # [B, C], synchronous
    else:
      result = server.generate(names, tokens)[0]  # [B, S]
    now = time.perf_counter() - t0
    for j, i in enumerate(batch):
      outputs[i] = (result[j].astype(np.float64) if task == "score"
                    else serve_workload.until_eos(result[j]))
      done[i] = now
  return {"outputs": outputs, "done": done, "total": time.perf_counter() - t0,
          "calls": len(calls), "batch_rows": calls[0][1]}


def compare(task: str, ours: Sequence[Any], theirs: Sequence[Any]) -> dict:
  """How many outputs agree: identical tokens, or the same label (scores within tolerance)."""
  if task == "score":
    same = [int(np.argmax(a)) == int(np.argmax(b)) for a, b in zip(ours, theirs)]
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(ours, theirs))
    return {"agree": int(sum(same)), "of": len(same), "max_score_diff": diff,
            "identical": all(same) and diff <= SCORE_TOLERANCE}
  same = [list(a) == list(b) for a, b in zip(ours, theirs)]
  return {"agree": int(sum(same)), "of": len(same), "identical": all(same)}


def bench_spot_jax(method: str, workload, task: str, server, batch_size: int, repeats: int
                   ) -> tuple[list[dict], list[Any]]:
  """The mixed and one-prompt rows of one (method, workload, task), checked before timing.

  Returns the two rows and the mixed outputs (for the PEFT comparison).

  Raises:
    RuntimeError: mixed predictions differ from the one-prompt path's (a bug).
  """
  # Mixed first: its row's compile time is that of its own batch shape.
  first = {m: serve_pass(server, workload, task, m, batch_size) for m in ("mixed", "one-prompt")}
  check = compare(task, first["mixed"]["outputs"], first["one-prompt"]["outputs"])
  if not check["identical"]:
    raise RuntimeError(f"{method} {workload.name} {task}: mixed batches disagree with the "
                       f"one-prompt path on {check['of'] - check['agree']} of {check['of']} "
                       f"requests: {check}")
  passes: dict[str, list[dict]] = {"mixed": [], "one-prompt": []}
  for r in range(repeats):  # alternating, so drift in the machine's speed hits both
    for mode in (("mixed", "one-prompt") if r % 2 == 0 else ("one-prompt", "mixed")):
      passes[mode].append(serve_pass(server, workload, task, mode, batch_size))
  rows = []
  for mode in ("mixed", "one-prompt"):
    row = {"framework": "spot-jax", "way": mode, "method": method, "workload": workload.name,
           "task": task, "requests": workload.num_requests,
           "batch_rows": first[mode]["batch_rows"],
           **serve_workload.summarize(passes[mode], first[mode], task)}
    if mode == "mixed":
      row["checked_against_one_prompt"] = check
      row["distinct_predictions"] = len({json.dumps(np.asarray(o).round(4).tolist())
                                         for o in first["mixed"]["outputs"]})
    rows.append(row)
  return rows, first["mixed"]["outputs"]


def peft_missing() -> Optional[str]:
  """Why the PEFT peer cannot run here (a package it needs is not installed), or None."""
  absent = [m for m in PEFT_PACKAGES if importlib.util.find_spec(m) is None]
  if absent:
    return (f"{', '.join(absent)} not installed (pip install '.[bench]'); PyTorch + PEFT rows "
            f"skipped")
  return None


def run_peft(params, config, table, workloads: Sequence[Any], tasks: Sequence[str],
             args) -> list[dict]:
  """Serves the workloads with PyTorch + PEFT in a separate process on the same weights and
  prompts (written to a temporary work directory); its rows, outputs included."""
  import jax  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.export import peft_io  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.t5 import hf_export  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory(prefix="spot_jax_bench_serve_") as work:
    hf_export.export_hf(jax.tree_util.tree_map(np.asarray, params), config,
                        os.path.join(work, "hf"))
    for entry in table.entries:
      peft_io.export_adapter(entry.prompts[0], config, os.path.join(work, "adapters", entry.name),
                             base_model_name_or_path=os.path.join(work, "hf"))
    os.makedirs(os.path.join(work, "workloads"))
    for w in workloads:
      serve_workload.write(w, os.path.join(work, "workloads", f"{w.name}.json"))
    cmd = [sys.executable, "-m", "benchmarks.peers.peft_serve", f"--output_dir={work}",
           f"--workloads={','.join(w.name for w in workloads)}", f"--tasks={','.join(tasks)}",
           f"--method={table.entries[0].source}", f"--batch_size={args.batch_size}",
           f"--target_length={args.target_length}", f"--num_beams={args.num_beams}",
           f"--repeats={args.repeats}"]
    env = dict(os.environ, **{runtime.ENV: args.peer_malloc})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
  if proc.returncode != 0:
    raise RuntimeError(f"the PEFT serving peer failed: "
                       f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
  return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


_COLUMNS = (("method", "method", "{}"), ("workload", "workload", "{}"), ("task", "task", "{}"),
            ("served by", "label", "{}"), ("ex/s", "examples_per_sec", "{:.1f}"),
            ("gen tok/s", "generated_tokens_per_sec", "{:.0f}"),
            ("p50 s", "latency_p50_sec", "{:.2f}"), ("p95 s", "latency_p95_sec", "{:.2f}"),
            ("compile s", "compile_sec", "{:.1f}"), ("calls x rows", "calls", "{}"),
            ("peak RSS GiB", "peak_host_memory_bytes", "{:.2f}"),
            ("mixed / this (ex/s)", "mixed_speedup", "{:.2f}x"), ("predictions", "checked", "{}"))
LABELS = {"mixed": "spot-jax mixed", "one-prompt": "spot-jax one prompt at a time",
          "peft": "PyTorch + PEFT"}


def _cells(row: dict) -> list[str]:
  view = dict(row, label=LABELS[row["way"]], calls=f"{row['calls_per_pass']} x {row['batch_rows']}")
  if "peak_host_memory_bytes" in view:
    view["peak_host_memory_bytes"] = view["peak_host_memory_bytes"] / 2 ** 30
  check = row.get("checked_against_one_prompt") or row.get("agreement_with_mixed")
  if check:
    against = "one-prompt" if row["way"] == "mixed" else "spot-jax"
    view["checked"] = f"{check['agree']}/{check['of']} = {against}"
  return [fmt.format(view[key]) if view.get(key) is not None else "-" for _, key, fmt in _COLUMNS]


def markdown_table(rows: Sequence[dict]) -> str:
  lines = ["| " + " | ".join(c[0] for c in _COLUMNS) + " |",
           "|" + "|".join("---" for _ in _COLUMNS) + "|"]
  lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def _row_lines(rows: Sequence[dict]) -> list[str]:
  return markdown_table(rows).splitlines()[2:]


GOALS = {"64x2": 5.0, "8x16": 1.5, "1x128": 1.2}  # goals: mixed spot-jax over PEFT, ex/s


def goal_lines(rows: Sequence[dict]) -> list[str]:
  """Mixed spot-jax's examples/s over PEFT's per (method, workload, task), against the goals."""
  out = []
  for r in rows:
    if r["way"] == "peft" and r.get("mixed_speedup"):
      goal = GOALS.get(r["workload"])
      verdict = "" if goal is None else (f" (goal {goal:g}x: met)" if r["mixed_speedup"] >= goal
                                         else f" (goal {goal:g}x: NOT met, "
                                              f"{r['mixed_speedup'] / goal:.0%} of it)")
      out.append(f"{r['method']} {r['workload']} {r['task']}: spot-jax mixed "
                 f"{r['mixed_speedup']:.2f}x PEFT's examples/s{verdict}")
  return out


def _parse(argv: Sequence[str]):
  p = cli.ArgumentParser(prog="benchmarks.serve", description=__doc__.splitlines()[0])
  p.add_argument("--model", default="t5_1_1_small_like",
                 help="a spot_jax.backbones.t5 config name (random weights; untied output layer: "
                      "see above)")
  for name in common.OVERRIDE_FLAGS:
    p.add_argument(f"--{name}", type=int, default=None, help=f"override the config's {name}")
  p.add_argument("--methods", default="pt100,smop4x5", help=f"comma-separated, from: "
                 f"{', '.join(SERVE_METHODS)}")
  p.add_argument("--workloads", default="64x2,8x16,1x128",
                 help="comma-separated PxN: P prompts with N requests each")
  p.add_argument("--tasks", default="generate,score",
                 help=f"comma-separated, from: {', '.join(TASKS)}")
  p.add_argument("--input_length", type=int, default=128,
                 help="longest request in tokens (EOS included; lengths are uniform in [T/2, T])")
  p.add_argument("--target_length", type=int, default=16, help="tokens generated (EOS included)")
  p.add_argument("--num_labels", type=int, default=2, help="class labels of the score task")
  p.add_argument("--label_length", type=int, default=2, help="tokens per label (plus EOS)")
  p.add_argument("--num_beams", type=int, default=4, help="beams of the beam task")
  p.add_argument("--batch_size", type=int, default=32, help="most rows per call")
  p.add_argument("--repeats", type=int, default=3, help="timed passes over each queue (median)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--vs", default="", choices=("", "peft"),
                 help="also serve the Prompt Tuning queues with PyTorch + PEFT (separate process)")
  p.add_argument("--peer_malloc", default="system", choices=runtime.MODES,
                 help="host memory settings of the PEFT process (see benchmarks --peer_malloc)")
  p.add_argument("--json", default=None, help="write the rows to this file")
  p.add_argument("--markdown", default=None, help="write a Markdown table to this file")
  return p.parse_args(argv)


def _check(args) -> tuple[list[str], list[str], list[str], dict]:
  methods, tasks, workloads = (args.methods.split(","), args.tasks.split(","),
                               args.workloads.split(","))
  for value, valid, what in ((methods, SERVE_METHODS, "method"), (tasks, TASKS, "task")):
    bad = [v for v in value if v not in valid]
    if bad or not value:
      raise ConfigError(f"unknown {what} {(bad or [''])[0]!r}; valid: {', '.join(valid)}")
  for w in workloads:
    serve_workload.parse_workload(w)
  sizes = ("input_length", "target_length", "num_labels", "label_length", "num_beams",
           "batch_size", "repeats")
  for k in sizes:
    validate.positive_int(getattr(args, k), f"--{k}")
  overrides = {k: validate.positive_int(getattr(args, k), f"--{k}")
               for k in common.OVERRIDE_FLAGS if getattr(args, k) is not None}
  return methods, tasks, workloads, overrides


def main(argv: Sequence[str]) -> int:
  args = _parse(argv)
  methods, tasks, workload_names, overrides = _check(args)
  outputs = common.output_files(args)
  config = common.bench_config(args.model, overrides, dropout_rate=0.0)
  peft_skipped = peft_missing() if args.vs == "peft" else None
  if peft_skipped:
    print(f"--vs=peft: {peft_skipped}", flush=True)
  from spot_jax.serve.model import server as server_lib  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.t5 import Transformer  # pylint: disable=g-import-not-at-top
  params = random_backbone(config, args.seed)
  num_prompts = max(serve_workload.parse_workload(w)[0] for w in workload_names)
  rows: list[dict] = []
  print(markdown_table([]), end="", flush=True)
  for method in methods:
    table = build_table(method, num_prompts, config, args.seed)
    servers = {m: server_lib.Server(Transformer(config), params, table,
                                    settings=server_lib.DecodeSettings(
                                        args.target_length, m, num_beams=args.num_beams))
               for m in ("greedy", "beam")}
    workloads = [serve_workload.make_workload(w, table.names, config.vocab_size, args.input_length,
                                              args.num_labels, args.label_length, args.seed)
                 for w in workload_names]
    mixed_outputs, ours = {}, []
    for w in workloads:
      for task in tasks:
        pair, mixed_outputs[(w.name, task)] = bench_spot_jax(
            method, w, task, servers["beam" if task == "beam" else "greedy"], args.batch_size,
            args.repeats)
        pair[0]["mixed_speedup"] = 1.0
        pair[1]["mixed_speedup"] = pair[0]["examples_per_sec"] / pair[1]["examples_per_sec"]
        ours += pair
        print("\n".join(_row_lines(pair)), flush=True)
    rows += ours
    if args.vs == "peft" and not peft_skipped and common.METHODS[method][0] == "prompt_tuning":
      for peft_row in run_peft(params, config, table, workloads, tasks, args):
        mixed = next(r for r in ours if r["way"] == "mixed"
                     and r["workload"] == peft_row["workload"] and r["task"] == peft_row["task"])
        peft_row["mixed_speedup"] = mixed["examples_per_sec"] / peft_row["examples_per_sec"]
        peft_row["agreement_with_mixed"] = compare(
            peft_row["task"], mixed_outputs[(peft_row["workload"], peft_row["task"])],
            peft_row.pop("outputs"))
        rows.append(peft_row)
        print("\n".join(_row_lines([peft_row])), flush=True)
  goals = goal_lines(rows)
  print("".join(line + "\n" for line in goals), end="", flush=True)
  meta = {"argv": list(argv), "config": args.model, "config_overrides": overrides,
          "shape": {k: getattr(config, k) for k in common.SHAPE_FIELDS},
          "peft_skipped": peft_skipped, "malloc": runtime.applied(), "rows": rows}
  common.write_outputs(outputs, meta, (
      f"`python -m benchmarks.serve {' '.join(argv)}`\n\n" + markdown_table(rows)
      + "".join(f"\n{line}\n" for line in goals)
      + (f"\nPyTorch + PEFT: {peft_skipped}\n" if peft_skipped else "")))
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "benchmarks.serve"))
