"""`python -m spot_jax.demo.noise`: the variance split on known numbers, its refusals, and one
tiny real run whose written table is the split of its runs' own records."""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest

from spot_jax import cli
from spot_jax import embedded
from spot_jax import experiment
from spot_jax import power
from spot_jax.demo import methods
from spot_jax.demo import noise
from spot_jax.demo import variance
from spot_jax.run_dir import RunDir

needs_model = pytest.mark.skipif(not (pathlib.Path(embedded.TOY_DIR) / "checkpoint").is_dir(),
                                 reason="no toy model; run python -m spot_jax.embedded.pretrain")


def test_binomial_variance_is_the_runs_mean_of_p_one_minus_p_over_n():
  # p = 0.5 and 0.9 on 200 examples: (0.25 + 0.09) / 2 / 200, in points^2
  assert variance.binomial_variance([50.0, 90.0], 200) == pytest.approx(8.5)
  assert variance.binomial_variance([100.0, 0.0], 50) == 0.0


def test_decompose_splits_a_known_total():
  first, second = [70.0, 80.0, 90.0], [72.0, 78.0, 90.0]
  c = variance.decompose(first, second, evaluation_variance=1.0)
  # totals: var(first) = 100, var(second) = 84 -> 92; within a seed: (4 + 4 + 0) / (2 * 3) = 4/3
  assert c.total == pytest.approx(math.sqrt(92.0))
  assert c.training == pytest.approx(math.sqrt(92.0 - 4 / 3))
  assert c.evaluation == pytest.approx(1.0)
  assert c.rounding == pytest.approx(math.sqrt(4 / 3 - 1.0))
  assert c.training ** 2 + c.rounding ** 2 + c.evaluation ** 2 == pytest.approx(c.total ** 2)
  assert (c.mean, c.seeds, c.unchanged) == (pytest.approx(80.0), 3, 1)


def test_decompose_without_rounding_and_with_evaluation_noise_above_it():
  same = variance.decompose([10.0, 20.0], [10.0, 20.0], evaluation_variance=0.0)
  assert same.rounding == 0.0 and same.training == pytest.approx(same.total)
  assert same.unchanged == 2
  # the groupings swap the scores: nothing is the seed's own, all is within a seed
  swapped = variance.decompose([10.0, 20.0], [20.0, 10.0], evaluation_variance=30.0)
  assert swapped.training == 0.0 and swapped.rounding == pytest.approx(math.sqrt(20.0))
  # evaluation noise larger than a seed's spread: no rounding is left
  assert variance.decompose([10.0, 20.0], [11.0, 20.0], 30.0).rounding == 0.0
  with pytest.raises(ValueError, match="at least 2"):
    variance.decompose([1.0], [1.0], 0.0)


def test_targets_mean_divides_the_binomial_variances_by_t_squared():
  first = {"a": [50.0, 60.0, 70.0], "b": [10.0, 10.0, 40.0]}
  second = {"a": [50.0, 62.0, 70.0], "b": [10.0, 14.0, 40.0]}
  c = variance.targets_mean(first, second, {"a": 200, "b": 100})
  expected = (variance.binomial_variance(first["a"] + second["a"], 200)
              + variance.binomial_variance(first["b"] + second["b"], 100)) / 4
  assert c.evaluation == pytest.approx(math.sqrt(expected))
  direct = variance.decompose([30.0, 35.0, 55.0], [30.0, 38.0, 55.0], expected)
  assert c == direct


@pytest.mark.parametrize("argv, expected", [
    (["--num_seeds=1"], "--num_seeds=1 must be an integer >= 2"),
    (["--targets=summ"], "--targets='summ' is unknown (did you mean 'sum'?)"),
    (["--targets=sum,sum"], "repeats a target"),
    (["--other_k=0"], "--other_k=0 must be a positive integer"),
    (["--targets=sum", "--num_seeds=2", "--other_k=2"], "--other_k=2 must be smaller than"),
    (["--target_steps=0"], "--target_steps=0 must be a positive integer"),
])
def test_bad_input_is_one_line_and_nothing_written(argv, expected, tmp_path, capsys):
  out = tmp_path / "out"
  assert cli.run(noise.main, argv + [f"--output_dir={out}"], "spot_jax.demo.noise") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("spot_jax.demo.noise: error: "), err
  assert expected in err[0], err
  assert not any(tmp_path.iterdir())


def test_the_second_grouping_is_one_job_per_seed_by_default():
  first, second = noise.groupings(["a", "b"], [0, 1, 2], 2)
  assert [(r.label, r.seed) for r in first] == [("a", 0), ("a", 1), ("a", 2), ("b", 0),
                                                ("b", 1), ("b", 2)]
  assert [[(r.label, r.seed) for r in job] for job in second] == [
      [("a", 0), ("b", 0)], [("a", 1), ("b", 1)], [("a", 2), ("b", 2)]]


@needs_model
def test_a_tiny_pilot_writes_the_split_of_its_runs(tmp_path, capsys):
  argv = ["--targets=sum,category", "--num_seeds=2", "--target_steps=2", "--other_k=1",
          f"--output_dir={tmp_path}"]
  assert noise.main(argv) == 0
  doc = json.loads((tmp_path / "noise.json").read_text())
  assert doc["k"] == {"first": 4, "second": 1} and doc["seeds"] == [0, 1]
  jobs = sorted((tmp_path / "runs").iterdir())
  assert len(jobs) == 5  # one job of 4 runs, four of one
  settings = methods.Settings()
  for target, examples in (("sum", settings.eval_examples), ("category", settings.rank_examples)):
    first, second = doc["scores"][target]["first"], doc["scores"][target]["second"]
    # a class-label target: the rank-classification accuracy each run saved; a sum (composed,
    # not a class): greedy decoding's best validation accuracy in each run.json
    runs = [job / f"{target}.seed_{s}" for job in jobs for s in (0, 1)
            if (job / f"{target}.seed_{s}").is_dir()]
    ranked = target == "category"
    recorded = sorted(json.loads(RunDir(r).rank_path.read_text())["accuracy"] if ranked
                      else experiment.read_outcome(r).score for r in runs)
    assert ranked or not any(RunDir(r).rank_path.exists() for r in runs)
    assert sorted(first + second) == pytest.approx(recorded, abs=0.01)
    assert doc["examples"][target] == examples
    expected = variance.decompose(first, second,
                                  variance.binomial_variance(first + second, examples))
    assert doc["components"][target] == expected.to_json()
  mean = variance.Components(**doc["components"]["mean of targets"])
  sd = power.difference_sd(mean.training, mean.evaluation, mean.rounding)
  assert doc["plan"]["seeds"] == power.plan(sd, noise.EFFECT,
                                            comparisons=noise.COMPARISONS).seeds
  out = capsys.readouterr().out
  assert "rounding SD" in out and f"seeds needed: {doc['plan']['seeds']}" in out
  assert "| mean of targets |" in (tmp_path / "noise.md").read_text()
  assert np.isfinite(mean.total)
