r"""`python -m spot_jax.demo`: every prompt method, really learning, on the embedded toy T5.

  1. prompt-tune the source tasks SPoT needs (tasks.embedded.RELATED of each target)
  2. prompt-tune each target with Prompt Tuning, SPoT (started from the prompt of the related
     source that scored best), SMoP (4 prompts x 5 tokens) and Residual Prompt Tuning
  3. print a table (validation accuracy and wall time per method and target) and write
     results.json, results.md and results.png to --output_dir

Every run is an ordinary trainer run in <output_dir>/runs/<name>. Rerunning with the same
flags reuses the finished runs (same numbers, seconds); --fresh trains everything again.

  python -m spot_jax.demo                                   # about 3 minutes on 2 CPU cores
  python -m spot_jax.demo --quick                           # fewer steps, the same compiles
  python -m spot_jax.demo --full --output_dir=/tmp/demo_full  # more steps
  python -m spot_jax.demo --methods=pt,spot --targets=sentiment_travel
"""
from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import pathlib
import shutil
import sys
import time
from typing import Optional, Sequence

from spot_jax import cli
from spot_jax.cli import flags
from spot_jax import embedded
from spot_jax import fileio
from spot_jax.demo import runs
from spot_jax.demo import results as results_lib
from spot_jax.errors import ConfigError

QUICK = dict(source_steps=100, target_steps=50)
FULL = dict(source_steps=500, target_steps=300, batch_size=32)


def _choices(value: str, valid: Sequence[str], what: str, flag: str) -> list[str]:
  chosen = [v.strip() for v in value.split(",")]
  if chosen == [""]:
    raise ConfigError(f"{flag} is empty; valid {what}s: {', '.join(valid)}")
  for i, v in enumerate(chosen):
    if v not in valid:
      close = difflib.get_close_matches(v, valid, n=1)
      hint = f"; did you mean {close[0]!r}?" if close else ""
      raise ConfigError(f"unknown {what} {v!r} in {flag} (entry {i}{hint}); valid: {', '.join(valid)}")
  return list(dict.fromkeys(chosen))


def _writable(path: str) -> pathlib.Path:
  out = fileio.writable_dir(path, "--output_dir")
  (out / "runs").mkdir(exist_ok=True)
  return out


def _parser() -> cli.ArgumentParser:
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  p = cli.ArgumentParser(prog="spot_jax.demo", description=__doc__.splitlines()[0])
  flags.add_output_dir(p, "where runs and results go (default ./spot_demo)", default="spot_demo")
  p.add_argument("--methods", default=",".join(runs.METHODS),
                 help=f"comma list of {', '.join(runs.METHODS + runs.EXTRA_METHODS)} (spot_unrelated: "
                      f"SPoT from an unrelated source, a control)")
  p.add_argument("--targets", default=",".join(suite.TARGETS),
                 help=f"comma list of {', '.join(suite.TARGETS + suite.HARD_TARGETS)} (the last two: "
                      f"skills the toy backbone only half-learned)")
  p.add_argument("--seed", type=int, default=0, help="seed of every run")
  speed = p.add_mutually_exclusive_group()
  speed.add_argument("--quick", action="store_true", help=f"fewer steps: {QUICK}")
  speed.add_argument("--full", action="store_true", help=f"more steps: {FULL}")
  p.add_argument("--source_steps", type=int, default=None, help="override the source steps")
  p.add_argument("--target_steps", type=int, default=None, help="override the target steps")
  p.add_argument("--fresh", action="store_true", help="retrain runs already finished in --output_dir")
  p.add_argument("--compilation_cache", default=None,
                 help="JAX persistent compilation cache directory (default <output_dir>/jax_cache; 'none' disables)")
  return p


