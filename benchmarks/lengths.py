"""`python -m benchmarks.lengths`: examples/s of fixed padding vs length buckets on real lengths.

  python -m benchmarks.lengths --json=bench_lengths.json --markdown=bench_lengths.md \
      [--lengths=file:benchmarks/data/rte_train_t5_input_lengths.txt] \
      [--lengths=task:spot_toy_*_taskless_v100[:train]]

For each length distribution (`--lengths`, repeatable: `file:<path>` with one input length per
line, or `task:<seqio task, mixture or glob of task names>[:split]` whose inputs are measured in
tokens, EOS included) it takes one shuffled pass over the lengths as a stream of `--batch_size`
examples, then groups it twice: fixed padding (every batch [B, --input_length], default the
longest input rounded up to 64) and the trainer's length buckets
(`spot_jax.data.bucketing.bucket_batches` with `--buckets`, default 'auto', and `--bucket_window`).
The train step of `--method` (default PT-100 on t5_small, random weights, dropout 0.1, float32) is
compiled for every input width either stream needs (compile seconds and the number of compiles are
reported on their own), then timed in `--steps` interleaved rounds (one step of every width per
round; median per width). Each mode's examples/s is its examples over the sum of its batches' step
times; the FLOP ratio (fixed over bucketed XLA FLOPs of the same batches) is the speed-up a quiet
machine should approach. Widths are shared between distributions, so each is compiled once per run.
"""
from __future__ import annotations

import fnmatch
import pathlib
import sys
import time
from typing import Optional, Sequence

import jax
import numpy as np

from spot_jax import runtime
from spot_jax import cli, data, models
from spot_jax.cli import flags
from benchmarks import common
from benchmarks.peers import worker as bench_worker
from spot_jax.data import bucketing
from spot_jax import train as train_lib
from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import Transformer, config_by_name
from spot_jax.train.state import TrainState

RTE_LENGTHS = pathlib.Path(__file__).parent / "data" / "rte_train_t5_input_lengths.txt"
DEFAULT_LENGTHS = (f"file:{RTE_LENGTHS}", "task:spot_toy_*_taskless_v100")


def read_lengths_file(path: str) -> np.ndarray:
  """Positive integers, one per line ('#' comments and blank lines skipped)."""
  try:
    text = pathlib.Path(path).read_text()
  except OSError as e:
    raise ConfigError(f"--lengths=file:{path}: cannot read it ({e.strerror}); give a file of one "
                      f"input length per line") from None
  out = []
  for number, line in enumerate(text.splitlines(), start=1):
    line = line.split("#")[0].strip()
    if not line:
      continue
    if not line.isdigit() or int(line) <= 0:
      raise ConfigError(f"--lengths=file:{path}: line {number} is {line!r}; every line must be one "
                        f"positive integer (an input length in tokens)")
    out.append(int(line))
  if not out:
    raise ConfigError(f"--lengths=file:{path} holds no lengths; give one positive integer per line")
  return np.asarray(out)


def read_lengths_task(spec: str, module: str, max_examples: int) -> np.ndarray:
  """Input lengths (tokens, EOS included) of `name[:split]`; a glob pools every matching task."""
  import seqio  # pylint: disable=g-import-not-at-top
  name, _, split = spec.partition(":")
  data.import_modules(module)
  names = sorted(n for n in seqio.TaskRegistry.names() if fnmatch.fnmatchcase(n, name))
  sources = [seqio.get_mixture_or_task(n) for n in names] or [data.get_mixture_or_task(name)]
  out = []
  for source in sources:
    if (split or "train") not in source.splits:
      raise ConfigError(f"--lengths=task:{spec}: {source.name} has no split {split!r}; "
                        f"valid: {', '.join(source.splits)}")
    ds = source.get_dataset(sequence_length=None, split=split or "train", shuffle=False,
                            num_epochs=1)
    out += [len(ex["inputs"]) for ex in ds.take(max_examples).as_numpy_iterator()]
  return np.asarray(out)


def read_lengths(spec: str, module: str, max_examples: int) -> np.ndarray:
  kind, _, rest = spec.partition(":")
  if kind == "file" and rest:
    return read_lengths_file(rest)
  if kind == "task" and rest:
    return read_lengths_task(rest, module, max_examples)
  raise ConfigError(f"--lengths={spec!r}; valid: file:<path> (one length per line) or "
                    f"task:<seqio task or glob>[:split]")


