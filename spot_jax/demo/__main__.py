r"""`python -m spot_jax.demo`: the four papers' headline claims, tested on the embedded toy T5,
with seeds.

  1. prompt-tune the 8 source tasks (one job: 8 runs in one jitted step; seed: one more than the
     largest target seed) and add their prompts and task embeddings (each run's prompt at the
     embedding step) to a prompt library
  2. Prompt Tuning on each target in the low-resource regime (its first 32 training examples,
     20 steps), 20 seeds (one job for every target and seed); seed s's prompt at the embedding
     step is the target's task embedding
  3. retrieval ranks the library by similarity to it: SPoT's run of seed s starts from the most
     similar source's prompt (the suite's RELATED map only checks the choice); then SMoP
     (4 prompts x 5 tokens), Residual Prompt Tuning and, as a control, SPoT from an unrelated
     source, one job per method
  4. score every target run by rank classification (its prompt picks the likeliest class label)
     on the first 500 validation examples; print the mean and 95% interval over seeds per
     target and method, each method's paired verdict against Prompt Tuning on every target and on
     the targets' mean (a table's verdicts are one family: simultaneous 95% intervals), the
     headline claims with their tests (superiority; non-inferiority for SMoP and equivalence for
     the control, at a 3-point margin), the sources retrieval chose; write results.json,
     results.md and results.png

Every run is an ordinary trainer run in <output_dir>/runs/<method>-<digest>/<task>.seed_<s> whose
run.json holds its score. Rerunning with the same flags reuses the finished runs (the same
tables, seconds); --fresh trains everything again.

  python -m spot_jax.demo                          # seeds 0-19, about 5 minutes on 2 CPU cores
  python -m spot_jax.demo --seed_offset=20         # another seed set: seeds 20-39
  python -m spot_jax.demo --claims                 # the seeds the power analysis asks for
  python -m spot_jax.demo --seeds=0,1,2 --quick    # fewer steps, the same compiles
  python -m spot_jax.demo --methods=pt,spot --targets=sentiment_travel
  python -m spot_jax.demo --methods=all            # the default methods and the successors
  python -m spot_jax.demo --train_examples=all --target_steps=40   # every training example
  python -m spot_jax.demo --methods=pt,residual --learning_rate=1   # another peak rate
  python -m spot_jax.demo --backbone=decoder       # the same claims on the toy decoder
  python -m spot_jax.demo --methods=pt,pt_int8     # PT on an int8 backbone (qwix) against f32

The successors (prefix tuning, P-tuning v2, DePT, Residual SMoP, ATTEMPT, MPT, ULPT; see
spot_jax/demo/successor_methods.py) run only when named: each adds one job (MPT two).
"""
from __future__ import annotations

import dataclasses
import logging
import shutil
import sys
import time
from typing import Optional, Sequence

from spot_jax import cli
from spot_jax.cli import flags
from spot_jax import runtime
from spot_jax import stats
from spot_jax import experiment
from spot_jax import validate
from spot_jax import power
from spot_jax.demo import claims as claims_lib
from spot_jax.demo import methods as methods_lib
from spot_jax.demo import results as results_lib
from spot_jax.demo import source_library
from spot_jax.demo import successor_methods
from spot_jax.errors import ConfigError

DEFAULT_SEEDS = methods_lib.DEFAULT_SEEDS
QUICK = dict(source_steps=40, target_steps=10)
FULL = dict(source_steps=400, target_steps=200, batch_size=16, train_examples=None)


def _choices(value: str, valid: Sequence[str], what: str, flag: str) -> list[str]:
  chosen = [v.strip() for v in value.split(",")]
  if chosen == [""]:
    raise ConfigError(f"{flag} is empty; valid {what}s: {', '.join(valid)}")
  for i, v in enumerate(chosen):
    if v not in valid:
      close = validate.close_names(v, valid, n=1)
      hint = f"; did you mean {close[0]!r}?" if close else ""
      raise ConfigError(f"unknown {what} {v!r} in {flag} (entry {i}{hint}); valid: "
                        f"{', '.join(valid)}")
  return list(dict.fromkeys(chosen))


