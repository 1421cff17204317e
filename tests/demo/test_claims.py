"""The headline claims and their power analysis: each claim is read by its test (superiority,
non-inferiority or equivalence at the margin) on the targets' mean; the design's seed count
reaches the stated power on every claim, and fewer seeds give one warning line. Fabricated
scores, no training."""
from __future__ import annotations

import numpy as np
import pytest

from spot_jax import power
from spot_jax import verdicts
from spot_jax.demo import claims
from spot_jax.demo import methods
from spot_jax.demo import results
from spot_jax.errors import ConfigError

METHODS = ("pt", "spot", "smop", "residual", "spot_unrelated")


def _summary(shift: dict, seeds: int = 12, spread: float = 0.3) -> results.Summary:
  """Two targets; method m scores PT's seed score + shift[m] + a small per-seed wobble."""
  rng = np.random.RandomState(0)
  scores = {}
  for t, base in (("a", 60.0), ("b", 80.0)):
    pt = base + rng.normal(0, 4, seeds)
    for m in METHODS:
      wobble = 0 if m == "pt" else rng.normal(0, spread, seeds)
      scores[(t, m)] = list(pt + shift.get(m, 0.0) + wobble)
  choices = {(t, s): {"target": "sentiment_travel", "seed": s, "source": "sentiment_food",
                      "related": s % 4 != 0,
                      "ranking": [["sentiment_food", 0.9], ["addition", 0.1], ["topic", 0.0],
                                  ["length", 0.0]]}
             for t in ("a", "b") for s in range(seeds)}
  return _table(list(range(seeds)), scores, choices, claims.CLAIM_TESTS)


def _table(seeds, scores, choices, tests) -> results.Summary:
  return results.Summary(["a", "b"], list(METHODS), list(seeds), {"a": 50.0, "b": 50.0}, scores,
                         [], choices, {}, tests=dict(tests))


def test_headline_rows_read_each_claim_by_its_own_test(tmp_path):
  # SPoT and Residual well above PT; SMoP 1 point below (inside the margin); the control equal.
  s = _summary({"spot": 8.0, "residual": 6.0, "smop": -1.0, "spot_unrelated": 0.0})
  rows = claims.headline_rows(s)
  assert rows[0] == list(claims.CLAIM_COLUMNS) + ["test"]
  by_claim = {r[0]: r for r in rows[1:]}
  spot = by_claim["SPoT beats Prompt Tuning on a related target (retrieved source)"]
  assert spot[1] == results.MEAN_ROW and spot[4] == claims.HOLDS and spot[5] == "superiority"
  control = by_claim["SPoT from an unrelated source neither helps nor hurts (control)"]
  assert control[4] == verdicts.HOLDS and control[5] == "equivalence, margin 3 points"
  smop = [r for r in rows if r[0].startswith("SMoP 4x5")][0]
  assert smop[4] == verdicts.HOLDS and smop[5] == "non-inferiority, margin 3 points"
  assert [r for r in rows if r[0].startswith("Residual PT")][0][4] == claims.HOLDS
  retrieval = rows[-1]
  assert retrieval[0].startswith("task embeddings rank a related source first") \
      and retrieval[4] == claims.HOLDS  # 75% against a chance of 25%
  assert len(rows) == 6
  # results.json carries the same rows, and results.md shows them under their heading.
  doc = s.to_json()["headline"]
  assert [d["verdict"] for d in doc] == [r[4] for r in rows[1:]]
  assert doc[1]["test"] == "equivalence, margin 3 points"
  results.write(tmp_path, s, {"target_steps": 20})
  md = (tmp_path / "results.md").read_text()
  assert claims.HEADLINE_HEADING in md and "| share above chance |" in md


def test_a_control_that_helps_and_a_smop_that_loses_do_not_hold():
  s = _summary({"spot": 8.0, "residual": 0.0, "smop": -9.0, "spot_unrelated": 7.0})
  rows = {r[0][:10]: r[4] for r in claims.headline_rows(s)[1:]}
  assert rows["SPoT from "] == verdicts.DOES_NOT_HOLD  # +7 lies wholly outside (-3, 3)
  assert rows["SMoP 4x5 ("] == verdicts.DOES_NOT_HOLD  # -9 lies below -3
  assert rows["Residual P"] == "not resolved"  # no effect: superiority cannot be shown


def test_the_margin_moves_every_margin_claim():
  s = _summary({"smop": -4.0, "spot_unrelated": 4.0})
  assert {r[0][:10]: r[4] for r in claims.headline_rows(s)[1:]}["SMoP 4x5 ("] == \
      verdicts.DOES_NOT_HOLD
  wide = _table(s.seeds, s.scores, s.choices, claims.claim_tests(6.0))
  rows = {r[0][:10]: r for r in claims.headline_rows(wide)[1:]}
  assert rows["SMoP 4x5 ("][4] == verdicts.HOLDS and rows["SMoP 4x5 ("][5].endswith("6 points")
  assert rows["SPoT from "][4] == verdicts.HOLDS


def test_the_design_reaches_its_power_on_every_claim_and_warns_below_it():
  design = claims.Design(comparisons=5)
  plans = design.plans()
  assert set(plans) == set(claims.HEADLINE) == set(claims.PILOT_SD)
  needed = design.seeds()
  assert needed == max(p.seeds for p in plans.values())
  for (method, _), p in plans.items():
    assert p.power_at(needed) >= 0.9, method  # every claim at the count the design asks for
    assert p.seeds == 2 or p.power_at(p.seeds - 1) < 0.9, method  # and no fewer would do
  assert design.shortfall(needed) is None
  line = design.shortfall(methods.DEFAULT_SEEDS)
  assert line.startswith(f"warning: {methods.DEFAULT_SEEDS} seeds where the power analysis asks "
                         f"for {needed}") and "\n" not in line
  # A larger margin is an easier target: fewer seeds.
  assert claims.Design(margin=6.0, comparisons=5).seeds() < needed
  # A table without the control plans only for the claims it makes; without any, for none.
  spot_only = claims.Design(comparisons=1, claims=(("spot", "pt"),))
  assert set(spot_only.plans()) == {("spot", "pt")} and spot_only.seeds() < needed
  assert claims.Design(claims=()).seeds() == 2 and claims.Design(claims=()).shortfall(2) is None
  rows = claims.power_rows(design, methods.DEFAULT_SEEDS, methods.METHOD_NAMES)
  assert rows[0][-1] == f"power at {methods.DEFAULT_SEEDS} seeds" and len(rows) == 6
  assert {r[1] for r in rows[1:]} == {"superiority at +3", "non-inferiority, margin 3 points",
                                      "equivalence, margin 3 points"}


@pytest.mark.parametrize("make, fragment", [
    (lambda: claims.Design(margin=0.0).seeds(), "margin=0.0 must be a number of points > 0"),
    (lambda: claims.Design(target=1.0).seeds(), "power=1.0 must be"),
    (lambda: claims.Design(comparisons=0).seeds(), "comparisons=0 must be a positive integer"),
])
def test_bad_design_settings_are_one_line_naming_the_setting(make, fragment):
  with pytest.raises(ConfigError, match=fragment) as e:
    make()
  assert "\n" not in str(e.value)


def test_the_pilot_sds_are_positive_points():
  assert all(0 < sd < 20 for sd in claims.PILOT_SD.values())
  assert power.POWER == 0.9
