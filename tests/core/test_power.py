"""The power analysis against simulation: at the seeds it asks for, the power it states is reached.

For each test kind the plan's seed count is simulated (20000 tables of paired per-seed scores,
vectorised) at the design effect: the share of tables giving the hoped-for verdict must reach
the target power, and match the plan's exact value, within 4 Monte-Carlo standard errors
(sqrt(p (1 - p) / 20000) = 0.0021 at p = 0.9: tolerance 0.0085).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from spot_jax import power
from spot_jax import stats
from spot_jax import verdicts
from spot_jax.errors import ConfigError
from spot_jax.verdicts import EQUIVALENCE, NONINFERIORITY

TABLES, SD, COMPARISONS = 20000, 4.0, 5


def _tolerance(p: float) -> float:
  return 4 * math.sqrt(p * (1 - p) / TABLES)


def _simulated_power(seeds: int, difference: float, test: verdicts.Test, seed: int) -> float:
  """Share of simulated tables whose comparison gets the hoped-for verdict (code +1)."""
  rng = np.random.default_rng(seed)
  seed_effect = rng.normal(0, 10.0, (TABLES, seeds))
  baseline = 60 + seed_effect + rng.normal(0, SD / math.sqrt(2), (TABLES, seeds))
  method = 60 + difference + seed_effect + rng.normal(0, SD / math.sqrt(2), (TABLES, seeds))
  low, high = verdicts.interval_bounds(method - baseline, stats.family_level(0.95, COMPARISONS))
  return float((verdicts.codes(low, high, test) == 1).mean())


@pytest.mark.parametrize("test, difference", [
    (verdicts.Test(), 3.0),  # superiority at the smallest effect worth reporting
    (verdicts.Test(NONINFERIORITY, 3.0), 0.0),  # the method truly matches: the margin holds
    (verdicts.Test(EQUIVALENCE, 3.0), 0.0),
    (verdicts.Test(EQUIVALENCE, 3.0), 1.0),  # equivalent, but off centre
])
def test_the_planned_seeds_reach_the_stated_power(test, difference):
  plan = power.plan(SD, difference, test, target=0.9, comparisons=COMPARISONS)
  assert plan.achieved >= 0.9 and plan.power_at(plan.seeds - 1) < 0.9  # the fewest seeds
  simulated = _simulated_power(plan.seeds, difference, test, seed=plan.seeds)
  assert simulated >= 0.9 - _tolerance(0.9)
  assert abs(simulated - plan.achieved) <= _tolerance(plan.achieved)
  # The exact power holds below the plan too, where small n makes the t distribution matter.
  few = max(2, plan.seeds // 3)
  expected = plan.power_at(few)
  assert abs(_simulated_power(few, difference, test, seed=few) - expected) <= \
      _tolerance(max(expected, 0.01))


def test_a_normal_shortcut_would_ask_for_too_few_seeds():
  # z instead of t: ((z_{1 - a/2} + z_power) sd / effect)^2 seeds; at that count the simulated
  # power falls short of 90% by far more than the Monte-Carlo tolerance, the plan's does not.
  alpha = (1 - 0.95) / COMPARISONS
  z = scipy_stats.norm.ppf
  shortcut = math.ceil(((z(1 - alpha / 2) + z(0.9)) * SD / 3.0) ** 2)
  plan = power.plan(SD, 3.0, comparisons=COMPARISONS)
  assert shortcut < plan.seeds
  assert _simulated_power(shortcut, 3.0, verdicts.Test(), seed=1) < 0.9 - _tolerance(0.9)


def test_variance_components_and_the_shortfall_line():
  # Training seed 2.5, evaluation sample 2.0 at 200 examples, planned at 1000: a fifth of it.
  sd = power.difference_sd(2.5, 2.0, 0.5, evaluation_scale=200 / 1000)
  assert sd == pytest.approx(math.sqrt(2 * (2.5 ** 2 + 4.0 / 5 + 0.25)))
  assert power.difference_sd(3.0, correlation=0.5) == pytest.approx(3.0)
  plan = power.plan(sd, 3.0, comparisons=COMPARISONS)
  assert power.shortfall_warning(plan, plan.seeds) is None
  line = power.shortfall_warning(plan, 5)
  assert "\n" not in line and line.startswith(f"warning: 5 seeds where the power analysis asks "
                                              f"for {plan.seeds} (superiority at +3 points")
  assert f"the power is {100 * plan.power_at(5):.0f}%, not 90%" in line


@pytest.mark.parametrize("call, fragment", [
    (lambda: power.plan(4.0, 3.0, target=1.0), "power=1.0 must be in (0, 1), e.g. power=0.9"),
    (lambda: power.plan(4.0, 3.0, target=0.0), "power=0.0 must be in (0, 1)"),
    (lambda: power.plan(4.0, 3.0, level=1.5), "level=1.5 must be in (0, 1), e.g. level=0.95"),
    (lambda: power.power(5, 4.0, 3.0, level=0.0), "level=0.0 must be in (0, 1)"),
    (lambda: power.plan(4.0, 0.0, verdicts.Test(NONINFERIORITY, 0.0)),
     "non-inferiority margin=0.0 must be a number of points > 0"),
    (lambda: power.plan(0.0, 3.0), "sd=0.0 must be a number of points > 0"),
    (lambda: power.plan(4.0, -1.0),
     "difference=-1.0 must be a number of points > 0 (superiority: "),
    (lambda: power.plan(4.0, 3.0, verdicts.Test(EQUIVALENCE, 2.0)), "outside the equivalence"),
    (lambda: power.plan(4.0, 3.0, comparisons=0), "comparisons=0 must be a positive integer"),
    (lambda: power.power(1, 4.0, 3.0), "seeds=1 must be an integer >= 2"),
    (lambda: power.plan(40.0, 0.01), "no table of up to 2000 seeds reaches power 0.9"),
    (lambda: power.difference_sd(-1.0), "training SD=-1.0 must be a number of points >= 0"),
])
def test_bad_settings_are_one_line_naming_the_setting(call, fragment):
  with pytest.raises(ConfigError) as err:
    call()
  assert fragment in str(err.value) and "\n" not in str(err.value)