def plan(lengths: np.ndarray, batch_size: int, input_length: int, boundaries: Sequence[int],
         window: int, seed: int) -> dict:
  """One shuffled pass over `lengths` grouped as fixed and as bucketed batches
  (widths per batch)."""
  rng = np.random.RandomState(seed)
  stream = np.minimum(rng.permutation(lengths), input_length)  # truncated as the pipeline does
  num_batches = len(stream) // batch_size
  window = max(1, min(window, num_batches))
  num_batches -= num_batches % window
  if num_batches == 0:
    raise ConfigError(f"{len(lengths)} lengths do not fill one batch of {batch_size}")
  stream = stream[:num_batches * batch_size]
  tokens = (np.arange(input_length)[None] < stream[:, None]).astype(np.int32)  # 1 = real token
  widths = []
  for index, lo in enumerate(range(0, len(stream), window * batch_size)):
    chunk = {"encoder_input_tokens": tokens[lo:lo + window * batch_size]}
    widths += [b["encoder_input_tokens"].shape[1]
               for b in bucketing.bucket_batches(chunk, batch_size, boundaries,
                                                 bucketing.window_rng(seed, index))]
  return {"examples": int(len(stream)), "real_tokens": int(stream.sum()), "bucket_window": window,
          "fixed_widths": [input_length] * num_batches, "bucketed_widths": widths}


def compile_steps(method: str, config_name: str, batch_size: int, widths: Sequence[int],
                  target_length: int, prompt_length: int, dropout_rate: float, seed: int = 0):
  """The method's train step compiled for each input width.

  Returns:
    (run, stats, prompt_length): run(width) takes one timed step at that width and returns its
    seconds; stats[width] holds compile_sec and flops_per_step.
  """
  kind, length = common.METHODS[method]
  length = prompt_length if length is None else length
  config = config_by_name(config_name, dropout_rate=dropout_rate)
  model = models.EncoderDecoderModel(Transformer(config, prompt=common.prompt_module(
      kind, length, config.emb_dim, max(widths))))
  dummy = model.dummy_batch(max(widths), target_length)
  frozen, params, tx, state_rng = common.initial_params(kind, model, dummy, seed)
  holder = {"state": TrainState.create(params, tx, state_rng)}
  step_fn = jax.jit(train_lib.make_train_step(model, tx), donate_argnums=(0,))
  compiled, batches, stats = {}, {}, {}
  for width in sorted(set(widths)):
    batches[width] = common.device_batch(config.vocab_size, batch_size, width, target_length, seed)
    t0 = time.perf_counter()
    compiled[width] = step_fn.lower(holder["state"], frozen, batches[width]).compile()
    stats[width] = {"compile_sec": time.perf_counter() - t0,
                    "flops_per_step": common.xla_flops(compiled[width])}

  def run(width: int) -> float:
    t0 = time.perf_counter()
    holder["state"], metrics = compiled[width](holder["state"], frozen, batches[width])
    jax.block_until_ready(metrics["loss"])
    return time.perf_counter() - t0

  return run, stats, (length if model.has_prompt else 0)


def time_widths(run, widths: Sequence[int], steps: int, warmup: int) -> dict[int, list[float]]:
  """`steps` interleaved rounds (every width once per round) after `warmup` steps per width."""
  for width in widths:
    for _ in range(warmup):
      run(width)
  times = {w: [] for w in widths}
  for _ in range(steps):
    for width in widths:
      times[width].append(run(width))
  return times


def speedup(p: dict, step_sec: dict[int, float]) -> tuple[float, float]:
  """(fixed seconds, bucketed seconds) of the plan's batches at these per-width step times."""
  return sum(step_sec[w] for w in p["fixed_widths"]), sum(step_sec[w] for w in p["bucketed_widths"])


