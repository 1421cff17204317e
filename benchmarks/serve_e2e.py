"""`python -m benchmarks.serve_e2e`: serving as a user runs it, whole processes, on the toy T5.

  python -m benchmarks.serve_e2e --workloads=64x2,8x16,1x128 --repeats=3 \
      [--cold_start_repeats=3] --json=e2e.json --markdown=e2e.md

A file of requests in, a file of predictions out: for each workload PxN (P prompts, N requests
each, shuffled; inputs are the embedded suite's validation inputs) the same JSONL file is
served by
  spot-jax        `python -m spot_jax.infer` on the embedded toy T5 (its T5X checkpoint and
                  SentencePiece model; P `.npy` prompts; one mixed-prompt stream), without and
                  with a warm persistent compilation cache (`--compilation_cache_dir`, filled
                  by one untimed run first);
  PyTorch + PEFT  `python -m benchmarks.peers.peft_serve_file`: the same weights as a Hugging Face
                  model, each prompt a PEFT adapter, prompt by prompt.
The processes alternate (the order flips every repeat) and the table gives each one's median
wall time from start to exit, its self-reported time to the first prediction, and whether
both wrote identical predictions. Greedy decoding to --target_length tokens.

Cold start (`--cold_start_repeats`): one request, the prompt given as a run directory
(prompts/prompt_best.npy, as a `spot_jax.train` run leaves it): process start to first
prediction for infer without and with the warm cache, and for the PEFT script, plus infer's
phases (`--timing`).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

import numpy as np

from spot_jax import cli, embedded, fileio
from benchmarks import common, serve_workload
from spot_jax.errors import ConfigError

PROMPT_LENGTH = 20


def setup(work: str, num_prompts: int, seed: int) -> None:
  """The toy model as a Hugging Face directory, `num_prompts` prompts (.npy files and PEFT
  adapters: rows of the embedding table, sampled-vocabulary style) and a run directory."""
  from spot_jax.serve.export import peft_io  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.t5 import checkpoints, config_by_name, hf_export  # pylint: disable=g-import-not-at-top
  config = config_by_name(embedded.CONFIG_NAME)
  params = checkpoints.load_checkpoint(embedded.CHECKPOINT_PATH, config)
  import jax  # pylint: disable=g-import-not-at-top
  hf_export.export_hf(jax.tree_util.tree_map(np.asarray, params), config, os.path.join(work, "hf"))
  table = np.asarray(params["token_embedder"]["embedding"])
  rs = np.random.RandomState(seed)
  for i in range(num_prompts):
    prompt = table[rs.randint(3, 178, PROMPT_LENGTH)].astype(np.float32)
    np.save(os.path.join(work, f"p{i}.npy"), prompt)
    peft_io.export_adapter(prompt, config, os.path.join(work, "adapters", f"p{i}"),
                           base_model_name_or_path=os.path.join(work, "hf"))
  os.makedirs(os.path.join(work, "run", "prompts"))
  np.save(os.path.join(work, "run", "prompts", "prompt_best.npy"),
          np.load(os.path.join(work, "p0.npy")))


def write_requests(path: str, workload: str, seed: int) -> None:
  """The requests of `workload` as JSONL, inputs from the embedded suite's validation splits."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  texts = [t for key in suite.SOURCES for t in suite.examples(key, "validation")[0]]
  num_prompts, per_prompt = serve_workload.parse_workload(workload)
  rs = np.random.RandomState(seed)
  order = rs.permutation(num_prompts * per_prompt)
  picks = rs.choice(len(texts), len(order), replace=False)
  with open(path, "w", encoding="utf-8") as f:
    for i, (slot, pick) in enumerate(zip(order, picks)):
      f.write(json.dumps({"id": i, "input": texts[pick],
                          "prompt": f"p{slot // per_prompt}"}) + "\n")


def infer_command(work: str, prompts: Sequence[str], requests: str, output: str, args,
                  cache: Optional[str]) -> list[str]:
  cmd = [sys.executable, "-m", "spot_jax.infer", f"--model={embedded.CONFIG_NAME}",
         f"--checkpoint={embedded.CHECKPOINT_PATH}", f"--vocab={embedded.VOCAB_PATH}",
         *[f"--prompt={p}" for p in prompts], f"--input={requests}", f"--output={output}",
         f"--target_length={args.target_length}", f"--input_length={args.input_length}",
         f"--batch_size={args.batch_size}", "--timing"]
  return cmd + [f"--compilation_cache_dir={cache or 'none'}"]  # none: not infer's default cache


