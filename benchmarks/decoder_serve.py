"""`python -m benchmarks.decoder_serve`: many prompts on one frozen decoder-only model, mixed
batches against one prompt at a time and PyTorch + PEFT, on the same requests.

  python -m benchmarks.decoder_serve --workloads=64x2 --tasks=score,generate --vs=peft \
      --json=decoder_serve.json --markdown=decoder_serve.md

`benchmarks.serve`'s design on a random `DecoderLM` (default: Llama 3.2's layout at T5-small's
size: `--model=llama_3_2_1b` with width 512, 4 layers, 8 query heads of 64 over 2 key/value
heads, SwiGLU 1536, vocabulary 32000, untied; BOS 2, EOS 1 as the workload's), `--prompt_length`
Prompt Tuning prompts, served
  mixed       by spot-jax's `spot_jax.serve.Server` (`serve.mixed_decoder`) in batches of
              `--batch_size` rows in arrival order, each row with its own prompt, one jitted
              call per batch;
  one-prompt  by spot-jax one prompt at a time (min(--batch_size, N) rows per call);
  peft        by PyTorch + PEFT in its own process (`benchmarks.peers.peft_decoder_serve`): the
              same weights (`save_hf_dir`) and prompts (`peft_causal.export_prompt_adapter`),
              every adapter loaded once, then per prompt `set_adapter`.
Tasks: `score` (log-likelihood of each of --num_labels labels after [BOS, input]) and
`generate` (--target_length greedy tokens). Mixed predictions are checked against one prompt at
a time before timing; PEFT's against spot-jax's (labels: the same argmax, scores within 1e-4).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, serve, serve_workload
from spot_jax import cli, runtime, validate
from spot_jax.errors import ConfigError

TASKS = ("score", "generate")
GOALS = {"64x2": 3.0}  # mixed spot-jax's examples/s over PEFT's
SHAPE = dict(vocab_size=32000, emb_dim=512, num_heads=8, num_kv_heads=2, head_dim=64,
             mlp_dim=1536, num_layers=4)
OVERRIDES = tuple(SHAPE)


def serve_config(args):
  """The `--model` DecoderConfig with the shape flags, BOS 2 and EOS 1 (the workload's)."""
  from spot_jax.backbones.decoder import config_by_name  # pylint: disable=g-import-not-at-top
  changes = {k: getattr(args, k) for k in OVERRIDES if getattr(args, k)}
  config = config_by_name(args.model)
  return config.replace(**changes, layer_types=(), bos_id=2, eos_id=serve_workload.EOS_ID,
                        pad_id=0, tie_word_embeddings=False, rope_scaling=None,
                        sliding_window=None)


def build_table(num_prompts: int, length: int, emb_dim: int, seed: int):
  """`num_prompts` random [L, E] prompts (uniform(-0.5, 0.5)) in a `PromptTable`."""
  from spot_jax.serve.catalog.table import PromptTable, ServedPrompt  # pylint: disable=g-import-not-at-top
  rs = np.random.RandomState(seed + 1)
  return PromptTable([ServedPrompt(f"p{i}", rs.uniform(-0.5, 0.5, (length, emb_dim)),
                                   source=f"pt{length}") for i in range(num_prompts)], emb_dim)


def run_peft(config, frozen, table, workloads, tasks: Sequence[str], args) -> list[dict]:
  """Serves the workloads with PyTorch + PEFT in its own process, on the same weights and
  prompts written to a temporary directory; its rows, outputs included."""
  from spot_jax.backbones.decoder.checkpoints import huggingface  # pylint: disable=g-import-not-at-top
  from spot_jax.serve.export import peft_causal  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory(prefix="spot_jax_bench_decoder_serve_") as work:
    hf_dir = huggingface.save_hf_dir(os.path.join(work, "hf"), config,
                                     jax.tree.map(np.asarray, frozen))
    for entry in table.entries:
      peft_causal.export_prompt_adapter(entry.prompts[0], config,
                                        os.path.join(work, "adapters", entry.name),
                                        base_model_name_or_path=hf_dir)
    os.makedirs(os.path.join(work, "workloads"))
    for w in workloads:
      serve_workload.write(w, os.path.join(work, "workloads", f"{w.name}.json"))
    cmd = [sys.executable, "-m", "benchmarks.peers.peft_decoder_serve", f"--output_dir={work}",
           f"--workloads={','.join(w.name for w in workloads)}", f"--tasks={','.join(tasks)}",
           f"--method={table.entries[0].source}", f"--batch_size={args.batch_size}",
           f"--target_length={args.target_length}", f"--repeats={args.repeats}",
           f"--bos_id={config.bos_id}",
           f"--threads={args.peer_threads or os.cpu_count()}"]
    env = dict(os.environ, **{runtime.ENV: args.peer_malloc})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
  if proc.returncode != 0:
    raise RuntimeError(f"the PEFT decoder serving peer failed: "
                       f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
  import json  # pylint: disable=g-import-not-at-top
  return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def goal_lines(rows: Sequence[dict]) -> list[str]:
  """Mixed spot-jax's examples/s over PEFT's per (workload, task), against the goals."""
  out = []
  for r in rows:
    if r["way"] == "peft":
      goal = GOALS.get(r["workload"])
      met = "" if goal is None else (f" (goal {goal:g}x: "
                                     f"{'met' if r['mixed_speedup'] >= goal else 'NOT met'})")
      out.append(f"{r['workload']} {r['task']}: spot-jax mixed {r['mixed_speedup']:.2f}x "
                 f"PEFT's examples/s{met}")
  return out


def _parse(argv: Sequence[str]):
  p = cli.ArgumentParser(prog="benchmarks.decoder_serve", description=__doc__.splitlines()[0])
  p.add_argument("--model", default="llama_3_2_1b",
                 help="a spot_jax.backbones.decoder config name, reshaped by the flags below")
  for name, value in SHAPE.items():
    p.add_argument(f"--{name}", type=int, default=value, help=f"0: the config's own {name}")
  p.add_argument("--prompt_length", type=int, default=100)
  p.add_argument("--workloads", default="64x2", help="comma-separated PxN")
  p.add_argument("--tasks", default="score,generate", help=f"from: {', '.join(TASKS)}")
  p.add_argument("--input_length", type=int, default=64, help="longest request (EOS included)")
  p.add_argument("--target_length", type=int, default=8, help="tokens generated")
  p.add_argument("--num_labels", type=int, default=2)
  p.add_argument("--label_length", type=int, default=2)
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--vs", default="peft", choices=("peft", "none"))
  p.add_argument("--peer_threads", type=int, default=0,
                 help="torch threads of the PEFT process (0: every core, as XLA uses)")
  p.add_argument("--peer_malloc", default="system", choices=runtime.MODES)
  p.add_argument("--json", default=None)
  p.add_argument("--markdown", default=None)
  return p.parse_args(argv)


def main(argv: Sequence[str]) -> int:
  args = _parse(argv)
  tasks, names = args.tasks.split(","), args.workloads.split(",")
  bad = [t for t in tasks if t not in TASKS]
  if bad:
    raise ConfigError(f"unknown task {bad[0]!r}; valid: {', '.join(TASKS)}")
  for flag in ("prompt_length", "input_length", "target_length", "num_labels", "label_length",
               "batch_size", "repeats"):
    validate.positive_int(getattr(args, flag), f"--{flag}")
  outputs = common.output_files(args)
  config = serve_config(args)
  from spot_jax import backbone as backbone_lib, models  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.decoder import DecoderLM  # pylint: disable=g-import-not-at-top
  dummy = jnp.ones((1, 4), jnp.int32)
  frozen = jax.jit(lambda r: models.unbox(DecoderLM(config).init({"params": r}, dummy)))(
      backbone_lib.seed_keys(args.seed)[0])["params"]
  table = build_table(max(serve_workload.parse_workload(w)[0] for w in names),
                      args.prompt_length, config.emb_dim, args.seed)
  from spot_jax.serve.model import server as server_lib  # pylint: disable=g-import-not-at-top
  server = server_lib.Server(DecoderLM(config), frozen, table, settings=server_lib.DecodeSettings(
      args.target_length, "greedy", eos_id=serve_workload.EOS_ID))
  workloads = [serve_workload.make_workload(w, table.names, config.vocab_size, args.input_length,
                                            args.num_labels, args.label_length, args.seed)
               for w in names]
  rows, mixed_outputs = [], {}
  print(serve.markdown_table([]), end="", flush=True)
  for w in workloads:
    for task in tasks:
      pair, mixed_outputs[(w.name, task)] = serve.bench_spot_jax(
          f"pt{args.prompt_length}", w, task, server, args.batch_size, args.repeats)
      pair[0]["mixed_speedup"] = 1.0
      pair[1]["mixed_speedup"] = pair[0]["examples_per_sec"] / pair[1]["examples_per_sec"]
      rows += pair
      print(serve.markdown_table(pair).split("\n", 2)[2], end="", flush=True)
  if args.vs == "peft":
    for peft_row in run_peft(config, frozen, table, workloads, tasks, args):
      mixed = next(r for r in rows if r["way"] == "mixed" and r["workload"] ==
                   peft_row["workload"] and r["task"] == peft_row["task"])
      peft_row["mixed_speedup"] = mixed["examples_per_sec"] / peft_row["examples_per_sec"]
      peft_row["agreement_with_mixed"] = serve.compare(
          peft_row["task"], mixed_outputs[(peft_row["workload"], peft_row["task"])],
          peft_row.pop("outputs"))
      rows.append(peft_row)
      print(serve.markdown_table([peft_row]).split("\n", 2)[2], end="", flush=True)
  goals = goal_lines(rows)
  print("".join(line + "\n" for line in goals), end="", flush=True)
  shape = {k: getattr(config, k) for k in OVERRIDES}
  meta = {"argv": list(argv), "model": args.model, "shape": shape, "cpu_count": os.cpu_count(),
          "malloc": runtime.applied(), "rows": rows}
  common.write_outputs(outputs, meta, (
      f"`python -m benchmarks.decoder_serve {' '.join(argv)}` ({args.model} reshaped: "
      f"{shape})\n\n" + serve.markdown_table(rows) + "".join(f"\n{line}\n" for line in goals)))
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "benchmarks.decoder_serve"))