def summarise(name: str, lengths: np.ndarray, p: dict, times: dict[int, list[float]], prompt: int,
              boundaries: Sequence[int], flops: dict[int, Optional[float]]) -> dict:
  step_sec = {w: float(np.median(t)) for w, t in times.items()}
  fixed_s, bucketed_s = speedup(p, step_sec)
  fixed_f, bucketed_f = speedup(p, flops) if all(flops.values()) else (None, None)
  rounds = [speedup(p, {w: t[r] for w, t in times.items()})
            for r in range(len(next(iter(times.values()))))]
  batch_size = p["examples"] // len(p["fixed_widths"])
  counts = {int(w): p["bucketed_widths"].count(w) for w in sorted(set(p["bucketed_widths"]))}
  return {
      "distribution": name, "num_lengths": int(len(lengths)),
      "length_mean": float(lengths.mean()), "length_median": float(np.median(lengths)),
      "length_p90": float(np.percentile(lengths, 90)), "length_max": int(lengths.max()),
      "examples": p["examples"], "batches": len(p["fixed_widths"]),
      "bucket_window": p["bucket_window"], "fixed_input_length": p["fixed_widths"][0],
      "buckets": [int(b) for b in boundaries], "bucketed_batches_per_width": counts,
      "fixed_sec": fixed_s, "bucketed_sec": bucketed_s,
      "fixed_examples_per_sec": p["examples"] / fixed_s,
      "bucketed_examples_per_sec": p["examples"] / bucketed_s, "speedup": fixed_s / bucketed_s,
      "speedup_per_round": [f / b for f, b in rounds],
      "flops_ratio": fixed_f / bucketed_f if fixed_f else None,
      "fixed_real_token_fraction": p["real_tokens"] / (p["examples"] * p["fixed_widths"][0]),
      "bucketed_real_token_fraction": p["real_tokens"] / (sum(p["bucketed_widths"]) * batch_size),
      "prompt_length": prompt,
  }