def peft_command(work: str, requests: str, output: str, args) -> list[str]:
  return [sys.executable, "-m", "benchmarks.peers.peft_serve_file", f"--model={work}/hf",
          f"--adapters={work}/adapters", f"--vocab={embedded.VOCAB_PATH}", f"--input={requests}",
          f"--output={output}", f"--max_new_tokens={args.target_length}",
          f"--input_length={args.input_length}", f"--batch_size={args.batch_size}"]


def timed_process(cmd: Sequence[str]) -> dict:
  """Runs `cmd` to completion: its wall time and its self-reported timing line."""
  t0 = time.perf_counter()
  proc = subprocess.run(list(cmd), capture_output=True, text=True)
  wall = time.perf_counter() - t0
  if proc.returncode != 0:
    raise RuntimeError(f"{cmd[2]} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
  line = next((l for l in proc.stderr.splitlines() if ": timing: " in l), "")
  first = re.search(r"first prediction ([0-9.]+) s after process start", line)
  phases = {n.strip(): float(s) for n, s in re.findall(r"([a-z0-9 ]+) ([0-9.]+) s",
                                                        line.split(": timing: ")[-1].split(";")[0])}
  return {"wall_sec": wall, "first_prediction_sec": float(first.group(1)) if first else None,
          "phases": phases}


def _predictions(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line)["prediction"] for line in f]


def _median(runs: Sequence[dict], key: str) -> Optional[float]:
  values = [r[key] for r in runs if r.get(key) is not None]
  return statistics.median(values) if values else None


def run_workload(work: str, workload: str, args) -> dict:
  """spot-jax (cold and warm cache) and PEFT on one workload, alternating; medians."""
  requests = os.path.join(work, f"{workload}.jsonl")
  write_requests(requests, workload, args.seed)
  prompts = [f"p{i}={work}/p{i}.npy" for i in range(serve_workload.parse_workload(workload)[0])]
  cache = os.path.join(work, f"jax_cache_{workload}")
  out = {k: os.path.join(work, f"{workload}.{k}.jsonl") for k in ("cold", "warm", "peft")}
  commands = {"cold": infer_command(work, prompts, requests, out["cold"], args, None),
              "warm": infer_command(work, prompts, requests, out["warm"], args, cache),
              "peft": peft_command(work, requests, out["peft"], args)}
  timed_process(commands["warm"])  # fills the cache (untimed)
  runs: dict[str, list[dict]] = {k: [] for k in commands}
  for r in range(args.repeats):
    for k in (("cold", "warm", "peft") if r % 2 == 0 else ("peft", "warm", "cold")):
      runs[k].append(timed_process(commands[k]))
  ours, theirs = _predictions(out["cold"]), _predictions(out["peft"])
  row = {"workload": workload, "requests": len(ours),
         "identical_predictions": sum(a == b for a, b in zip(ours, theirs)),
         "warm_equals_cold": _predictions(out["warm"]) == ours, "runs": runs}
  for k in commands:
    row[f"{k}_wall_sec"] = _median(runs[k], "wall_sec")
    row[f"{k}_first_prediction_sec"] = _median(runs[k], "first_prediction_sec")
  row["peft_over_cold"] = row["peft_wall_sec"] / row["cold_wall_sec"]
  row["peft_over_warm"] = row["peft_wall_sec"] / row["warm_wall_sec"]
  return row


def cold_start(work: str, args) -> dict:
  """One request, the prompt from a run directory: time to first prediction, three ways."""
  requests = os.path.join(work, "one.jsonl")
  with open(requests, "w", encoding="utf-8") as f:
    f.write(json.dumps({"id": 0, "input": "sentiment: the soup was cold and bland",
                        "prompt": "p0"}) + "\n")
  prompts = [f"p0={work}/run"]
  cache = os.path.join(work, "jax_cache_one")
  commands = {"cold": infer_command(work, prompts, requests, f"{work}/one.cold.jsonl", args, None),
              "warm": infer_command(work, prompts, requests, f"{work}/one.warm.jsonl", args, cache),
              "peft": peft_command(work, requests, f"{work}/one.peft.jsonl", args)}
  timed_process(commands["warm"])
  runs: dict[str, list[dict]] = {k: [] for k in commands}
  for r in range(args.cold_start_repeats):
    for k in (("cold", "warm", "peft") if r % 2 == 0 else ("peft", "warm", "cold")):
      runs[k].append(timed_process(commands[k]))
  row = {"runs": runs}
  for k in commands:
    row[f"{k}_first_prediction_sec"] = _median(runs[k], "first_prediction_sec")
    row[f"{k}_wall_sec"] = _median(runs[k], "wall_sec")
    row[f"{k}_phases"] = {p: statistics.median(r["phases"][p] for r in runs[k])
                          for p in runs[k][0]["phases"]}
  return row


