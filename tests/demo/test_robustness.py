"""`python -m spot_jax.demo.robustness`: a method's spread over a learning-rate grid against
Prompt Tuning's, from demo folders written here from hand-made scores (the tool only reads
per-seed scores and recipes)."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from scipy import stats as scipy_stats

from spot_jax import cli
from spot_jax.demo import claims as claims_lib
from spot_jax.demo import results
from spot_jax.demo import robustness

TARGETS = ("a", "b")
SEEDS = (0, 1, 2, 3, 4)


def _folder(path: pathlib.Path, rate: float, scores, methods=("pt", "residual", "smop"),
            seeds=SEEDS, **recipe) -> str:
  """A demo folder at peak rate `rate` whose results.json holds `scores[(target, method)]`."""
  summary = results.Summary(list(TARGETS), list(methods), list(seeds), {t: 50.0 for t in TARGETS},
                            scores, [], {}, {})
  path.mkdir(parents=True)
  doc = {"recipe": {"target_steps": 20, "learning_rate": rate,
                    "final_learning_rate": rate / 10, **recipe}, **summary.to_json()}
  (path / "results.json").write_text(json.dumps(doc))
  return str(path)


def _scores(rng, pt_level: float, smop_level: float) -> dict:
  """Prompt Tuning near `pt_level`, Residual PT near 80 at every rate, SMoP near `smop_level`."""
  base = {"pt": pt_level, "residual": 80.0, "smop": smop_level}
  return {(t, m): list(np.round(base[m] + rng.normal(0, 1, len(SEEDS)), 1))
          for t in TARGETS for m in base}


@pytest.fixture
def folders(tmp_path):
  rng = np.random.default_rng(0)
  levels = {1.0: (78.0, 90.0), 0.1: (60.0, 50.0), 0.3: (72.0, 75.0)}  # given out of order
  return {rate: _folder(tmp_path / f"lr{rate}", rate, _scores(rng, *lv))
          for rate, lv in levels.items()}


def test_spreads_differences_and_verdicts_match_an_independent_computation(folders):
  g = robustness.grid(list(folders.values()))
  assert g.rates == (0.1, 0.3, 1.0) and g.seeds == SEEDS and g.methods[0] == "pt"
  docs = {r: json.loads(pathlib.Path(f, "results.json").read_text()) for r, f in folders.items()}
  mean = {m: np.array([np.mean([docs[r]["cells"][f"{t}/{m}"]["scores"] for t in TARGETS], axis=0)
                       for r in (0.1, 0.3, 1.0)]) for m in ("pt", "residual", "smop")}
  spread = {m: a.max(0) - a.min(0) for m, a in mean.items()}
  for m in mean:
    np.testing.assert_allclose(g.accuracy[m], mean[m])
    np.testing.assert_allclose(g.spread(m), spread[m])
  for m in ("residual", "smop"):  # two comparisons: each interval at 97.5%
    d = spread["pt"] - spread[m]
    half = scipy_stats.t.ppf(1 - 0.025 / 2, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    iv = g.difference(m)
    assert iv.mean == pytest.approx(d.mean()) and iv.high - iv.mean == pytest.approx(half)
  assert g.verdict("residual") == claims_lib.HOLDS  # flat against Prompt Tuning's 18 points
  assert g.verdict("smop") == claims_lib.DOES_NOT_HOLD  # 40 points against 18
  table = robustness.rows(g)
  assert table[0][1:4] == ["at 0.1", "at 0.3", "at 1"]
  assert [r[-1] for r in table[1:]] == ["-", claims_lib.HOLDS, claims_lib.DOES_NOT_HOLD]


def test_the_command_prints_the_grid(folders, capsys):
  assert cli.run(robustness.main, list(folders.values()), "spot_jax.demo.robustness") == 0
  out = capsys.readouterr().out
  assert "5 seeds x 3 learning rates (0.1, 0.3, 1)" in out and "Residual PT" in out


def _bad(tmp_path, folders, **changes):
  rng = np.random.default_rng(1)
  return [folders[0.1], _folder(tmp_path / "other", changes.pop("rate", 2.0),
                                _scores(rng, 70.0, 70.0), **changes)]


@pytest.mark.parametrize("make, expected", [
    (lambda p, f: [f[0.1]], "give at least two demo folders"),
    (lambda p, f: _bad(p, f, rate=0.1), "both ran learning rate 0.1; give each rate"),
    (lambda p, f: _bad(p, f, target_steps=40), "ran another recipe than"),
    (lambda p, f: _bad(p, f, seeds=(0, 1, 2, 3, 9)), "ran seeds [0, 1, 2, 3, 9]"),
    (lambda p, f: [f[0.1], str(p)], "has no results.json"),
])
def test_bad_input_is_one_line(tmp_path, folders, capsys, make, expected):
  assert cli.run(robustness.main, make(tmp_path, folders), "spot_jax.demo.robustness") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and expected in err[0], err


def test_a_grid_without_a_method_to_compare_is_refused(tmp_path, capsys):
  rng = np.random.default_rng(2)
  only = [_folder(tmp_path / f"lr{r}", r, {(t, "pt"): list(rng.normal(70, 1, len(SEEDS)))
                                           for t in TARGETS}, methods=("pt",)) for r in (0.1, 1.0)]
  assert cli.run(robustness.main, only, "spot_jax.demo.robustness") == 2
  assert "needs Prompt Tuning and a method to compare" in capsys.readouterr().err
