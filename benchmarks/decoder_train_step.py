"""`python -m benchmarks.decoder_train_step`: the trainer's step on a decoder-only backbone
against PyTorch + PEFT prompt tuning, in float32, on the same weights, prompt and tokens.

  python -m benchmarks.decoder_train_step --models=llama_3_2_1b,gemma_3_1b --num_layers=2 \
      --vs=peft --steps=7 --json=decoder.json --markdown=decoder.md

Each `--models` entry is a `spot_jax.backbones.decoder` config at `--num_layers` layers (full
width and vocabulary; a Gemma pattern keeps its last layer full, the others sliding). spot-jax
times the trainer's jitted step (`spot_jax.train.step.make_train_step`: gradients of the prompt
tree only, the state donated, the frozen tree an input) of `DecoderOnlyModel` with
`PromptTuning(length=--prompt_length)` and optax AdamW; z-loss 0, so its loss is the mean
cross-entropy of the target tokens, PEFT's. As in the trainer (`DecoderOnlyModel.for_batches`),
the output layer runs on the target positions only; PEFT's runs on every position. A row is
`--input_length` + `--target_length` tokens (the loss on the targets) after the prompt.

With `--vs=peft` (default) the PEFT side runs first, in its own process
(`benchmarks.peers.peft_decoder_train`): it builds the transformers model of
`hf.config_to_hf(config)` with random weights, writes them and PEFT's initial prompt to a
temporary directory, then times torch AdamW steps with the same loss. spot-jax then reads both
(`hf.params_from_hf`) and times its own step, so both start from the same parameters and read
the same batch: `first loss` is each side's loss of step 1, which must agree. `--vs=none`:
spot-jax alone, on its own random weights. Steps: the first (compile, for spot-jax) and
`--warmup` more untimed, then `--steps` timed one by one; rows give the median and min/max.

`--quantization=none,int8` adds a row per quantized frozen backbone (QUANTIZATION, spot-jax
alone, its weights quantized from the float row's) and prints each one's step time over the
float32 row's: the price of dequantizing in the step. `--remat=none,full,save_dots` likewise
(REMAT of the layers; every remat x quantization pair a row): the price of recomputing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional, Sequence

import numpy as np

from benchmarks import common
from benchmarks.peers import peft_decoder_train as peer
from benchmarks.peers import worker as bench_worker
from spot_jax import cli, runtime, validate
from spot_jax.backbones import memory, quantization
from spot_jax.errors import ConfigError

MODELS = ("llama_3_2_1b", "gemma_3_1b")
GOAL = 1.3  # spot-jax's steps/s over PEFT's
LOSS_TOLERANCE = 1e-4  # step 1's loss, both sides, relative


def reduced_config(name: str, num_layers: Optional[int]):
  """The named DecoderConfig at `num_layers` layers (None: all); with sliding and full layers,
  the last layer full and the others sliding."""
  from spot_jax.backbones.decoder import config_by_name  # pylint: disable=g-import-not-at-top
  config = config_by_name(name)
  if num_layers is None or num_layers == config.num_layers:
    return config
  types = config.layer_types
  if types:
    types = ("sliding",) * (num_layers - 1) + ("full",) if "full" in types else types[:num_layers]
  return config.replace(num_layers=num_layers, layer_types=types)


def run_peer(config, work_dir: str, args) -> dict:
  """PEFT's row, from its own process; it leaves weights.safetensors and prompt.npy."""
  from spot_jax.backbones.decoder import hf  # pylint: disable=g-import-not-at-top
  with open(os.path.join(work_dir, "hf_config.json"), "w", encoding="utf-8") as f:
    json.dump(hf.config_to_hf(config), f)
  cmd = [sys.executable, "-m", "benchmarks.peers.peft_decoder_train", f"--work_dir={work_dir}",
         f"--batch_size={args.batch_size}", f"--input_length={args.input_length}",
         f"--target_length={args.target_length}", f"--prompt_length={args.prompt_length}",
         f"--steps={args.steps}", f"--warmup={args.warmup}",
         f"--learning_rate={args.learning_rate}", f"--weight_decay={args.weight_decay}",
         f"--seed={args.seed}", f"--weight_std={args.weight_std}",
         f"--threads={args.peer_threads or os.cpu_count()}"]
  proc = subprocess.run(cmd, capture_output=True, text=True,
                        env=dict(os.environ, **{runtime.ENV: args.peer_malloc}))
  if proc.returncode != 0:
    raise RuntimeError("the PEFT decoder benchmark failed: "
                       f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _mesh():
  """The trainer's one-device mesh and logical rules (a context manager)."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from spot_jax import partitioning  # pylint: disable=g-import-not-at-top
  stack = contextlib.ExitStack()
  stack.enter_context(jax.set_mesh(partitioning.create_mesh(1)))
  stack.enter_context(nn.logical_axis_rules(list(partitioning.logical_rules())))
  return stack


def initial_params(model, config, work_dir: Optional[str], seed: int) -> tuple[Any, Any]:
  """(frozen tree, prompt tree): the peer's files when `work_dir` has them, else random."""
  import jax  # pylint: disable=g-import-not-at-top
  from spot_jax import backbone as backbone_lib, models  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.decoder import hf  # pylint: disable=g-import-not-at-top
  dummy = model.dummy_batch(4, 4)
  if work_dir is None:
    backbone_rng, prompt_rng, _ = backbone_lib.seed_keys(seed)
    frozen = jax.jit(lambda r: models.unbox(model.init_backbone(r, dummy)))(backbone_rng)
    prompt = jax.jit(lambda r, f: models.unbox(model.init_prompt(r, f, dummy)))(prompt_rng,
                                                                              frozen)
    return frozen, prompt
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  frozen = hf.params_from_hf(safetensors.numpy.load_file(
      os.path.join(work_dir, "weights.safetensors")), config)
  shapes = jax.eval_shape(lambda: models.unbox(model.init_prompt(
      jax.random.PRNGKey(0), frozen, dummy)))
  prompt = np.load(os.path.join(work_dir, "prompt.npy"))
  if jax.tree.leaves(shapes)[0].shape != prompt.shape:
    raise ConfigError(f"PEFT's prompt has shape {prompt.shape}, spot-jax's "
                      f"{jax.tree.leaves(shapes)[0].shape}")
  return frozen, jax.tree.map(lambda _: prompt, shapes)


def bench_spot_jax(config, work_dir: Optional[str], args) -> dict:
  """Times the trainer's jitted step of `DecoderOnlyModel` + Prompt Tuning; one row."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from spot_jax import models, prompts  # pylint: disable=g-import-not-at-top
  from spot_jax.backbones.decoder import DecoderLM  # pylint: disable=g-import-not-at-top
  from spot_jax.train import optimizers  # pylint: disable=g-import-not-at-top
  from spot_jax.train import step as step_lib  # pylint: disable=g-import-not-at-top
  from spot_jax.train.state import TrainState  # pylint: disable=g-import-not-at-top
  model = models.DecoderOnlyModel(  # as the trainer configures it for these lengths
      DecoderLM(config, prompt=prompts.PromptTuning(length=args.prompt_length)),
      z_loss=0.0).for_batches({"inputs": args.input_length, "targets": args.target_length})
  with _mesh():
    frozen, prompt = initial_params(model, config, work_dir, args.seed)
    if quantization.enabled(config):
      boxed = jax.eval_shape(model.init_backbone, jax.random.PRNGKey(0), model.dummy_batch(4, 4))
      frozen = quantization.quantize(frozen, boxed, config)
    tx = optimizers.adamw(learning_rate=args.learning_rate, weight_decay=args.weight_decay)
    state = TrainState.create(jax.device_put(prompt), tx, jax.random.PRNGKey(args.seed))
    frozen = jax.device_put(frozen)
    sequence, weights = peer.token_batch(config.vocab_size, args.batch_size, args.input_length,
                                         args.target_length, args.seed)
    batch = {"decoder_target_tokens": jnp.asarray(sequence),
             "decoder_input_tokens": jnp.asarray(np.pad(sequence[:, :-1], ((0, 0), (1, 0)))),
             "decoder_loss_weights": jnp.asarray(weights)}
    t0 = time.perf_counter()
    step = jax.jit(step_lib.make_train_step(model, tx), donate_argnums=(0,)).lower(
        state, frozen, batch).compile()
    compile_s = time.perf_counter() - t0
    state, metrics = step(state, frozen, batch)
    first_loss = float(metrics["loss"])
    first_s = time.perf_counter() - t0
    for _ in range(args.warmup):
      state, metrics = step(state, frozen, batch)
    jax.block_until_ready(metrics["loss"])
    times = []
    for _ in range(args.steps):
      t0 = time.perf_counter()
      state, metrics = step(state, frozen, batch)
      jax.block_until_ready(metrics["loss"])
      times.append(time.perf_counter() - t0)
  median = float(np.median(times))
  return {"framework": "spot-jax", "step_sec_all": times, "step_sec_median": median,
          "steps_per_sec": 1.0 / median, "step_sec_min": min(times), "step_sec_max": max(times),
          "compile_sec": compile_s, "first_step_sec": first_s, "first_loss": first_loss,
          "final_loss": float(metrics["loss"]), "flops_per_step": common.xla_flops(step),
          "trainable_params": int(sum(np.size(x) for x in jax.tree.leaves(prompt))),
          "frozen_params": int(sum(np.size(x) for x in jax.tree.leaves(frozen))),
          "frozen_bytes": int(sum(x.nbytes for x in jax.tree.leaves(frozen))),
          "peak_host_memory_bytes": bench_worker.peak_host_memory_bytes(),
          "load_average_1min": os.getloadavg()[0], "malloc": runtime.applied(),
          "jax": jax.__version__, "devices": [str(d) for d in jax.devices()]}


def bench_model(name: str, args, quantized: str = "none", remat: str = "none") -> dict:
  """One model's row: PEFT's (with --vs=peft, first), then spot-jax's on the same parameters;
  a `quantized` or rematerialised backbone's: spot-jax's alone."""
  config = reduced_config(name, args.num_layers)
  if quantized != "none" or remat != "none":
    config = config.replace(quantization=quantized, remat_policy=remat)
    label = " ".join(x for x in (quantized, "remat " + remat) if x not in ("none", "remat none"))
    return {"model": f"{name} {label}", "num_layers": config.num_layers,
            "quantization": quantized, "remat": remat,
            "spot_jax": bench_spot_jax(config, None, args)}
  row = {"model": name, "num_layers": config.num_layers, "vocab_size": config.vocab_size,
         "emb_dim": config.emb_dim, "batch_size": args.batch_size,
         "input_length": args.input_length, "target_length": args.target_length,
         "prompt_length": args.prompt_length}
  if args.vs != "peft":
    return dict(row, spot_jax=bench_spot_jax(config, None, args))
  with tempfile.TemporaryDirectory(prefix="spot_jax_bench_decoder_") as work:
    row["peft"] = run_peer(config, work, args)
    row["spot_jax"] = bench_spot_jax(config, work, args)
  ours, theirs = row["spot_jax"], row["peft"]
  row["speedup"] = ours["steps_per_sec"] / theirs["steps_per_sec"]
  row["first_loss_rel_diff"] = (abs(ours["first_loss"] - theirs["first_loss"])
                                / abs(theirs["first_loss"]))
  if row["first_loss_rel_diff"] > LOSS_TOLERANCE:
    raise RuntimeError(f"{name}: step 1's loss differs: spot-jax {ours['first_loss']:.6f}, "
                       f"PEFT {theirs['first_loss']:.6f}; the two sides do not compute the same")
  return row


def _span(side: dict) -> str:
  return (f"{side['step_sec_median']:.3f} ({side['step_sec_min']:.3f}-"
          f"{side['step_sec_max']:.3f})")


def markdown_table(rows: Sequence[dict]) -> str:
  """steps/s of each side, their ratio against the goal, and step 1's loss on both."""
  lines = ["| model (layers) | spot-jax steps/s | PEFT steps/s | ratio | goal | spot-jax step s "
           "(min-max) | PEFT step s (min-max) | first loss spot-jax / PEFT | compile s |",
           "|---|---:|---:|---:|---|---|---|---|---:|"]
  for r in rows:
    s, p = r["spot_jax"], r.get("peft")
    cells = [f"{r['model']} ({r['num_layers']})", f"{s['steps_per_sec']:.3f}"]
    if p is None:
      cells += ["-", "-", "-", _span(s), "-", f"{s['first_loss']:.5f} / -"]
    else:
      verdict = "met" if r["speedup"] >= GOAL else "NOT met"
      cells += [f"{p['steps_per_sec']:.3f}", f"**{r['speedup']:.2f}x**",
                f">= {GOAL}x: {verdict}", _span(s), _span(p),
                f"{s['first_loss']:.5f} / {p['first_loss']:.5f}"]
    lines.append("| " + " | ".join(cells + [f"{s['compile_sec']:.1f}"]) + " |")
  return "\n".join(lines) + "\n"


def _parse(argv: Sequence[str]):
  p = cli.ArgumentParser(prog="benchmarks.decoder_train_step",
                         description=__doc__.splitlines()[0])
  p.add_argument("--models", default=",".join(MODELS),
                 help="comma-separated spot_jax.backbones.decoder config names")
  p.add_argument("--num_layers", type=int, default=2, help="layers of each model (0: all)")
  p.add_argument("--batch_size", type=int, default=8)
  p.add_argument("--input_length", type=int, default=112, help="tokens before the targets")
  p.add_argument("--target_length", type=int, default=16, help="tokens the loss counts")
  p.add_argument("--prompt_length", type=int, default=100)
  p.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
  p.add_argument("--warmup", type=int, default=1, help="untimed steps after the first")
  p.add_argument("--learning_rate", type=float, default=0.01, help="AdamW's, both sides")
  p.add_argument("--weight_decay", type=float, default=0.01, help="AdamW's, both sides")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--weight_std", type=float, default=0.0,
                 help="> 0: every weight ~ N(0, std^2) instead of transformers' init")
  p.add_argument("--vs", default="peft", choices=("peft", "none"))
  p.add_argument("--peer_threads", type=int, default=0,
                 help="torch threads of the PEFT process (0: every core, as XLA uses)")
  p.add_argument("--peer_malloc", default="system", choices=runtime.MODES,
                 help="host memory settings of the PEFT process (see benchmarks --peer_malloc)")
  p.add_argument("--quantization", default="none",
                 help="comma list of the frozen backbone's QUANTIZATION: none, int8, int4, nf4 "
                      "(a quantized row: spot-jax alone, against the float32 row)")
  p.add_argument("--remat", default="none",
                 help="comma list of the layers' REMAT: none, full, save_dots, offload (a "
                      "remat row: spot-jax alone, against the none/float32 row)")
  p.add_argument("--json", default=None, help="write the rows to this file")
  p.add_argument("--markdown", default=None, help="write a Markdown table to this file")
  return p.parse_args(argv)


