r"""`python -m spot_jax.demo.robustness`: does a method's accuracy move less than Prompt Tuning's
over a grid of learning rates? Residual Prompt Tuning's claim of robustness to the rate, tested.

Reads demo folders that ran the same targets, methods and seeds with the same recipe at different
peak rates (`python -m spot_jax.demo --learning_rate=R`). For each method and seed it takes the
targets'-mean accuracy at every rate; the seed's **spread** is the largest of those minus the
smallest. Each method is compared with Prompt Tuning by the paired difference of spreads (Prompt
Tuning's minus the method's; a seed's runs share their data order and initial prompt at every
rate), with its simultaneous 95% interval over the methods compared and a superiority verdict:
the claim "moves less than Prompt Tuning" holds when the interval lies above 0 and does not hold
when it lies below. The table also gives each method's targets'-mean accuracy at every rate.

  python -m spot_jax.demo --methods=pt,residual --learning_rate=0.1 --output_dir=lr0.1
  python -m spot_jax.demo --methods=pt,residual --output_dir=lr0.3     # the default rate
  python -m spot_jax.demo --methods=pt,residual --learning_rate=1 --output_dir=lr1
  python -m spot_jax.demo.robustness lr0.1 lr0.3 lr1

Nothing is written.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Sequence

import numpy as np

from spot_jax import cli
from spot_jax import stats
from spot_jax.demo import claims as claims_lib
from spot_jax.demo import replication
from spot_jax.demo import results as results_lib
from spot_jax.demo.methods import METHOD_NAMES
from spot_jax.errors import ConfigError

RATE_KEYS = ("learning_rate", "final_learning_rate")  # the recipe's fields a grid may change
CLAIM = "moves less than Prompt Tuning over the rates"


@dataclasses.dataclass(frozen=True)
class Grid:
  """The targets'-mean accuracy of every method, seed and rate of a learning-rate grid.

  Attributes:
    rates: the peak rates, ascending.
    methods: the methods every folder ran (Prompt Tuning first).
    seeds: the seeds every folder ran, in order.
    accuracy: method -> array [rate, seed] of targets'-mean accuracies (%).
  """
  rates: tuple[float, ...]
  methods: tuple[str, ...]
  seeds: tuple[int, ...]
  accuracy: dict[str, np.ndarray]

  def spread(self, method: str) -> np.ndarray:
    """Per seed, the method's largest minus smallest targets'-mean accuracy over the rates."""
    a = self.accuracy[method]
    return a.max(axis=0) - a.min(axis=0)

  @property
  def level(self) -> float:
    """Each comparison's level: simultaneous 95% over the methods compared with Prompt Tuning."""
    return stats.family_level(stats.LEVEL, max(len(self.methods) - 1, 1))

  def difference(self, method: str) -> stats.Interval:
    """Prompt Tuning's spread minus `method`'s, paired by seed."""
    return stats.interval(self.spread(results_lib.BASELINE) - self.spread(method), self.level)

  def verdict(self, method: str) -> str:
    """holds / does not hold / not resolved, for "`method` moves less than Prompt Tuning"."""
    return claims_lib.claim_verdict(stats.verdict(self.difference(method)), "better")


def _beyond_rate(recipe: dict) -> dict:
  """A demo recipe without the fields a learning-rate grid changes."""
  return {k: v for k, v in recipe.items() if k not in RATE_KEYS}


def grid(folders: Sequence[str]) -> Grid:
  """The grid of demo folders at distinct rates (one-line errors naming what does not match)."""
  if len(folders) < 2:
    raise ConfigError("give at least two demo folders run at different --learning_rate values, "
                      "e.g. spot_jax.demo.robustness lr0.1 lr0.3")
  loaded = [replication.load(f) for f in folders]
  first, recipe = loaded[0]
  if results_lib.BASELINE not in first.methods or len(first.methods) < 2:
    raise ConfigError(f"{folders[0]!r} ran {first.methods}; the grid needs Prompt Tuning and a "
                      f"method to compare with it, e.g. --methods=pt,residual")
  rates = []
  for folder, (s, other) in zip(folders, loaded):
    for what in ("targets", "methods", "seeds"):
      if getattr(s, what) != getattr(first, what):
        raise ConfigError(f"{folder!r} ran {what} {getattr(s, what)}, {folders[0]!r} ran "
                          f"{getattr(first, what)}; run every rate with the same demo flags")
    if _beyond_rate(other) != _beyond_rate(recipe):
      raise ConfigError(f"{folder!r} ran another recipe than {folders[0]!r} beyond the learning "
                        f"rate (steps, lengths or examples differ); change only --learning_rate")
    if "learning_rate" not in other:
      raise ConfigError(f"{folder!r}'s results.json names no learning rate; rerun the demo there")
    rate = float(other["learning_rate"])
    if rate in rates:
      raise ConfigError(f"{folder!r} and {folders[rates.index(rate)]!r} both ran learning rate "
                        f"{rate:g}; give each rate of the grid once")
    rates.append(rate)
  order = np.argsort(rates)
  accuracy = {m: np.array([np.mean([loaded[i][0].scores[(t, m)] for t in first.targets], axis=0)
                           for i in order]) for m in first.methods}
  return Grid(tuple(rates[i] for i in order), tuple(first.methods), tuple(first.seeds), accuracy)


def rows(g: Grid) -> list[list[str]]:
  """Header + one row per method: its targets'-mean accuracy at each rate, its mean spread, and
  (each method but Prompt Tuning) the paired difference of spreads with the claim's verdict."""
  header = (["method"] + [f"at {r:g}" for r in g.rates]
            + ["spread (mean)", "PT's spread - its", CLAIM])
  out = [header]
  for m in g.methods:
    cells = [stats.interval(a).format() for a in g.accuracy[m]]
    spread = f"{float(np.mean(g.spread(m))):.1f}"
    if m == results_lib.BASELINE:
      out.append([METHOD_NAMES[m]] + cells + [spread, "-", "-"])
    else:
      out.append([METHOD_NAMES[m]] + cells + [spread, claims_lib.signed(g.difference(m)),
                                              g.verdict(m)])
  return out


def _parser() -> cli.ArgumentParser:
  p = cli.ArgumentParser(prog="spot_jax.demo.robustness", description=__doc__.splitlines()[0])
  p.add_argument("folders", nargs="+",
                 help="demo output folders (their results.json), one per learning rate")
  return p


def main(argv: Sequence[str]) -> int:
  args = _parser().parse_args(argv)
  g = grid(args.folders)
  compared = len(g.methods) - 1
  print(f"{len(g.seeds)} seeds x {len(g.rates)} learning rates "
        f"({', '.join(f'{r:g}' for r in g.rates)}): targets'-mean accuracy %, mean ± 95% "
        f"interval over seeds; a seed's spread is its largest minus smallest over the rates; "
        f"differences of spreads are paired by seed"
        + (f", simultaneous 95% intervals over the {compared} comparisons:" if compared > 1
           else ", 95% interval:"))
  print(results_lib.plain(rows(g)))
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "spot_jax.demo.robustness", keep_heap=False))