def markdown(result: dict) -> str:
  lines = ["| distribution | lengths: mean / median / p90 / max | fixed T | buckets | fixed ex/s | "
           "bucketed ex/s | speed-up (per round) | FLOP ratio | real-token share fixed / "
           "bucketed |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in result["distributions"]:
    name = r["distribution"]
    name = f"file:{pathlib.Path(name[5:]).name}" if name.startswith("file:") else name
    lines.append(f"| {name} | {r['length_mean']:.1f} / {r['length_median']:.0f} / "
                 f"{r['length_p90']:.0f} / {r['length_max']} | {r['fixed_input_length']} | "
                 f"{', '.join(map(str, r['buckets']))} | {r['fixed_examples_per_sec']:.2f} | "
                 f"{r['bucketed_examples_per_sec']:.2f} | {r['speedup']:.2f}x "
                 f"({', '.join(f'{x:.2f}' for x in r['speedup_per_round'])}) | "
                 f"{'-' if r['flops_ratio'] is None else format(r['flops_ratio'], '.2f') + 'x'} | "
                 f"{r['fixed_real_token_fraction']:.0%} / "
                 f"{r['bucketed_real_token_fraction']:.0%} |")
  lines += ["", "| input width | step s (median) | compile s | GFLOP/step |", "|---|---|---|---|"]
  for w in result["widths"]:
    flops = w["flops_per_step"]
    lines.append(f"| {w['width']} (+{result['prompt_length']} prompt) | {w['step_sec_median']:.3f} "
                 f"| {w['compile_sec']:.1f} | {flops / 1e9:.1f} |" if flops else
                 f"| {w['width']} | {w['step_sec_median']:.3f} | {w['compile_sec']:.1f} | - |")
  lines.append(f"\n{result['num_compiles']} compiles, {result['compile_sec_total']:.1f} "
               "s in total.")
  return "\n".join(lines) + "\n"


def _parse(argv: Sequence[str]):
  parser = cli.ArgumentParser(prog="benchmarks.lengths", description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", action="append", default=None,
                      help="file:<path> or task:<seqio task or glob>[:split]; repeatable "
                           f"(default: {' and '.join(DEFAULT_LENGTHS)})")
  parser.add_argument("--task_module", default="tasks.embedded",
                      help="module(s) registering the seqio tasks of task: distributions")
  parser.add_argument("--max_examples", type=int, default=1000,
                      help="per task, for task: distributions")
  parser.add_argument("--method", default="pt100", help=f"one of: {', '.join(common.METHODS)}")
  flags.add_backbone(parser, required=False, gin_files=False, checkpoint=False,
                     model_default="t5_small", seed_help="stream order and bucketing windows")
  parser.add_argument("--batch_size", type=int, default=8)
  flags.add_lengths(parser, None, 16,
                    input_help="fixed padding length (default: the longest input rounded up to 64)")
  parser.add_argument("--buckets", default="auto",
                      help="'auto' or comma-separated lengths, e.g. 32,64,128")
  parser.add_argument("--bucket_window", type=int, default=64,
                      help="batches regrouped together (the trainer's)")
  parser.add_argument("--prompt_length", type=int, default=100,
                      help="for methods named without a length (prompt_tuning, smop, residual)")
  parser.add_argument("--dropout_rate", type=float, default=0.1)
  parser.add_argument("--steps", type=int, default=3, help="timed rounds (median per width)")
  parser.add_argument("--warmup", type=int, default=1,
                      help="untimed steps per width after compiling")
  parser.add_argument("--compilation_cache_dir", default=None,
                      help="JAX persistent compilation cache directory (a rerun skips compiling)")
  parser.add_argument("--json", default=None, help="write the results to this file")
  parser.add_argument("--markdown", default=None, help="write Markdown tables to this file")
  return parser.parse_args(argv)


def _buckets(spec: str, input_length: int) -> tuple[int, ...]:
  if spec == bucketing.AUTO_BUCKETS:
    buckets = spec
  else:
    try:
      buckets = tuple(int(x) for x in spec.split(",") if x.strip())
    except ValueError:
      raise ConfigError(f"--buckets={spec!r}; valid: 'auto' or comma-separated increasing lengths, "
                        f"e.g. 32,64,128") from None
  try:
    return bucketing.boundaries(buckets, input_length)
  except ConfigError as e:
    raise ConfigError(f"--buckets={spec}: {e}") from None


def main(argv: Sequence[str]) -> int:
  args = _parse(argv)
  validate.one_of(args.method, "--method", list(common.METHODS))
  config_by_name(args.model)
  for flag in ("batch_size", "target_length", "prompt_length", "steps", "max_examples",
               "bucket_window"):
    validate.positive_int(getattr(args, flag), f"--{flag}")
  validate.positive_int(args.input_length, "--input_length", optional=True)
  validate.positive_int(args.warmup, "--warmup", minimum=0)
  validate.fraction(args.dropout_rate, "--dropout_rate", low_closed=True)
  outputs = common.output_files(args)
  specs = args.lengths or list(DEFAULT_LENGTHS)
  plans = []
  for spec in specs:
    lengths = read_lengths(spec, args.task_module, args.max_examples)
    input_length = args.input_length or int(-(-lengths.max() // 64) * 64)
    boundaries = _buckets(args.buckets, input_length)
    plans.append((spec, lengths, boundaries, plan(lengths, args.batch_size, input_length,
                                                  boundaries, args.bucket_window, args.seed)))
    print(f"{spec}: {len(lengths)} lengths, fixed {input_length}, buckets {boundaries}", flush=True)
  runtime.enable_compilation_cache(args.compilation_cache_dir)
  widths = sorted({w for *_, p in plans for w in p["fixed_widths"] + p["bucketed_widths"]})
  run, stats, prompt = compile_steps(args.method, args.model, args.batch_size, widths,
                                     args.target_length, args.prompt_length, args.dropout_rate,
                                     args.seed)
  print(f"compiled {len(widths)} widths {widths} in "
        f"{sum(s['compile_sec'] for s in stats.values()):.1f} s",
        flush=True)
  times = time_widths(run, widths, args.steps, args.warmup)
  step_sec = {w: float(np.median(t)) for w, t in times.items()}
  result = {
      "method": args.method, "config": args.model, "batch_size": args.batch_size,
      "target_length": args.target_length, "prompt_length": prompt,
      "dropout_rate": args.dropout_rate,
      "steps": args.steps, "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
      "argv": list(argv), "num_compiles": len(widths),
      "compile_sec_total": sum(s["compile_sec"] for s in stats.values()),
      "widths": [dict(width=w, step_sec_median=step_sec[w], step_sec_all=times[w], **stats[w])
                 for w in widths],
      "distributions": [summarise(spec, lengths, p, times, prompt, b,
                                  {w: stats[w]["flops_per_step"] for w in widths})
                        for spec, lengths, b, p in plans],
      "peak_host_memory_bytes": bench_worker.peak_host_memory_bytes(),
  }
  table = markdown(result)
  print(table, end="", flush=True)
  common.write_outputs(outputs, result, (
      f"`python -m benchmarks.lengths {' '.join(argv)}`: {args.method} on {args.model}, batch "
      f"{args.batch_size}, {args.target_length} targets, dropout {args.dropout_rate}, "
      "float32\n\n" + table))
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "benchmarks.lengths"))