def _seed_text(seeds: Sequence[int]) -> str:
  """'0-102' for a run of consecutive seeds, else the list."""
  if len(seeds) > 2 and list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
    return f"{seeds[0]}-{seeds[-1]}"
  return ", ".join(map(str, seeds))


def _design(args, methods: Sequence[str]) -> claims_lib.Design:
  """The power analysis' design: --margin, --power and the targets'-mean family of `methods`."""
  margin = validate.positive(args.margin, "--margin", unit="points", example=claims_lib.MARGIN)
  target = validate.fraction(args.power, "--power", example=power.POWER)
  made = tuple(pair for pair in claims_lib.HEADLINE if set(pair) <= set(methods))
  return claims_lib.Design(margin, target, max(len(results_lib.pairs(methods)), 1), made)


def _seeds(args, design: claims_lib.Design) -> list[int]:
  """--seeds (a comma list), else --num_seeds seeds from --seed_offset; checked before any write."""
  if args.seeds is not None:
    if args.seed_offset is not None:
      raise ConfigError("give --seeds or --seed_offset, not both")
    if not args.seeds.strip():
      return stats.check_seeds([], "--seeds")
    values = []
    for i, text in enumerate(v.strip() for v in args.seeds.split(",")):
      try:
        values.append(int(text))
      except ValueError:
        raise ConfigError(f"--seeds: entry {i} ({text!r}) must be a non-negative integer") from None
    return stats.check_seeds(values, "--seeds")
  offset = 0 if args.seed_offset is None else args.seed_offset
  validate.positive_int(offset, "--seed_offset", minimum=0)
  count = args.num_seeds
  if count is None:
    count = design.seeds() if args.claims else DEFAULT_SEEDS
  validate.positive_int(count, "--num_seeds")
  return list(range(offset, offset + count))