def main(argv: Sequence[str]) -> int:
  args = _parse(argv)
  names = [m for m in args.models.split(",") if m]
  for name in names:
    reduced_config(name, None)  # an unknown name fails here, in one line
  for flag in ("batch_size", "input_length", "target_length", "prompt_length", "steps"):
    validate.positive_int(getattr(args, flag), f"--{flag}")
  validate.positive_int(args.warmup, "--warmup", minimum=0)
  validate.positive_int(args.num_layers, "--num_layers", minimum=0)
  args.num_layers = args.num_layers or None
  outputs = common.output_files(args)
  kinds = [validate.one_of(q.strip(), "--quantization", quantization.QUANTIZATIONS)
           for q in args.quantization.split(",")]
  remats = [validate.one_of(r.strip(), "--remat", memory.REMAT_POLICIES)
            for r in args.remat.split(",")]
  rows, ratios = [], []
  for name in names:
    for remat in remats:
      for quantized in kinds:
        rows.append(bench_model(name, args, quantized, remat))
        table = markdown_table(rows)
        print(table if len(rows) == 1 else table.splitlines()[-1] + "\n", end="", flush=True)
    group = rows[-len(kinds) * len(remats):]
    base = [r for r in group if "quantization" not in r]
    for row in group:
      if base and "quantization" in row:
        ratio = row["spot_jax"]["step_sec_median"] / base[0]["spot_jax"]["step_sec_median"]
        size = row["spot_jax"]["frozen_bytes"] / base[0]["spot_jax"]["frozen_bytes"]
        row["step_time_vs_float32"], row["frozen_bytes_vs_float32"] = ratio, size
        ratios.append(f"{row['model']}: step time {ratio:.2f}x none/float32's, frozen bytes "
                      f"{size:.2f}x (host buffers)")
  print("\n".join(ratios))
  meta = {"argv": list(argv), "cpu_count": os.cpu_count(), "rows": rows}
  common.write_outputs(outputs, meta, f"`python -m benchmarks.decoder_train_step "
                                      f"{' '.join(argv)}`\n\n" + markdown_table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "benchmarks.decoder_train_step"))
