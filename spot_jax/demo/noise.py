r"""`python -m spot_jax.demo.noise`: where the demo's spread over seeds comes from.

A pilot of Prompt Tuning with the demo's recipe (`spot_jax.demo.methods.Settings`) on the demo's
targets. Every (target, seed) trains twice through the experiment runner: first all of them as
one job (K = targets x seeds runs in one jitted step, as the demo trains a method), then as jobs
of --other_k runs (default: one job per seed, K = targets). The two runs of a seed share their
initialisation and data order, so their difference is what floating-point rounding alone does.
Per target, and for each seed's mean over the targets, it splits the SD of one run's validation
accuracy into training seed, evaluation sample (binomial) and rounding
(`spot_jax.demo.variance`), prints the table, writes noise.json and noise.md in --output_dir,
and from the targets'-mean row plans the seeds a +3-point effect needs (`spot_jax.power.plan`).

  python -m spot_jax.demo.noise                            # 20 seeds, the 3 targets: 120 runs
  python -m spot_jax.demo.noise --num_seeds=30 --other_k=1 # 30 seeds, each run alone the 2nd time
  python -m spot_jax.demo.noise --targets=sum --num_seeds=2 --target_steps=2   # a smoke test

Runs are ordinary run directories under <output_dir>/runs/, reused by a rerun with the same flags.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from typing import Optional, Sequence

from spot_jax import cli
from spot_jax import power
from spot_jax import runtime
from spot_jax import validate
from spot_jax.cli import flags
from spot_jax.demo import methods as methods_lib
from spot_jax.demo import results as results_lib
from spot_jax.demo import variance
from spot_jax.errors import ConfigError

DEFAULT_SEEDS = 20
EFFECT = 3.0  # points: the smallest effect on the targets' mean the plan resolves
COMPARISONS = 5  # the demo's targets'-mean family: 4 methods against PT, SPoT against its control
DEMO_SEEDS = methods_lib.DEFAULT_SEEDS
COLUMNS = ("target", "chance", "mean", "training seed SD", "evaluation SD (binomial)",
           "rounding SD", "total SD", "seeds unchanged")


def _parser() -> cli.ArgumentParser:
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  p = cli.ArgumentParser(prog="spot_jax.demo.noise", description=__doc__.splitlines()[0])
  flags.add_output_dir(p, "where runs and noise.{json,md} go (default ./spot_noise)",
                       default="spot_noise")
  p.add_argument("--targets", default=",".join(methods_lib.DEFAULT_TARGETS),
                 help=f"comma list of {', '.join(suite.TARGETS + suite.HARD_TARGETS)} (default "
                      f"the demo's: {','.join(methods_lib.DEFAULT_TARGETS)})")
  p.add_argument("--num_seeds", type=int, default=DEFAULT_SEEDS,
                 help=f"seeds, at least 2 (default {DEFAULT_SEEDS})")
  p.add_argument("--seed_offset", type=int, default=0, help="the first seed (default 0)")
  p.add_argument("--other_k", type=int, default=None,
                 help="runs per job of the second grouping (default: the number of targets, one "
                      "job per seed; 1: every run alone)")
  p.add_argument("--target_steps", type=int, default=None,
                 help=f"training steps (default the demo's {methods_lib.Settings.target_steps})")
  p.add_argument("--rank_examples", type=int, default=None,
                 help=f"validation examples rank classification scores per class-label target "
                      f"(default the demo's {methods_lib.Settings.rank_examples})")
  p.add_argument("--fresh", action="store_true", help="retrain runs already finished")
  return p


def _targets(text: str) -> list[str]:
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  chosen = [t.strip() for t in text.split(",")]
  for t in chosen:
    validate.one_of(t, "--targets", suite.TARGETS + suite.HARD_TARGETS)
  if len(set(chosen)) != len(chosen):
    raise ConfigError(f"--targets={text!r} repeats a target; give each once")
  return chosen


def groupings(targets: Sequence[str], seeds: Sequence[int], other_k: int,
              train_examples: Optional[int] = None):
  """(the one job of every run, targets outer as the demo's; the jobs of `other_k` runs, seeds
  outer so that other_k = len(targets) is one job per seed); runs train on their target's first
  `train_examples` examples (None: all)."""
  first = [methods_lib.request(t, s, train_examples=train_examples)
           for t in targets for s in seeds]
  by_seed = [methods_lib.request(t, s, train_examples=train_examples)
             for s in seeds for t in targets]
  return first, [by_seed[i:i + other_k] for i in range(0, len(by_seed), other_k)]


def _scores(outcomes, targets: Sequence[str], seeds: Sequence[int]) -> dict[str, list[float]]:
  by_key = {(o.label, o.seed): methods_lib.accuracy(o) for o in outcomes}
  return {t: [by_key[(t, s)] for s in seeds] for t in targets}


def rows(chance: dict, components: dict) -> list[list[str]]:
  """Header + one row per target (and the targets' mean): each source's SD and the total."""
  out = [list(COLUMNS)]
  for name, c in components.items():
    out.append([name, f"{chance[name]:.1f}" if name in chance else "-", f"{c.mean:.1f}",
                f"{c.training:.2f}", f"{c.evaluation:.2f}", f"{c.rounding:.2f}", f"{c.total:.2f}",
                f"{c.unchanged}/{c.seeds}"])
  return out


def _plan(mean: variance.Components) -> tuple[power.Plan, float, str]:
  sd = power.difference_sd(mean.training, mean.evaluation, mean.rounding)
  p = power.plan(sd, EFFECT, comparisons=COMPARISONS)
  at_demo = p.power_at(DEMO_SEEDS)
  line = (f"seeds needed: {p.seeds} for a {EFFECT:+g}-point difference on the targets' mean with "
          f"{100 * p.target:g}% power ({p.describe()}; one seed's paired difference of two "
          f"methods from these components); the demo's {DEMO_SEEDS} seeds give "
          f"{100 * at_demo:.0f}%")
  return p, at_demo, line


def main(argv: Sequence[str]) -> Optional[int]:
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  args = _parser().parse_args(argv)
  targets = _targets(args.targets)
  validate.positive_int(args.num_seeds, "--num_seeds", minimum=2,
                        note="a spread over seeds needs at least 2")
  validate.positive_int(args.seed_offset, "--seed_offset", minimum=0)
  seeds = list(range(args.seed_offset, args.seed_offset + args.num_seeds))
  runs = len(targets) * len(seeds)
  other_k = len(targets) if args.other_k is None else args.other_k
  validate.positive_int(other_k, "--other_k")
  if other_k >= runs:
    raise ConfigError(f"--other_k={other_k} must be smaller than the first grouping's K "
                      f"({runs} = targets x seeds), so the second grouping differs")
  settings = methods_lib.settings_from_flags(args, ("target_steps", "rank_examples"))
  out, runs_dir = methods_lib.output_folders(args.output_dir)
  runtime.enable_compilation_cache(str(out / "jax_cache"), what="--output_dir")
  logging.getLogger("absl").setLevel(logging.ERROR)
  started = time.time()
  recipe = methods_lib.recipe("pt", settings, methods_lib.sampled_vocab_rows())
  first, second = groupings(targets, seeds, other_k, settings.train_examples)
  print(f"spot_jax.demo.noise: Prompt Tuning, {len(targets)} targets x {len(seeds)} seeds "
        f"(seeds {seeds[0]}-{seeds[-1]}), {settings.target_steps} steps, each run twice: one job "
        f"of K={runs}, then {len(second)} jobs of K={other_k}; runs in {runs_dir}", flush=True)
  seconds = {}
  outcomes = {}
  for name, jobs in (("first", [first]), ("second", second)):
    t0, outcomes[name] = time.time(), []
    for i, job in enumerate(jobs):
      print(f"\r{name} grouping: job {i + 1}/{len(jobs)} ...", end="", flush=True)
      outcomes[name] += methods_lib.run_job(recipe, job, settings, runs_dir,
                                            fresh=args.fresh).outcomes
    seconds[name] = round(time.time() - t0, 1)
    print(f"\r{name} grouping: {len(jobs)} job(s), {seconds[name]:.0f}s      ", flush=True)
  first_scores = _scores(outcomes["first"], targets, seeds)
  second_scores = _scores(outcomes["second"], targets, seeds)
  examples = {t: min(settings.rank_examples if suite.TASKS[t].classes else settings.eval_examples,
                     len(suite.examples(t, "validation")[0])) for t in targets}
  components = {t: variance.decompose(first_scores[t], second_scores[t],
                                      variance.binomial_variance(first_scores[t]
                                                                 + second_scores[t], examples[t]))
                for t in targets}
  if len(targets) > 1:
    components[results_lib.MEAN_ROW] = variance.targets_mean(first_scores, second_scores,
                                                             examples)
  plan, at_demo, plan_line = _plan(components.get(results_lib.MEAN_ROW, components[targets[0]]))
  chance = {t: round(suite.TASKS[t].chance, 1) for t in targets}
  table = rows(chance, components)
  took = time.time() - started
  doc = {"recipe": dataclasses.asdict(settings), "targets": targets, "seeds": seeds,
         "k": {"first": runs, "second": other_k}, "examples": examples, "chance": chance,
         "evaluation": "binomial p(1-p)/n, n the scored validation examples",
         "components": {k: c.to_json() for k, c in components.items()},
         "scores": {t: {"first": first_scores[t], "second": second_scores[t]} for t in targets},
         "plan": {"effect": EFFECT, "comparisons": COMPARISONS, "power": plan.target,
                  "sd": round(plan.sd, 4), "seeds": plan.seeds,
                  f"power_at_{DEMO_SEEDS}_seeds": round(at_demo, 4)},
         "seconds": {**seconds, "total": round(took, 1)}}
  heading = (f"SD of one run's validation accuracy (points) by source: Prompt Tuning, seeds "
             f"{seeds[0]}-{seeds[-1]}, each trained in one job of K={runs} and in jobs of "
             f"K={other_k}; training: what a seed's two runs share; evaluation: binomial on "
             f"{min(examples.values())} examples; rounding: the spread of a seed's two runs beyond "
             f"it (spot_jax/demo/variance.py)")
  (out / "noise.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
  (out / "noise.md").write_text("\n".join(["# spot-jax demo noise", "", heading + ":", "",
                                           results_lib.markdown(table), plan_line + ".", ""]))
  print(f"\n{heading}:")
  print(results_lib.plain(table))
  print(f"\n{plan_line}")
  print(f"\nnoise took {took:.0f}s; wrote {out / 'noise.json'}, {out / 'noise.md'}")
  return 0


if __name__ == "__main__":
  runtime.quick_compiles()  # before the first compile, as the demo
  sys.exit(cli.run(main, sys.argv[1:], "spot_jax.demo.noise"))