def _parser() -> cli.ArgumentParser:
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  p = cli.ArgumentParser(prog="spot_jax.demo", description=__doc__.splitlines()[0])
  flags.add_output_dir(p, "where runs and results go (default ./spot_demo)", default="spot_demo")
  default_methods, recipe = methods_lib.METHODS, methods_lib.Settings()
  p.add_argument("--methods", default=",".join(default_methods),
                 help=f"comma list of "
                      f"{', '.join(default_methods + methods_lib.SUCCESSORS)}, pt_int8, or "
                      f"'all' (default {','.join(default_methods)}; pt always runs: the baseline "
                      f"and the target's task embedding; spot_unrelated: SPoT from an unrelated "
                      f"source, a control; the successors and pt_int8, Prompt Tuning on the "
                      f"int8-quantized backbone, run only when named)")
  p.add_argument("--targets", default=",".join(methods_lib.DEFAULT_TARGETS),
                 help=f"comma list of {', '.join(suite.TARGETS + suite.HARD_TARGETS)} (default "
                      f"{','.join(methods_lib.DEFAULT_TARGETS)}; the last two: skills the toy "
                      f"backbone only half-learned)")
  p.add_argument("--backbone", default="t5",
                 help=f"the frozen embedded model: {', '.join(methods_lib.BACKBONES)} (default t5; "
                      f"decoder: the Llama-style toy decoder, the default methods only)")
  p.add_argument("--seeds", default=None, help="comma list of distinct non-negative seeds (default "
                                               "--num_seeds seeds from --seed_offset)")
  p.add_argument("--seed_offset", type=int, default=None, help="the first seed (default 0)")
  p.add_argument("--num_seeds", type=int, default=None,
                 help=f"how many seeds from --seed_offset (default {DEFAULT_SEEDS}; with --claims "
                      f"the power analysis' count)")
  p.add_argument("--claims", action="store_true",
                 help="as many seeds as the power analysis asks for (every headline claim on the "
                      "targets' mean at --power for a --margin effect; fewer given by --seeds or "
                      "--num_seeds run with a warning naming the power reached)")
  p.add_argument("--margin", type=float, default=claims_lib.MARGIN,
                 help=f"points: the non-inferiority and equivalence margin, and the effect the "
                      f"power analysis plans for (default {claims_lib.MARGIN:g})")
  p.add_argument("--power", type=float, default=power.POWER,
                 help=f"the power --claims plans for, in (0, 1) (default {power.POWER:g})")
  speed = p.add_mutually_exclusive_group()
  speed.add_argument("--quick", action="store_true", help=f"fewer steps: {QUICK}")
  speed.add_argument("--full", action="store_true", help=f"more steps: {FULL}")
  p.add_argument("--train_examples", default=None,
                 help=f"a target's training examples, the first of its train split, or 'all' "
                      f"(default {recipe.train_examples}: the low-resource regime)")
  p.add_argument("--source_steps", type=int, default=None, help="override the source steps")
  p.add_argument("--target_steps", type=int, default=None, help="override the target steps")
  p.add_argument("--learning_rate", type=float, default=None,
                 help=f"Adafactor's peak rate; the decay ends at a tenth of it (default "
                      f"{recipe.learning_rate:g}, down to {recipe.final_learning_rate:g})")
  p.add_argument("--prompt_length", type=int, default=None,
                 help=f"prompt tokens of Prompt Tuning, SPoT, Residual PT and the successors that "
                      f"take the recipe's length (default {recipe.prompt_length}; SMoP stays "
                      f"4 x 5)")
  p.add_argument("--input_length", type=int, default=None,
                 help=f"target input tokens (default {recipe.input_length}; the longest target "
                      f"input is {methods_lib.LONGEST_TARGET_INPUT}: shorter truncates)")
  p.add_argument("--rank_examples", type=int, default=None,
                 help=f"validation examples rank classification scores per class-label target "
                      f"(default {recipe.rank_examples}: the first ones)")
  p.add_argument("--fresh", action="store_true",
                 help="retrain runs already finished in --output_dir")
  p.add_argument("--compilation_cache", default=None,
                 help="JAX persistent compilation cache directory (default <output_dir>/jax_cache; "
                      "'none' disables)")
  return p


def _settings(args) -> methods_lib.Settings:
  changes = dict(QUICK if args.quick else FULL if args.full else {})
  changes["backbone"] = validate.one_of(args.backbone, "--backbone", list(methods_lib.BACKBONES))
  if args.train_examples is not None:
    changes["train_examples"] = _train_examples(args.train_examples)
  if args.learning_rate is not None:
    rate = validate.positive(args.learning_rate, "--learning_rate",
                             example=methods_lib.Settings.learning_rate)
    changes.update(learning_rate=rate, final_learning_rate=rate / 10)
  return methods_lib.settings_from_flags(
      args, ("source_steps", "target_steps", "prompt_length", "input_length", "rank_examples"),
      **changes)


def _train_examples(text: str) -> Optional[int]:
  """--train_examples: 'all' (None) or a count the suite's train splits hold."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  if text.strip() == "all":
    return None
  most = suite.SPLIT_SIZES["train"]
  try:
    value = int(text)
  except ValueError:
    value = 0
  if not 0 < value <= most:
    raise ConfigError(f"--train_examples={text} must be 'all' or an integer from 1 to {most}")
  return value


def _recipe(method: str, settings: methods_lib.Settings, vocab_rows: int, entries: Sequence,
            seeds: Sequence[int], job) -> experiment.Recipe:
  """A method's job recipe (a successor's; MPT's after its distillation job)."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  if method not in methods_lib.SUCCESSORS:
    return methods_lib.recipe(method, settings, vocab_rows)
  sources = successor_methods.source_prompts(entries, suite.SOURCES) if entries else None
  mpt_source = None
  if method == "mpt":
    distilled = job(successor_methods.distill_recipe(settings, vocab_rows, sources),
                    successor_methods.distill_requests(max(seeds) + 1))
    mpt_source = distilled.outcomes[0].run_dir
  return successor_methods.recipe(method, settings, vocab_rows, sources=sources,
                                  mpt_source=mpt_source)


