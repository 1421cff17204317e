"""Where the spread of a run's accuracy over seeds comes from: training seed, evaluation sample,
rounding.

A pilot trains every seed twice with the same recipe, once in each of two groupings of runs into
jobs (K runs per jitted step). The two runs of a seed share their initialisation and data order;
what differs is floating-point rounding, which training amplifies into two different prompts, and
two different prompts also differ in which of the scored examples they get right. In points^2,
per target, with a_s and b_s the accuracies of seed s's two runs:

  total       var_total = the variance of one run's accuracy over seeds (ddof 1), the mean of
              the two groupings' variances
  within      var_w = sum over seeds of (a_s - b_s)^2 / (2 n): the spread of one seed's runs
  training    var_t = var_total - var_w (0 when negative): the covariance of a seed's two runs,
              what the seed itself (initialisation, data order) decides
  evaluation  var_e = mean over runs of p (1 - p) / m: the binomial sampling variance of an
              accuracy p on m scored examples (an analytic value, not a bootstrap)
  rounding    var_r = var_w - var_e (0 when negative): what rounding does beyond it

Every run scores the same examples, so the evaluation term is the variance a fresh evaluation
sample would add; inside the spread of one seed's runs it counts fully only when the two prompts
err on unrelated examples, so var_r is a lower bound of rounding's share and var_r + var_e is
what another K does to a score. The SDs are the square roots (`Components`);
`spot_jax.power.difference_sd` takes them.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Components:
  """The SD (points) of one run's accuracy, by source.

  Attributes:
    training: from the training seed (initialisation, data order): what a seed's two runs share.
    evaluation: the binomial SD of an accuracy on the scored examples.
    rounding: from floating-point rounding: the spread of a seed's runs under two groupings,
      beyond the evaluation SD.
    total: of one run's accuracy over seeds.
    mean: the runs' mean accuracy.
    seeds: seeds measured (each trained in both groupings).
    unchanged: seeds whose two runs scored the same.
  """
  training: float
  evaluation: float
  rounding: float
  total: float
  mean: float
  seeds: int
  unchanged: int

  def to_json(self) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v
            for k, v in dataclasses.asdict(self).items()}


def binomial_variance(accuracies: Sequence[float], examples: int) -> float:
  """Mean over runs of p (1 - p) / examples, in points^2 (accuracies in %)."""
  p = np.asarray(accuracies, np.float64) / 100.0
  return float(np.mean(p * (1.0 - p)) / examples * 1e4)


def decompose(first: Sequence[float], second: Sequence[float],
              evaluation_variance: float) -> Components:
  """The components of accuracies `first[s]` and `second[s]`: seed s under two groupings.

  Args:
    first, second: accuracies (%) of the same seeds, in the same order (at least 2).
    evaluation_variance: the evaluation sample's variance, points^2 (`binomial_variance`).
  """
  a, b = np.asarray(first, np.float64), np.asarray(second, np.float64)
  if a.shape != b.shape or a.ndim != 1 or a.size < 2:
    raise ValueError(f"need two equal lists of at least 2 accuracies, got {a.shape} and {b.shape}")
  total = (np.var(a, ddof=1) + np.var(b, ddof=1)) / 2
  within = float(np.sum((a - b) ** 2) / (2 * a.size))
  training = max(total - within, 0.0)
  rounding = max(within - evaluation_variance, 0.0)
  return Components(math.sqrt(training), math.sqrt(evaluation_variance), math.sqrt(rounding),
                    math.sqrt(total), float(np.mean([a, b])), int(a.size),
                    int(np.sum(a == b)))


def targets_mean(first: Mapping[str, Sequence[float]], second: Mapping[str, Sequence[float]],
                 examples: Mapping[str, int]) -> Components:
  """The components of each seed's accuracy averaged over the targets (the demo's targets'
  mean): the mean of T accuracies has 1/T^2 the sum of their binomial variances."""
  targets = list(first)
  mean_a = np.mean([first[t] for t in targets], axis=0)
  mean_b = np.mean([second[t] for t in targets], axis=0)
  evaluation = sum(binomial_variance(list(first[t]) + list(second[t]), examples[t])
                   for t in targets) / len(targets) ** 2
  return decompose(mean_a, mean_b, evaluation)