def main(argv: Sequence[str]) -> Optional[int]:
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  args = _parser().parse_args(argv)
  methods = _choices(args.methods, runs.METHODS + runs.EXTRA_METHODS, "method", "--methods")
  targets = _choices(args.targets, suite.TARGETS + suite.HARD_TARGETS, "target task", "--targets")
  changes = dict(QUICK if args.quick else FULL if args.full else {}, seed=args.seed)
  for name in ("source_steps", "target_steps"):
    if getattr(args, name) is not None:
      if getattr(args, name) <= 0:
        raise ConfigError(f"--{name} must be a positive integer, got {getattr(args, name)}")
      changes[name] = getattr(args, name)
  settings = dataclasses.replace(runs.Settings(), **changes)
  if not os.path.isdir(embedded.CHECKPOINT_PATH):
    raise ConfigError(f"the embedded toy model is missing at {embedded.CHECKPOINT_PATH}; "
                      f"make it with `python -m spot_jax.embedded.pretrain`")
  out = _writable(args.output_dir)
  if args.compilation_cache != "none":
    import jax  # pylint: disable=g-import-not-at-top
    jax.config.update("jax_compilation_cache_dir", args.compilation_cache or str(out / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

  # seqio's advice about uncached function datasets and long sequence lengths does not apply to
  # these small in-memory tasks; keep the progress display readable.
  logging.getLogger("absl").setLevel(logging.ERROR)
  started = time.time()
  vocab_rows = suite.get_vocabulary().vocab_size - suite.EXTRA_IDS
  sources = sorted({s for t in targets for s in suite.RELATED[t]}) if "spot" in methods else []
  if "spot_unrelated" in methods:
    sources = sorted(set(sources) | {suite.UNRELATED[t][0] for t in targets})
  total = len(sources) + len(targets) * len(methods)
  done = [0]
  results: list[dict] = []
  print(f"spot_jax.demo: {total} prompt runs ({len(sources)} sources, {len(targets)} targets x "
        f"{len(methods)} methods) on the embedded {embedded.CONFIG_NAME}, {settings.source_steps} "
        f"source / {settings.target_steps} target steps, seed {settings.seed}; runs in {out / 'runs'}",
        flush=True)

  def run(spec: runs.RunSpec) -> dict:
    done[0] += 1
    run_dir = out / "runs" / spec.name
    prefix = f"[{done[0]:2d}/{total}] {spec.name:<32}"
    print(f"{prefix} training ...", end="", flush=True)
    if args.fresh and run_dir.exists():
      shutil.rmtree(run_dir)
    result = runs.finished_result(run_dir, spec, settings)
    reused = result is not None
    if result is None:
      result = runs.execute(spec, settings, run_dir, vocab_rows)
    print(f"\r{prefix} accuracy {result['accuracy']:5.1f}%  {result['seconds']:5.1f}s"
          f"{'  (finished earlier, reused)' if reused else ''}"
          f"{'  from ' + result['init_from'] if result['init_from'] else ''}"
          f"   [{time.time() - started:.0f}s elapsed]", flush=True)
    results.append(result)
    return result

  best_source = {}
  source_results = {s: run(runs.RunSpec(s, "pt", "source")) for s in sources}
  for target in targets:
    if "spot" in methods:
      related = suite.RELATED[target]  # the best related source; ties go to the first listed
      best_source[target] = max(related, key=lambda s: (source_results[s]["accuracy"], -related.index(s)))
    for method in methods:
      source = {"spot": best_source.get(target), "spot_unrelated": suite.UNRELATED[target][0]}.get(method)
      init_from = str(out / "runs" / f"source_{source}") if source else None
      run(runs.RunSpec(target, method, "target", init_from))

  chance = {t: round(suite.TASKS[t].chance, 1) for t in targets}
  rows = results_lib.table_rows(results, targets, methods, chance)
  summary = {"settings": dataclasses.asdict(settings), "methods": methods, "targets": targets,
             "chance": chance, "spot_source": best_source, "runs": results,
             "wall_seconds": round(time.time() - started, 1)}
  paths = results_lib.write(out, summary, rows)
  print()
  print(results_lib.plain(rows))
  print("\nvalidation accuracy % (run wall time); SPoT sources: "
        + (", ".join(f"{t} <- {s}" for t, s in best_source.items()) or "none"))
  print(f"demo took {time.time() - started:.0f}s; wrote {', '.join(str(p) for p in paths)}")
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "spot_jax.demo"))