def main(argv: Sequence[str]) -> Optional[int]:
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  args = _parser().parse_args(argv)
  valid = methods_lib.METHODS + methods_lib.SUCCESSORS + tuple(methods_lib.QUANTIZED)
  every = methods_lib.METHODS + methods_lib.SUCCESSORS  # "all": pt_int8 only when named
  chosen = list(every) if args.methods.strip() == "all" else _choices(
      args.methods, valid + ("all",), "method", "--methods")
  if "all" in chosen:
    raise ConfigError("--methods=all stands alone; give 'all' or a comma list of methods")
  methods = ["pt"] + [m for m in chosen if m != "pt"]
  settings = _settings(args)
  if settings.backbone != "t5" and set(methods) - {*methods_lib.METHODS, *methods_lib.QUANTIZED}:
    raise ConfigError(f"--backbone={settings.backbone} runs the default methods "
                      f"({', '.join(methods_lib.METHODS)}); the successors run on --backbone=t5")
  targets = _choices(args.targets, suite.TARGETS + suite.HARD_TARGETS, "target task", "--targets")
  design = _design(args, methods)
  seeds = _seeds(args, design)
  shortfall = design.shortfall(len(seeds)) if args.claims else None
  out, runs_dir = methods_lib.output_folders(args.output_dir, settings.backbone)
  if shortfall:
    print(f"spot_jax.demo: {shortfall}", file=sys.stderr, flush=True)
  if args.compilation_cache != "none":
    runtime.enable_compilation_cache(args.compilation_cache or str(out / "jax_cache"),
                                     what="--compilation_cache")
  # seqio's advice about uncached function datasets and long sequence lengths does not apply to
  # these small in-memory tasks; keep the progress display readable.
  logging.getLogger("absl").setLevel(logging.ERROR)
  started = time.time()
  vocab_rows = methods_lib.sampled_vocab_rows()
  needs_library = bool({"spot", "spot_unrelated", *successor_methods.NEEDS_LIBRARY} & set(methods))
  jobs = len(methods) + needs_library + ("mpt" in methods)
  print(f"spot_jax.demo: {len(targets)} targets x {len(methods)} methods x {len(seeds)} seeds "
        f"(seeds {_seed_text(seeds)})" + (f" + {len(suite.SOURCES)} source prompts"
                                                   if needs_library else "")
        + f" in {jobs} jobs on the embedded {methods_lib.BACKBONES[settings.backbone]}, "
        f"{settings.source_steps} source "
        f"/ {settings.target_steps} target steps; runs in {runs_dir}", flush=True)
  done = [0]
  seconds: dict[str, Optional[float]] = {}

  def job(recipe: experiment.Recipe,
          requests: Sequence[experiment.RunRequest]) -> experiment.JobResult:
    done[0] += 1
    label = f"[{done[0]}/{jobs}] {methods_lib.JOB_NAMES[recipe.name]}: {len(requests)} runs"
    print(f"{label} training ...", end="", flush=True)
    result = methods_lib.run_job(recipe, requests, settings, runs_dir, fresh=args.fresh)
    spent = [t for t in (result.seconds, result.rank_seconds) if t is not None]
    seconds[recipe.name] = round(sum(spent), 1) if spent else None
    accs = [a for a in map(methods_lib.accuracy, result.outcomes) if a is not None]
    took = "finished earlier, reused" if not spent else f"{sum(spent):.0f}s"
    scores = f", accuracy {min(accs):.1f}-{max(accs):.1f}%" if accs else ""
    print(f"\r{label}{scores}  ({took})   [{time.time() - started:.0f}s elapsed]", flush=True)
    return result

  sources, choices, entries, left_out = [], {}, [], []
  if needs_library:
    # One seed no target run uses: the 8 sources share one initial prompt (their embeddings
    # differ by what they learned), and no target seed shares it (a shared start would make that
    # seed's task embedding look similar to every source).
    source_requests = [methods_lib.request(t, max(seeds) + 1) for t in suite.SOURCES]
    source_recipe = methods_lib.recipe(methods_lib.SOURCE, settings, vocab_rows, source=True)
    sources = job(source_recipe, source_requests).outcomes
    library_dir = out / "libraries" / methods_lib.job_dir(runs_dir, settings, source_recipe,
                                                          source_requests).name
    if args.fresh and library_dir.exists():
      shutil.rmtree(library_dir)
    entries = source_library.build_library(library_dir, sources)
    left_out = source_library.screen(sources, {t: suite.TASKS[t].chance for t in suite.SOURCES})
    for source in left_out:
      print(source.line(), flush=True)
    if left_out and len(left_out) == len(sources):
      print(source_library.EVERY_SOURCE_LEFT_OUT, flush=True)
  every_run = [methods_lib.request(t, s, train_examples=settings.train_examples)
               for t in targets for s in seeds]
  outcomes = list(job(methods_lib.recipe("pt", settings, vocab_rows), every_run).outcomes)
  if needs_library:
    choices = source_library.choose(entries, outcomes, suite.RELATED, left_out)
  for method in methods[1:]:
    requests = every_run
    if method == "spot":
      requests = source_library.spot_requests(choices, entries, targets, seeds,
                                              settings.train_examples)
    elif method == "spot_unrelated":
      requests = source_library.unrelated_requests(entries, suite.UNRELATED, targets, seeds,
                                                   settings.train_examples)
    outcomes += job(_recipe(method, settings, vocab_rows, entries, seeds, job), requests).outcomes

  chance = {t: round(suite.TASKS[t].chance, 1) for t in targets}
  summary = results_lib.summarize(outcomes, targets, methods, seeds, chance, sources,
                                  {k: c.to_json() for k, c in choices.items()}, seconds,
                                  settings.prompt_length, [x.to_json() for x in left_out],
                                  claims_lib.claim_tests(design.margin))
  paths = results_lib.write(out, summary, dataclasses.asdict(settings))
  _print_tables(summary, settings, design if args.claims else None)
  print(f"\ndemo took {time.time() - started:.0f}s; wrote {', '.join(str(p) for p in paths)}")
  return 0


