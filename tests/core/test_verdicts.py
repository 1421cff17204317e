"""Superiority, non-inferiority and equivalence verdicts on simulated scores with a known truth.

Each test draws thousands of tables of per-seed scores at once (numpy, vectorised): a baseline
and six methods on the same seeds (a seed effect shared by all, so the pairing matters, and the
baseline's noise shared by every comparison, so the comparisons are correlated as in a real
table). The truth sits where a false verdict is most likely: no difference for superiority, and
exactly at the margin for non-inferiority and equivalence.

Monte-Carlo tolerance: a rate estimated from N tables has standard error sqrt(p (1 - p) / N);
the checks allow 4 standard errors (N = 20000: 0.006 at p = 0.05), so a correct implementation
fails them with probability below 1e-4, and the draws are seeded.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from spot_jax import stats
from spot_jax import verdicts
from spot_jax.errors import ConfigError
from spot_jax.verdicts import EQUIVALENCE, NONINFERIORITY, SUPERIORITY

_Test = verdicts.Test  # (a name pytest does not collect)
TABLES, SEEDS, SD, MARGIN = 20000, 5, 4.0, 3.0
# Two comparisons of each kind, each with the true difference (method - baseline) that makes
# a false verdict likeliest: at 0 both "better" and "worse" are false; at -margin
# non-inferiority does not hold; at +margin equivalence does not hold.
TESTS = [_Test(), _Test(), _Test(NONINFERIORITY, MARGIN), _Test(NONINFERIORITY, MARGIN),
         _Test(EQUIVALENCE, MARGIN), _Test(EQUIVALENCE, MARGIN)]
TRUTH = np.array([0.0, 0.0, -MARGIN, -MARGIN, MARGIN, -MARGIN])
# Per kind, the codes that are false verdicts at TRUTH: any resolved superiority verdict, "holds".
FALSE = [{1, -1}, {1, -1}, {1}, {1}, {1}, {1}]


def _tolerance(p: float, n: int = TABLES) -> float:
  return 4 * math.sqrt(p * (1 - p) / n)


def _differences(rng: np.random.Generator, truth: np.ndarray, seeds: int = SEEDS) -> np.ndarray:
  """[TABLES, comparisons, seeds] paired differences of simulated scores."""
  seed_effect = rng.normal(0, 10.0, (TABLES, 1, seeds))  # shared by every method: cancels
  noise = SD / math.sqrt(2)  # each run's own noise: a difference's SD is SD
  baseline = 50 + seed_effect + rng.normal(0, noise, (TABLES, 1, seeds))
  methods = 50 + truth[None, :, None] + seed_effect + rng.normal(0, noise, (TABLES, truth.size,
                                                                            seeds))
  return methods - baseline


def _codes(diffs: np.ndarray, level_each: float) -> np.ndarray:
  low, high = verdicts.interval_bounds(diffs, level_each)
  return np.stack([verdicts.codes(low[:, i], high[:, i], t) for i, t in enumerate(TESTS)], 1)


def _false(codes: np.ndarray) -> np.ndarray:
  return np.stack([np.isin(codes[:, i], list(f)) for i, f in enumerate(FALSE)], 1)


def test_a_table_holds_a_false_verdict_at_most_5_percent_of_the_time():
  diffs = _differences(np.random.default_rng(0), TRUTH)
  each = stats.family_level(0.95, len(TESTS))
  false = _false(_codes(diffs, each))
  family_rate = false.any(1).mean()
  assert family_rate <= 0.05 + _tolerance(0.05)
  # Each comparison's false rate is what its interval's level says: superiority's two sides at
  # 0.05/6 together, non-inferiority's one side at the margin; equivalence needs both sides
  # inside the margins, so at most one side's rate (5 seeds rarely give so narrow an interval).
  alpha = 1 - each
  for i, expected in enumerate([alpha, alpha, alpha / 2, alpha / 2]):
    assert abs(false[:, i].mean() - expected) <= _tolerance(expected), (i, false[:, i].mean())
  assert false[:, 4:].mean(0).max() <= alpha / 2 + _tolerance(alpha / 2)
  # The check can fail: without the family's correction (each interval at 95%) the same tables
  # hold a false verdict far more often than 5%.
  assert _false(_codes(diffs, 0.95)).any(1).mean() > 0.05 + 10 * _tolerance(0.05)


def test_true_verdicts_come_with_large_effects_and_never_a_false_one():
  # Far from every threshold (superiority +10 / -10; non-inferiority at 0 and at -2 margins;
  # equivalence at 0 and at 3 margins) 80 seeds resolve every comparison the right way.
  truth = np.array([10.0, -10.0, 0.0, -2 * MARGIN, 0.0, 3 * MARGIN])
  diffs = _differences(np.random.default_rng(1), truth, seeds=80)
  codes = _codes(diffs, stats.family_level(0.95, len(TESTS)))
  expected = np.array([1, -1, 1, -1, 1, -1])
  assert (codes == expected).mean(0).min() > 0.99
  assert not (codes == -expected).any()  # never the opposite verdict
  names = [t.name(c) for t, c in zip(TESTS, codes[0])]
  assert names == ["better", "worse", "holds", "does not hold", "holds", "does not hold"]


def test_table_names_each_verdict_by_its_test_and_agrees_with_the_vectorised_codes():
  rng = np.random.default_rng(2)
  base = rng.normal(50, 5, 8)
  others = [base + 12 + rng.normal(0, 1, 8), base + rng.normal(0, 1, 8),
            base - 0.3 + rng.normal(0, 1, 8), base + 9 + rng.normal(0, 1, 8)]
  tests = [_Test(), _Test(NONINFERIORITY, 2.0), _Test(EQUIVALENCE, 2.5), _Test(EQUIVALENCE, 2.5)]
  got = verdicts.table([base] * 4, others, tests)
  assert got == ["better", "holds", "holds", "does not hold"]
  low, high = verdicts.interval_bounds(np.stack([o - base for o in others]),
                                       stats.family_level(0.95, 4))
  assert [t.name(verdicts.codes(lo, hi, t)) for lo, hi, t in zip(low, high, tests)] == got
  # The same equivalence at a margin narrower than the interval cannot resolve it.
  assert verdicts.table([base], [others[2]], [_Test(EQUIVALENCE, 0.1)]) == ["not resolved"]


def test_an_interval_without_bounds_is_not_resolved():
  one_seed = stats.paired_difference([1.0], [5.0])
  for test in TESTS:
    assert verdicts.verdict(one_seed, test) == "not resolved"


def test_tests_parse_print_and_round_trip():
  t = _Test.parse("non-inferiority:2.5")
  assert t == _Test(NONINFERIORITY, 2.5) and t.label == "non-inferiority, margin 2.5 points"
  assert _Test.parse("superiority") == _Test() and _Test().label == SUPERIORITY
  assert _Test.from_json(_Test(EQUIVALENCE, 3).to_json()) == _Test(EQUIVALENCE, 3.0)


@pytest.mark.parametrize("make, fragment", [
    (lambda: _Test(NONINFERIORITY, 0.0), "non-inferiority margin=0.0 must be a number of points"),
    (lambda: _Test(EQUIVALENCE, -1.0), "equivalence margin=-1.0 must be a number of points > 0"),
    (lambda: _Test(EQUIVALENCE, float("nan")), "equivalence margin=nan must be"),
    (lambda: _Test(NONINFERIORITY), "non-inferiority margin=None must be"),
    (lambda: _Test.parse("equivalence"), "names no margin"),
    (lambda: _Test.parse("equivalence:-2"), "margin=-2.0 must be a number of points > 0"),
    (lambda: _Test.parse("non-inferiority:x"), "is not a number"),
    (lambda: _Test("inferiority", 1.0),
     "test='inferiority' is unknown (did you mean 'non-inferiority' or 'superiority'?); valid: "),
    (lambda: _Test(SUPERIORITY, 2.0), "a superiority test takes no margin"),
    (lambda: verdicts.table([[1, 2]], [[2, 3]], [_Test()], level=1.0),
     "level=1.0 must be in (0, 1)"),
    (lambda: verdicts.table([[1, 2]], [[2, 3]], [_Test()], level=0), "level=0 must be in (0, 1)"),
])
def test_bad_settings_are_one_line_naming_the_setting(make, fragment):
  with pytest.raises(ConfigError) as err:
    make()
  assert fragment in str(err.value) and "\n" not in str(err.value)
