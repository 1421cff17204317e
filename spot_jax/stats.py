"""Intervals and verdicts over seeds: what every seeded table of spot-jax reports.

One seed is one sample. A result that is to survive another machine, XLA version or reduction
order is a mean with an interval over seeds, and a comparison of two methods is a verdict from
their paired per-seed differences (the same seeds, so the shared noise cancels):

  >>> interval([90.0, 87.5, 91.0])           # Student-t 95% interval of the mean
  Interval(mean=89.5, low=84.9..., high=94.0..., n=3)
  >>> paired_verdict(pt, spot)               # 'better', 'worse' or 'not resolved'

Bootstrap intervals (`bootstrap`) carry statistics with no closed form (correlations, retrieval's
share of the oracle's gain). Below the smallest sample that can carry an interval the functions
say so (`Interval.low` is NaN, `why` names the cause) instead of printing a degenerate one.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats

from spot_jax import validate
from spot_jax.errors import ConfigError

LEVEL = 0.95
BETTER, WORSE, UNRESOLVED = "better", "worse", "not resolved"
# The fewest samples a correlation's bootstrap interval is drawn from (3 points always give
# |r| near 1 and a resampled pair of 2 points an undefined one).
MIN_CORRELATION_POINTS = 5


@dataclasses.dataclass(frozen=True)
class Interval:
  """A mean (or statistic) with its interval; low/high are NaN when n cannot carry one."""
  mean: float
  low: float
  high: float
  n: int
  why: str = ""

  @property
  def resolved(self) -> bool:
    return not (math.isnan(self.low) or math.isnan(self.high))

  @property
  def half_width(self) -> float:
    return (self.high - self.low) / 2 if self.resolved else math.nan

  def format(self, digits: int = 1) -> str:
    """'89.5 ± 4.6' (symmetric), '0.61 [0.20, 0.88]' (asymmetric) or '89.5 (n=1)'."""
    if math.isnan(self.mean):
      return "n/a"
    if not self.resolved:
      return f"{self.mean:.{digits}f} (n={self.n})"
    if abs((self.high - self.mean) - (self.mean - self.low)) <= 10 ** -(digits + 1):
      return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"
    return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

  def to_json(self) -> dict:
    nan = lambda v: None if math.isnan(v) else float(v)
    return {"mean": nan(self.mean), "low": nan(self.low), "high": nan(self.high), "n": self.n,
            **({"why": self.why} if self.why else {})}


def interval(values: Sequence[float], level: float = LEVEL) -> Interval:
  """Student-t interval of the mean of `values` (seeds as independent samples).

  Args:
    values: one number per seed.
    level: confidence level.

  Returns:
    The mean and its interval; with fewer than 2 values (or NaNs) no interval.
  """
  validate.fraction(level, "level", example=0.95)
  x = np.asarray(values, np.float64).ravel()
  if x.size == 0:
    return Interval(math.nan, math.nan, math.nan, 0, "no values")
  if not np.all(np.isfinite(x)):
    return Interval(math.nan, math.nan, math.nan, int(x.size), "a value is not finite")
  mean = float(x.mean())
  if x.size < 2:
    return Interval(mean, math.nan, math.nan, 1, "one seed carries no interval")
  half = float(scipy_stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
  return Interval(mean, mean - half, mean + half, int(x.size))


def paired_difference(baseline: Sequence[float], other: Sequence[float],
                      level: float = LEVEL) -> Interval:
  """Interval of mean(other - baseline) over paired seeds (the same seed in both)."""
  a, b = np.asarray(baseline, np.float64).ravel(), np.asarray(other, np.float64).ravel()
  if a.shape != b.shape:
    raise ConfigError(f"paired comparison needs one value per seed on both sides; got {a.size} "
                      f"and {b.size}")
  return interval(b - a, level)


def family_level(level: float, comparisons: int) -> float:
  """The per-comparison level that keeps `comparisons` intervals simultaneous at `level`
  (Bonferroni): with probability at least `level` every one of them covers its true value, so
  a table of verdicts holds one wrong "better" or "worse" with probability at most 1 - level."""
  validate.fraction(level, "level", example=0.95)
  validate.positive_int(comparisons, "comparisons", note="a family needs one comparison or more")
  return 1 - (1 - level) / comparisons


def verdict(difference: Interval) -> str:
  """'better' when the interval of the difference lies above 0, 'worse' below, else unresolved."""
  if not difference.resolved:
    return UNRESOLVED
  if difference.low > 0:
    return BETTER
  if difference.high < 0:
    return WORSE
  return UNRESOLVED


def paired_verdict(baseline: Sequence[float], other: Sequence[float], level: float = LEVEL) -> str:
  """`verdict` of `paired_difference(baseline, other)`."""
  return verdict(paired_difference(baseline, other, level))


def bootstrap(samples: np.ndarray, statistic: Callable[[np.ndarray], float],
              level: float = LEVEL, resamples: int = 2000, seed: int = 0,
              min_samples: int = 2) -> Interval:
  """Percentile bootstrap interval of `statistic` over the rows of `samples`.

  Args:
    samples: [N, ...] independent units (seeds, or (source, target) pairs); resampled whole.
    statistic: maps a [N, ...] array to a number; NaN results of degenerate resamples are dropped.
    level: confidence level.
    resamples: bootstrap resamples.
    seed: the resampling seed (the interval is a deterministic function of the data).
    min_samples: below this many rows there is no interval.

  Returns:
    statistic(samples) with its percentile interval.
  """
  validate.fraction(level, "level", example=0.95)
  samples = np.asarray(samples, np.float64)
  n = samples.shape[0] if samples.ndim else 0
  point = float(statistic(samples)) if n else math.nan
  if n < min_samples:
    return Interval(point, math.nan, math.nan, n,
                    f"{n} samples are too few for an interval (need {min_samples})")
  rng = np.random.default_rng(seed)
  draws = np.array([statistic(samples[rng.integers(0, n, n)]) for _ in range(resamples)], float)
  draws = draws[np.isfinite(draws)]
  if draws.size < resamples // 2:
    return Interval(point, math.nan, math.nan, n, "most resamples were degenerate")
  low, high = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
  return Interval(point, float(low), float(high), n)


def correlation(x: Sequence[float], y: Sequence[float], method: str = "pearson",
                level: float = LEVEL, resamples: int = 2000, seed: int = 0) -> Interval:
  """Pearson or Spearman correlation of paired points with a bootstrap interval over points.

  Fewer than MIN_CORRELATION_POINTS points give the coefficient without an interval (`why`
  says so): three points carry neither a p-value nor an interval worth printing.
  """
  funcs = {"pearson": lambda a, b: scipy_stats.pearsonr(a, b)[0],
           "spearman": lambda a, b: scipy_stats.spearmanr(a, b)[0]}
  validate.one_of(method, "correlation method", sorted(funcs))
  points = np.stack([np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()], 1)

  def stat(p: np.ndarray) -> float:
    if p.shape[0] < 2 or np.ptp(p[:, 0]) == 0 or np.ptp(p[:, 1]) == 0:
      return math.nan
    return float(funcs[method](p[:, 0], p[:, 1]))

  return bootstrap(points, stat, level, resamples, seed, min_samples=MIN_CORRELATION_POINTS)


def check_seeds(seeds: Optional[Sequence[int]], flag: str = "--seeds") -> list[int]:
  """A seed list for a seeded table: non-empty, distinct, non-negative integers."""
  seeds = validate.non_empty(seeds, flag, f"at least one seed, e.g. {flag}=0,1,2,3,4")
  out = []
  for i, s in enumerate(seeds):
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
      raise ConfigError(f"{flag}: entry {i} ({s!r}) must be a non-negative integer")
    if s in out:
      raise ConfigError(f"{flag}: entry {i} ({s}) repeats entry {out.index(s)}; seeds must be "
                        f"distinct")
    out.append(int(s))
  return out