def _print_tables(summary: results_lib.Summary, settings: methods_lib.Settings,
                  design: Optional[claims_lib.Design]) -> None:
  """The accuracies, verdicts, headline claims, power analysis (given a design), sources and job
  times, as plain tables."""
  print()
  print(f"validation accuracy % (class labels: rank classification of the first "
        f"{settings.rank_examples} examples), mean ± 95% interval over {len(summary.seeds)} seeds:")
  print(results_lib.plain(results_lib.accuracy_rows(summary)))
  if summary.pairs():  # Prompt Tuning alone: nothing to compare
    print("\n" + results_lib.verdict_heading(summary) + ":")
    print(results_lib.plain(results_lib.verdict_rows(summary)))
  headline = results_lib.headline_rows(summary)
  if len(headline) > 1:
    print(f"\n{results_lib.HEADLINE_HEADING}:")
    print(results_lib.plain(headline))
  if design is not None:
    print(f"\npower analysis (the pilot's SDs; {design.comparisons} targets'-mean comparisons at "
          f"95% together; {100 * design.target:g}% power for a {design.margin:g}-point effect or "
          f"margin):")
    print(results_lib.plain(claims_lib.power_rows(design, len(summary.seeds),
                                                  methods_lib.METHOD_NAMES)))
  if summary.choices:
    print("\nSPoT's source per seed, chosen by retrieval (* = in the suite's RELATED map):")
    print(results_lib.plain(results_lib.source_rows(summary)))
  if results_lib.time_rows(summary):
    print("\njob wall times (this process):")
    print(results_lib.plain(results_lib.time_rows(summary)))


if __name__ == "__main__":
  runtime.quick_compiles()  # before the first compile: each job compiles a step and a decoder
  sys.exit(cli.run(main, sys.argv[1:], "spot_jax.demo"))
