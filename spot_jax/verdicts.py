"""Verdicts that fit a claim: superiority, non-inferiority and equivalence over paired seeds.

A claim that a method *beats* a baseline gets a superiority verdict; a claim that it *matches*
one gets a non-inferiority verdict (not worse by more than a stated margin) or an equivalence
verdict (within the margin either way: two one-sided tests, TOST). Every verdict is read off one
interval, the Student-t interval of the mean paired difference (method - baseline, one value per
seed) at the comparison's level, the interval its table prints:

  test                       verdicts                  the interval [low, high] lies
  superiority                better / worse            above 0 / below 0
  non-inferiority, margin d  holds / does not hold     above -d / below -d
  equivalence, margin d      holds / does not hold     inside (-d, d) / wholly outside [-d, d]
  (otherwise: not resolved)

An interval that covers the true difference gives no false verdict of any kind, so a table whose
intervals are simultaneous at 95% (Bonferroni: each at 1 - 0.05 / comparisons,
`stats.family_level`) holds a false verdict with probability at most 5%, whatever its mix of
tests. Equivalence read this way is TOST with each one-sided test at half the interval's error.

  >>> table([pt, pt], [spot, smop], [Test(), Test(NONINFERIORITY, 3.0)])
  ['better', 'holds']
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats

from spot_jax import stats
from spot_jax import validate
from spot_jax.errors import ConfigError

SUPERIORITY, NONINFERIORITY, EQUIVALENCE = "superiority", "non-inferiority", "equivalence"
KINDS = (SUPERIORITY, NONINFERIORITY, EQUIVALENCE)
HOLDS, DOES_NOT_HOLD = "holds", "does not hold"
# A verdict as a number: +1 what the test looks for (better, holds), -1 its opposite, 0 neither.
_NAMES = {SUPERIORITY: {1: stats.BETTER, -1: stats.WORSE, 0: stats.UNRESOLVED},
          NONINFERIORITY: {1: HOLDS, -1: DOES_NOT_HOLD, 0: stats.UNRESOLVED},
          EQUIVALENCE: {1: HOLDS, -1: DOES_NOT_HOLD, 0: stats.UNRESOLVED}}
CODES = {stats.BETTER: 1, HOLDS: 1, stats.WORSE: -1, DOES_NOT_HOLD: -1, stats.UNRESOLVED: 0}


@dataclasses.dataclass(frozen=True)
class Test:
  """The test a comparison is judged by.

  Attributes:
    kind: SUPERIORITY (no margin), NONINFERIORITY or EQUIVALENCE (a margin in points).
    margin: the largest difference the claim tolerates, > 0; None for superiority.
  """
  kind: str = SUPERIORITY
  margin: Optional[float] = None

  def __post_init__(self):
    validate.one_of(self.kind, "test", KINDS)
    if self.kind == SUPERIORITY:
      if self.margin is not None:
        raise ConfigError(f"a superiority test takes no margin (got {self.margin!r}); give "
                          f"{NONINFERIORITY}:{self.margin} or {EQUIVALENCE}:{self.margin}")
    else:
      margin = validate.positive(self.margin, f"{self.kind} margin", unit="points",
                                 note="the difference the claim tolerates", example=3)
      object.__setattr__(self, "margin", margin)

  @classmethod
  def parse(cls, text: str) -> "Test":
    """'superiority', 'non-inferiority:3' or 'equivalence:2.5'."""
    kind, _, margin = text.partition(":")
    if kind != SUPERIORITY and not margin:
      raise ConfigError(f"test {text!r} names no margin; give e.g. {NONINFERIORITY}:3, "
                        f"{EQUIVALENCE}:3 or {SUPERIORITY}")
    try:
      value = float(margin) if margin else None
    except ValueError:
      raise ConfigError(f"test {text!r}: margin {margin!r} is not a number; give e.g. "
                        f"{kind}:3") from None
    return cls(kind, value)

  @property
  def label(self) -> str:
    """'superiority' or 'non-inferiority, margin 3 points'."""
    return self.kind if self.margin is None else f"{self.kind}, margin {self.margin:g} points"

  def name(self, code: int) -> str:
    """The verdict's words for a code (+1, -1, 0)."""
    return _NAMES[self.kind][int(code)]

  def to_json(self) -> dict:
    return {"kind": self.kind, **({} if self.margin is None else {"margin": self.margin})}

  @classmethod
  def from_json(cls, doc) -> "Test":
    return cls(doc["kind"], doc.get("margin"))


def codes(low, high, test: Test) -> np.ndarray:
  """Verdict codes (+1, -1, 0) of intervals [low, high] (arrays of any shape; NaN: 0)."""
  low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
  if test.kind == SUPERIORITY:
    yes, no = low > 0, high < 0
  elif test.kind == NONINFERIORITY:
    yes, no = low > -test.margin, high < -test.margin
  else:
    yes = (low > -test.margin) & (high < test.margin)
    no = (low > test.margin) | (high < -test.margin)
  return yes.astype(np.int8) - no.astype(np.int8)


def interval_bounds(differences, level: float) -> tuple[np.ndarray, np.ndarray]:
  """Student-t interval bounds of the mean over the last axis of [..., seeds] differences."""
  d = np.asarray(differences, np.float64)
  n = d.shape[-1]
  if n < 2:
    nan = np.full(d.shape[:-1], np.nan)
    return nan, nan
  mean = d.mean(-1)
  half = scipy_stats.t.ppf(0.5 + level / 2, n - 1) * d.std(-1, ddof=1) / math.sqrt(n)
  return mean - half, mean + half


def verdict(difference: stats.Interval, test: Test = Test()) -> str:
  """The verdict of `test` on a paired difference's interval (`stats.paired_difference`)."""
  return test.name(codes(difference.low, difference.high, test))


def table(baselines: Sequence[Sequence[float]], others: Sequence[Sequence[float]],
          tests: Sequence[Test], level: float = stats.LEVEL) -> list[str]:
  """The verdicts of one table: comparison i judges others[i] - baselines[i] (paired by seed)
  by tests[i], every interval at the family's level (Bonferroni over the comparisons), so the
  table holds a false verdict with probability at most 1 - `level`."""
  validate.fraction(level, "level", example=0.95)
  if not len(baselines) == len(others) == len(tests) > 0:
    raise ConfigError(f"a table needs one baseline, other and test per comparison; got "
                      f"{len(baselines)}, {len(others)} and {len(tests)}")
  each = stats.family_level(level, len(tests))
  return [verdict(stats.paired_difference(b, o, each), t)
          for b, o, t in zip(baselines, others, tests)]
