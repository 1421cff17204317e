"""Power analysis: how many seeds a table needs to resolve the effects it is about.

A pilot gives the standard deviation of one seed's paired difference (method - baseline, in
points; `difference_sd` builds it from variance components). With the smallest effect worth
reporting, the table's family (its number of comparisons, at 95% together) and the target power,
`plan` finds the fewest seeds whose verdict (`spot_jax.verdicts`, read off the Bonferroni
interval) comes out as the claim predicts with at least that probability, by the exact small-n
distributions: the noncentral t for superiority and non-inferiority, and for equivalence the
normal mean integrated over the chi distribution of the seeds' SD.

  >>> p = plan(sd=4.0, difference=3.0, comparisons=5)     # superiority, 90% power
  >>> p.seeds, round(p.achieved, 3)
  >>> shortfall_warning(p, 8)                             # one line, or None when enough
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from scipy import integrate
from scipy import stats as scipy_stats

from spot_jax import stats
from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.verdicts import EQUIVALENCE, NONINFERIORITY, SUPERIORITY, Test

POWER = 0.9
MAX_SEEDS = 2000


def difference_sd(training: float, evaluation: float = 0.0, rounding: float = 0.0,
                  evaluation_scale: float = 1.0, correlation: float = 0.0) -> float:
  """The SD of one seed's paired difference of two methods from one run's variance components.

  Args:
    training: SD of a run's score over training seeds (initialisation, data order, dropout).
    evaluation: SD from the evaluation sample, as the pilot measured it.
    rounding: SD between runs of the same seed under another K or XLA.
    evaluation_scale: the pilot's evaluation examples over the planned ones (its variance
      scales with 1 / examples).
    correlation: correlation of the two methods' runs of one seed (shared data order); 0 when
      they share nothing.

  Returns:
    sqrt(2 (1 - correlation) (training^2 + evaluation^2 scale + rounding^2)).
  """
  for name, value in (("training", training), ("evaluation", evaluation),
                      ("rounding", rounding)):
    validate.non_negative(value, f"{name} SD", unit="points")
  validate.positive(evaluation_scale, "evaluation_scale",
                    note="pilot examples / planned examples", example=0.2)
  if not -1 < correlation < 1:
    raise ConfigError(f"correlation={correlation!r} must be in (-1, 1), e.g. 0")
  run = training ** 2 + evaluation ** 2 * evaluation_scale + rounding ** 2
  return math.sqrt(2 * (1 - correlation) * run)


def _check(sd: float, difference: float, test: Test, level: float, comparisons: int) -> None:
  validate.positive(sd, "sd", unit="points", note="the pilot's SD of one seed's paired difference",
                    example=4)
  validate.fraction(level, "level", example=0.95)
  validate.positive_int(comparisons, "comparisons", note="the table's family size", example=5)
  if test.kind == SUPERIORITY:
    validate.positive(difference, "difference", unit="points",
                      note="superiority: the smallest effect worth reporting", example=3)
  if test.kind == EQUIVALENCE and not abs(difference) < test.margin:
    raise ConfigError(f"difference={difference!r} lies outside the equivalence margin "
                      f"{test.margin:g}; equivalence can only hold for |difference| < margin")
  if test.kind == NONINFERIORITY and not difference > -test.margin:
    raise ConfigError(f"difference={difference!r} is at or below -margin ({-test.margin:g}); "
                      f"non-inferiority can only hold above it")


def power(seeds: int, sd: float, difference: float, test: Test = Test(),
          level: float = stats.LEVEL, comparisons: int = 1) -> float:
  """The probability that a table of `seeds` seeds gives `test`'s hoped-for verdict (better, or
  holds) on one comparison whose true mean paired difference is `difference`.

  Args:
    seeds: seeds in the table (>= 2).
    sd: SD of one seed's paired difference (points).
    difference: the true mean difference: for superiority the smallest effect worth reporting,
      for non-inferiority and equivalence the one assumed (usually 0).
    test: the comparison's test.
    level: the family's level (0.95: simultaneous over the table).
    comparisons: the family's size; each interval is at 1 - (1 - level) / comparisons.
  """
  _check(sd, difference, test, level, comparisons)
  validate.positive_int(seeds, "seeds", minimum=2, note="one seed carries no interval")
  df, root = seeds - 1, math.sqrt(seeds)
  crit = scipy_stats.t.ppf(1 - (1 - stats.family_level(level, comparisons)) / 2, df)
  if test.kind == SUPERIORITY:  # better: mean - crit s / sqrt(n) > 0
    return float(scipy_stats.nct.sf(crit, df, difference * root / sd))
  if test.kind == NONINFERIORITY:  # holds: mean + margin - crit s / sqrt(n) > 0
    return float(scipy_stats.nct.sf(crit, df, (difference + test.margin) * root / sd))
  # Equivalence holds when -margin + crit s/sqrt(n) < mean < margin - crit s/sqrt(n): given
  # the seeds' SD s the mean is normal; s^2 df / sd^2 is chi-square with df degrees of freedom.
  se, margin = sd / root, test.margin

  def given(v: float) -> float:
    reach = crit * sd * math.sqrt(v / df) / root
    return (scipy_stats.norm.cdf((margin - reach - difference) / se)
            - scipy_stats.norm.cdf((-margin + reach - difference) / se)) * \
        scipy_stats.chi2.pdf(v, df)

  # Beyond `top` the interval is wider than both margins; outside the chi-square's central
  # 1 - 2e-12 the density adds nothing a power can show, and quad must not miss its narrow peak.
  top = df * (margin * root / (crit * sd)) ** 2
  low, high = scipy_stats.chi2.ppf([1e-12, 1 - 1e-12], df)
  if top <= low:
    return 0.0
  value, _ = integrate.quad(given, low, min(top, high), limit=200)
  return float(min(max(value, 0.0), 1.0))


@dataclasses.dataclass(frozen=True)
class Plan:
  """The seeds a comparison needs.

  Attributes:
    seeds: the fewest seeds reaching `target` power.
    achieved: the power at `seeds`.
    target: the power asked for.
    sd, difference, test, level, comparisons: as given to `plan`.
  """
  seeds: int
  achieved: float
  target: float
  sd: float
  difference: float
  test: Test
  level: float
  comparisons: int

  def power_at(self, seeds: int) -> float:
    return power(seeds, self.sd, self.difference, self.test, self.level, self.comparisons)

  def describe(self) -> str:
    """'superiority at +3 points, SD 4, 5 comparisons at 95% together'."""
    what = (f"superiority at {self.difference:+g} points" if self.test.kind == SUPERIORITY
            else f"{self.test.label} at a true difference of {self.difference:+g}")
    family = (f"{self.comparisons} comparisons at {100 * self.level:g}% together"
              if self.comparisons > 1 else f"one comparison at {100 * self.level:g}%")
    return f"{what}, SD {self.sd:.3g}, {family}"


def plan(sd: float, difference: float, test: Test = Test(), target: float = POWER,
         level: float = stats.LEVEL, comparisons: int = 1) -> Plan:
  """The fewest seeds (>= 2) whose power (`power`) reaches `target`.

  Raises:
    ConfigError: a setting is out of range, or no table of up to MAX_SEEDS seeds reaches it.
  """
  validate.fraction(target, "power", example=0.9)
  _check(sd, difference, test, level, comparisons)
  at = lambda n: power(n, sd, difference, test, level, comparisons)
  if at(MAX_SEEDS) < target:
    raise ConfigError(f"no table of up to {MAX_SEEDS} seeds reaches power {target:g} for this "
                      f"comparison (SD {sd:g}, difference {difference:+g}, {test.label}); give a "
                      f"larger effect or margin, or a design with less noise")
  low, high = 2, MAX_SEEDS  # power grows with the seeds: bisect for the first n reaching target
  while low < high:
    mid = (low + high) // 2
    low, high = (mid + 1, high) if at(mid) < target else (low, mid)
  return Plan(low, at(low), target, float(sd), float(difference), test, level, comparisons)


def shortfall_warning(p: Plan, seeds: int) -> Optional[str]:
  """One warning line when a table of `seeds` seeds is below the plan's, naming its power; None
  when it has enough."""
  if seeds >= p.seeds:
    return None
  achieved = p.power_at(seeds) if seeds >= 2 else 0.0
  return (f"warning: {seeds} seeds where the power analysis asks for {p.seeds} "
          f"({p.describe()}): the power is {100 * achieved:.0f}%, not {100 * p.target:g}%")