def markdown(rows: Sequence[dict], cold: Optional[dict]) -> str:
  lines = ["| workload | spot-jax s (no cache) | spot-jax s (warm cache) | PEFT s | PEFT / "
           "spot-jax (no cache, warm) | first prediction s: spot-jax no cache / warm / PEFT | "
           "identical predictions |", "|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['workload']} | {r['cold_wall_sec']:.2f} | {r['warm_wall_sec']:.2f} | "
                 f"{r['peft_wall_sec']:.2f} | {r['peft_over_cold']:.2f}x, "
                 f"{r['peft_over_warm']:.2f}x | {r['cold_first_prediction_sec']:.2f} / "
                 f"{r['warm_first_prediction_sec']:.2f} / {r['peft_first_prediction_sec']:.2f} | "
                 f"{r['identical_predictions']}/{r['requests']} |")
  if cold:
    lines += ["", "| cold start (1 request, run directory) | first prediction s | exit s | phases "
                  "(median s) |",
              "|---|---|---|---|"]
    for k, name in (("cold", "spot-jax, no cache"), ("warm", "spot-jax, warm cache"),
                    ("peft", "PyTorch + PEFT")):
      phases = ", ".join(f"{p} {v:.2f}" for p, v in cold[f"{k}_phases"].items())
      lines.append(f"| {name} | {cold[f'{k}_first_prediction_sec']:.2f} | "
                   f"{cold[f'{k}_wall_sec']:.2f} | {phases} |")
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
  p = cli.ArgumentParser(prog="benchmarks.serve_e2e", description=__doc__.splitlines()[0])
  p.add_argument("--workloads", default="64x2,8x16,1x128")
  p.add_argument("--repeats", type=int, default=3, help="timed runs of each process (median)")
  p.add_argument("--cold_start_repeats", type=int, default=3, help="0: no cold-start rows")
  p.add_argument("--target_length", type=int, default=8, help="tokens generated (EOS included)")
  p.add_argument("--input_length", type=int, default=64, help="input tokens (EOS included)")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--output_dir", default=None,
                 help="a new or empty directory to keep the files in (default: a temporary one)")
  p.add_argument("--json", default=None)
  p.add_argument("--markdown", default=None)
  args = p.parse_args(argv)
  workloads = args.workloads.split(",")
  sizes = [serve_workload.parse_workload(w) for w in workloads]
  if min(args.repeats, args.target_length, args.input_length, args.batch_size) < 1 or \
      args.cold_start_repeats < 0:
    raise ConfigError("--repeats, --target_length, --input_length and --batch_size must be "
                      "positive and --cold_start_repeats >= 0")
  outputs = common.output_files(args)
  from benchmarks import serve  # pylint: disable=g-import-not-at-top
  missing = serve.peft_missing()
  if missing:
    raise ConfigError(f"the PyTorch + PEFT side cannot run: {missing}")
  with tempfile.TemporaryDirectory(prefix="spot_jax_serve_e2e_") as tmp:
    work = args.output_dir or tmp
    if args.output_dir and any(fileio.writable_dir(work, "--output_dir").iterdir()):
      raise ConfigError(f"--output_dir {work} is not empty; give a new or empty directory")
    setup(work, max(n for n, _ in sizes), args.seed)
    rows = []
    for w in workloads:
      rows.append(run_workload(work, w, args))
      print(markdown(rows[-1:], None).splitlines()[-1] if len(rows) > 1 else markdown(rows, None),
            end="\n" if len(rows) > 1 else "", flush=True)
    cold = cold_start(work, args) if args.cold_start_repeats else None
  text = markdown(rows, cold)
  if cold:
    print("\n".join(text.splitlines()[len(rows) + 2:]), flush=True)
  common.write_outputs(outputs, {"argv": list(argv), "rows": rows, "cold_start": cold},
                       f"`python -m benchmarks.serve_e2e {' '.join(argv)}`\n\n{text}")
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "benchmarks.serve_e2e"))
