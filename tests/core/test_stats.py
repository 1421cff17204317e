"""spot_jax.stats: intervals against scipy's formulas, verdicts, bootstrap and its limits."""
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from spot_jax import stats
from spot_jax.errors import ConfigError


def test_t_interval_matches_scipy():
  x = [90.0, 87.5, 91.0, 88.0, 89.5]
  got = stats.interval(x, 0.95)
  low, high = scipy_stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=scipy_stats.sem(x))
  assert got.mean == pytest.approx(np.mean(x), abs=1e-12)
  assert (got.low, got.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
  assert got.format(1) == f"{np.mean(x):.1f} ± {(high - low) / 2:.1f}"


def test_one_seed_has_no_interval_and_says_so():
  got = stats.interval([3.0])
  assert got.mean == 3.0 and not got.resolved and "one seed" in got.why
  assert got.format() == "3.0 (n=1)"
  assert stats.verdict(got) == stats.UNRESOLVED
  assert stats.interval([]).format() == "n/a"


def test_paired_verdicts_use_the_differences():
  base = np.array([50.0, 60.0, 70.0, 80.0, 90.0])  # large spread across seeds ...
  better = base + np.array([1.0, 1.2, 0.9, 1.1, 1.0])  # ... but a steady paired gain
  assert stats.paired_verdict(base, better) == stats.BETTER
  assert stats.paired_verdict(better, base) == stats.WORSE
  noisy = base + np.array([3.0, -2.0, 1.0, -3.0, 0.5])
  assert stats.paired_verdict(base, noisy) == stats.UNRESOLVED
  # Unpaired intervals overlap although the paired verdict is clear.
  assert stats.interval(base).high > stats.interval(better).low
  with pytest.raises(ConfigError, match="one value per seed on both sides; got 5 and 4"):
    stats.paired_difference(base, better[:4])


def test_bootstrap_covers_the_mean_and_is_deterministic():
  x = np.random.default_rng(0).normal(10.0, 1.0, 40)
  a = stats.bootstrap(x, np.mean, resamples=500, seed=3)
  b = stats.bootstrap(x, np.mean, resamples=500, seed=3)
  assert a == b and a.low < x.mean() < a.high
  t = stats.interval(x)  # the bootstrap percentile interval is close to t's for a normal mean
  assert abs(a.half_width - t.half_width) < 0.25 * t.half_width


def test_correlation_needs_enough_points():
  three = stats.correlation([1, 2, 3], [2, 4, 7], "spearman")
  assert three.mean == pytest.approx(1.0) and not three.resolved and "too few" in three.why
  rng = np.random.default_rng(1)
  x = rng.normal(size=32)
  y = x + rng.normal(scale=0.5, size=32)
  r = stats.correlation(x, y, "pearson", resamples=500)
  assert r.mean == pytest.approx(scipy_stats.pearsonr(x, y)[0]) and r.low < r.mean < r.high
  with pytest.raises(ConfigError,
                     match="correlation method='kendall' is unknown; valid: pearson, spearman"):
    stats.correlation(x, y, "kendall")


@pytest.mark.parametrize("seeds,message", [
    ([], "--seeds is empty"),
    ([0, 1, 0], "entry 2 \\(0\\) repeats entry 0"),
    ([0, -1], "entry 1 \\(-1\\) must be a non-negative integer"),
])
def test_seed_lists_are_checked(seeds, message):
  with pytest.raises(ConfigError, match=message):
    stats.check_seeds(seeds)
  assert stats.check_seeds([4, 2]) == [4, 2]


def test_non_finite_values_give_no_mean():
  assert math.isnan(stats.interval([1.0, float("nan")]).mean)


def test_family_level_is_bonferroni_and_covers_together():
  assert stats.family_level(0.95, 1) == pytest.approx(0.95)
  assert stats.family_level(0.95, 20) == pytest.approx(0.9975)
  with pytest.raises(ConfigError, match="comparisons=0 must be a positive integer"):
    stats.family_level(0.95, 0)
  # 20 intervals of differences whose true value is 0, simultaneous at 95%: over many tables,
  # at most 5% have any interval excluding 0 (per-comparison 95% intervals: about 64%).
  rng = np.random.default_rng(0)
  tables = rng.normal(size=(2000, 20, 5))
  def any_resolved(level):
    return np.mean([any(stats.verdict(stats.interval(x, level)) != stats.UNRESOLVED for x in table)
                    for table in tables])
  assert any_resolved(stats.family_level(0.95, 20)) <= 0.06
  assert any_resolved(0.95) > 0.5
