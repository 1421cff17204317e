"""The demo's seeded results: tables with intervals, paired verdicts, claims, JSON and a PNG.

Every number is a mean over seeds with its Student-t 95% interval (`spot_jax.stats`); every
comparison is a verdict from the paired per-seed differences (the same seed's runs share their
data order), so it says "better", "worse" or "not resolved", never a bare gap; a comparison given
a non-inferiority or equivalence test at a margin (`Summary.tests`, `spot_jax.verdicts`) says
"holds", "does not hold" or "not resolved", and its rows name the test. The verdicts of a
table are one family: their intervals are simultaneous at 95% (Bonferroni over the comparisons
on every target; the comparisons of the targets' mean, each seed's differences averaged over the
targets, are a second family), so a table shows a wrong verdict with probability at most 5%,
however many comparisons it makes.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Mapping, Optional, Sequence

import numpy as np

from spot_jax import stats
from spot_jax import verdicts as verdicts_lib
from spot_jax.demo import source_library
from spot_jax.demo.claims import CLAIM_TESTS, PAIRED_CLAIMS, SUPERIORITY
from spot_jax.demo.claims import HEADLINE_HEADING, claim_rows, headline_rows, signed
from spot_jax.demo.methods import JOB_NAMES, METHOD_NAMES, MPT_SOURCE, SOURCE, Settings, accuracy
from spot_jax.experiment import RunOutcome

BASELINE = "pt"
MEAN_ROW = "mean of targets"


@dataclasses.dataclass
class Summary:
  """Everything one demo measured (targets only; sources are listed apart).

  Attributes:
    targets, methods, seeds: as run (methods start with "pt").
    chance: accuracy of the majority label per target (%).
    scores: (target, method) -> accuracies in seed order.
    sources: (source, accuracy) of the library's source prompts.
    choices: (target, seed) -> retrieval's choice as JSON (`spot_sources.Choice.to_json`).
    seconds: method -> the job's wall time in this process (None: reused).
    prompt_length: the recipe's prompt tokens (Prompt Tuning's, which the claims name).
    tests: (method, baseline) -> the test of that comparison's verdicts; superiority when absent.
    left_out: sources left out of retrieval (`source_library.LeftOut.to_json`).
  """
  targets: list[str]
  methods: list[str]
  seeds: list[int]
  chance: dict[str, float]
  scores: dict[tuple[str, str], list[float]]
  sources: list[tuple[str, float]]
  choices: dict[tuple[str, int], dict]
  seconds: dict[str, Optional[float]]
  prompt_length: int = Settings.prompt_length
  tests: dict[tuple[str, str], verdicts_lib.Test] = dataclasses.field(default_factory=dict)
  left_out: list[dict] = dataclasses.field(default_factory=list)

  def test(self, method: str, baseline: str = BASELINE) -> verdicts_lib.Test:
    """The test the (method, baseline) comparison is judged by."""
    return self.tests.get((method, baseline), SUPERIORITY)

  def interval(self, target: str, method: str) -> stats.Interval:
    return stats.interval(self.scores[(target, method)])

  def pairs(self) -> list[tuple[str, str]]:
    """(method, baseline) of every comparison reported (`pairs`)."""
    return pairs(self.methods, self.tests)

  @property
  def comparisons(self) -> int:
    """The per-target family's size: pairs x targets."""
    return len(self.pairs()) * len(self.targets)

  @property
  def level(self) -> float:
    """Each per-target comparison's level: simultaneous 95% over pairs x targets."""
    return stats.family_level(stats.LEVEL, max(self.comparisons, 1))

  @property
  def pooled_level(self) -> float:
    """Each targets'-mean comparison's level: simultaneous 95% over the pairs."""
    return stats.family_level(stats.LEVEL, max(len(self.pairs()), 1))

  def difference(self, target: str, method: str, baseline: str = BASELINE) -> stats.Interval:
    return stats.paired_difference(self.scores[(target, baseline)], self.scores[(target, method)],
                                   self.level)

  def verdict(self, target: str, method: str, baseline: str = BASELINE) -> str:
    return verdicts_lib.verdict(self.difference(target, method, baseline),
                                self.test(method, baseline))

  def pooled_difference(self, method: str, baseline: str = BASELINE) -> stats.Interval:
    """mean over seeds of (the seed's difference averaged over the targets)."""
    per_seed = np.mean([np.subtract(self.scores[(t, method)], self.scores[(t, baseline)])
                        for t in self.targets], axis=0)
    return stats.interval(per_seed, self.pooled_level)

  def differences(self, method: str, baseline: str = BASELINE) -> list[tuple[str, stats.Interval]]:
    """(target, paired difference) on every target, then (MEAN_ROW, the targets'-mean
    difference) when there are several targets: the rows a comparison fills in every table."""
    rows = [(t, self.difference(t, method, baseline)) for t in self.targets]
    if len(self.targets) > 1:
      rows.append((MEAN_ROW, self.pooled_difference(method, baseline)))
    return rows

  def verdicts(self) -> dict[tuple[str, str, str], str]:
    """Every verdict the tables report: (method, baseline, target or MEAN_ROW) -> verdict, the
    per-target family then the targets'-mean family, in `pairs()` order."""
    rows = [(m, b, t, iv) for m, b in self.pairs() for t, iv in self.differences(m, b)]
    rows.sort(key=lambda row: row[2] == MEAN_ROW)  # stable: the per-target family first
    return {(m, b, t): verdicts_lib.verdict(iv, self.test(m, b)) for m, b, t, iv in rows}

  def select(self, seeds: Sequence[int]) -> "Summary":
    """The same summary restricted to `seeds` (each in `self.seeds`), in that order."""
    index = [self.seeds.index(s) for s in seeds]
    return dataclasses.replace(
        self, seeds=list(seeds), scores={k: [v[i] for i in index] for k, v in self.scores.items()},
        choices={k: c for k, c in self.choices.items() if k[1] in seeds})

  @classmethod
  def from_json(cls, doc: Mapping) -> "Summary":
    """The scores of a results.json (`write`) back as a Summary (no job times).

    Raises:
      KeyError or TypeError when `doc` is not one.
    """
    targets, methods, seeds = list(doc["targets"]), list(doc["methods"]), list(doc["seeds"])
    scores = {(t, m): [float(x) for x in doc["cells"][f"{t}/{m}"]["scores"]]
              for t in targets for m in methods}
    if any(len(v) != len(seeds) for v in scores.values()):
      raise TypeError("a cell's scores do not have one value per seed")
    choices = {(c["target"], int(c["seed"])): c for c in doc.get("retrieval", [])}
    tests = {(x["method"], x["baseline"]): verdicts_lib.Test.from_json(x)
             for x in doc.get("tests", [])}
    return cls(targets, methods, [int(s) for s in seeds], dict(doc["chance"]), scores,
               [(x["task"], x["accuracy"]) for x in doc.get("sources", [])], choices, {},
               int(doc.get("recipe", {}).get("prompt_length", Settings.prompt_length)), tests,
               list(doc.get("left_out", [])))

  def to_json(self) -> dict:
    cells = {f"{t}/{m}": {"scores": self.scores[(t, m)], "interval": self.interval(t, m).to_json(),
                          **({} if m == BASELINE else {
                              "difference_vs_pt": self.difference(t, m).to_json(),
                              "verdict_vs_pt": self.verdict(t, m)})}
             for t in self.targets for m in self.methods}
    claims, headline = claim_rows(self), headline_rows(self)
    return {"targets": self.targets, "methods": self.methods, "seeds": self.seeds,
            "chance": self.chance, "cells": cells,
            "sources": [{"task": s, "accuracy": a} for s, a in self.sources],
            "left_out": self.left_out,
            "retrieval": [self.choices[k] for k in sorted(self.choices)],
            "claims": [dict(zip(claims[0], row)) for row in claims[1:]],
            "headline": [dict(zip(headline[0], row)) for row in headline[1:]],
            "targets_mean": {f"{m}-{b}": {"difference": iv.to_json(),
                                          "verdict": verdicts_lib.verdict(iv, self.test(m, b))}
                             for m, b in self.pairs() for iv in [self.pooled_difference(m, b)]},
            "levels": {"per_target": self.level, "targets_mean": self.pooled_level,
                       "comparisons": self.comparisons},
            "job_seconds": self.seconds,
            **({"tests": [{"method": m, "baseline": b, **t.to_json()}
                          for (m, b), t in self.tests.items()]} if self.tests else {})}


def summarize(outcomes: Sequence[RunOutcome], targets: Sequence[str], methods: Sequence[str],
              seeds: Sequence[int], chance: Mapping[str, float], sources: Sequence[RunOutcome],
              choices: Mapping[tuple[str, int], dict], seconds: Mapping[str, Optional[float]],
              prompt_length: int = Settings.prompt_length, left_out: Sequence = (),
              tests: Optional[Mapping[tuple[str, str], verdicts_lib.Test]] = None) -> Summary:
  """Scores per (target, method) in seed order, from the runs' records; `tests`: the claims
  judged by a margin (default `claims.CLAIM_TESTS`)."""
  by_key = {(o.label, o.method, o.seed): accuracy(o) for o in outcomes}
  scores = {}
  for t in targets:
    for m in methods:
      missing = [s for s in seeds if (t, m, s) not in by_key]
      if missing:
        raise RuntimeError(f"no finished {m} run of {t} for seeds {missing}")
      scores[(t, m)] = [by_key[(t, m, s)] for s in seeds]
  tests = {pair: test for pair, test in (CLAIM_TESTS if tests is None else tests).items()
           if set(pair) <= set(methods)}
  return Summary(list(targets), list(methods), list(seeds), dict(chance), scores,
                 [(o.label, accuracy(o)) for o in sources], dict(choices), dict(seconds),
                 int(prompt_length), tests, left_out=list(left_out))


def pairs(methods: Sequence[str],
          tests: Optional[Mapping[tuple[str, str], verdicts_lib.Test]] = None
          ) -> list[tuple[str, str]]:
  """(method, baseline) of every comparison a table of `methods` reports: each method against
  Prompt Tuning, then each claim's other pairs (SPoT against SPoT unrelated, a successor against
  its method), then any other pair given a test."""
  found = [(m, BASELINE) for m in methods if m != BASELINE]
  found += [(m, b) for m, b, _, _ in PAIRED_CLAIMS
            if m in methods and b in methods and (m, b) not in found]
  return found + [(m, b) for m, b in (tests or {})
                  if m in methods and b in methods and (m, b) not in found]


# --- tables ---------------------------------------------------------------------------------------


def accuracy_rows(s: Summary) -> list[list[str]]:
  """Header + one row per target: chance, then mean ± 95% interval per method."""
  rows = [["target", "chance"] + [METHOD_NAMES[m] for m in s.methods]]
  for t in s.targets:
    rows.append([t, f"{s.chance[t]:.1f}"] + [s.interval(t, m).format() for m in s.methods])
  return rows


def verdict_rows(s: Summary) -> list[list[str]]:
  """Header + one row per target: each method's paired difference from Prompt Tuning, verdict."""
  others = [m for m in s.methods if m != BASELINE]
  named = lambda m: "" if s.test(m) == SUPERIORITY else f" ({s.test(m).label})"
  rows = [["target"] + [f"{METHOD_NAMES[m]} - PT{named(m)}" for m in others]]
  cell = lambda iv, m: f"{signed(iv)} {verdicts_lib.verdict(iv, s.test(m))}"
  for t in s.targets:
    rows.append([t] + [cell(s.difference(t, m), m) for m in others])
  if len(s.targets) > 1:
    rows.append([MEAN_ROW] + [cell(s.pooled_difference(m), m) for m in others])
  return rows


def source_rows(s: Summary) -> list[list[str]]:
  """Header + one row per target: the source retrieval chose for each seed (* = in RELATED)."""
  if not s.choices:
    return []
  rows = [["target"] + [f"seed {seed}" for seed in s.seeds] + ["related"]]
  for t in s.targets:
    picks = [s.choices[(t, seed)] for seed in s.seeds]
    rows.append([t] + [p["source"] + ("*" if p["related"] else "") for p in picks]
                + [f"{sum(p['related'] for p in picks)}/{len(picks)}"])
  return rows


def time_rows(s: Summary) -> list[list[str]]:
  """Header + one row per job this process trained: its wall time, and per run."""
  runs_per_job = len(s.targets) * len(s.seeds)
  rows = [["job", "runs", "wall s", "wall s per run"]]
  for job, seconds in s.seconds.items():
    if seconds is None:
      continue
    n = len(s.sources) if job == SOURCE else 1 if job == MPT_SOURCE else runs_per_job
    rows.append([JOB_NAMES.get(job, job), str(n), f"{seconds:.0f}", f"{seconds / max(n, 1):.1f}"])
  return rows if len(rows) > 1 else []


def verdict_heading(s: Summary) -> str:
  """What the verdict table's intervals are."""
  text = (f"Each method minus Prompt Tuning, paired by seed: mean ± simultaneous 95% interval over "
          f"the {s.comparisons} per-target comparisons (Bonferroni: each at "
          f"{100 * s.level:.2f}%), and the verdict")
  if len(s.targets) > 1:
    text += (f"; the last row averages each seed's differences over the targets (simultaneous over "
             f"its {len(s.pairs())} comparisons: each at {100 * s.pooled_level:.2f}%)")
  if s.tests:
    text += ("; a column naming a non-inferiority or equivalence test reads its interval against "
             "that margin (holds / does not hold)")
  return text


def markdown(rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
  lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
  return "\n".join(lines) + "\n"


def plain(rows: Sequence[Sequence[str]]) -> str:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# --- the chart and the files ----------------------------------------------------------------------


def bar_chart(s: Summary, path: pathlib.Path) -> None:
  """Grouped bars: mean accuracy per target and method, 95% interval error bars, chance."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  width = 0.8 / max(len(s.methods), 1)
  fig, ax = plt.subplots(figsize=(2.0 * len(s.targets) + 3.6, 4.4))
  for j, method in enumerate(s.methods):
    xs = [i + (j - (len(s.methods) - 1) / 2) * width for i in range(len(s.targets))]
    ivs = [s.interval(t, method) for t in s.targets]
    means = [iv.mean for iv in ivs]
    # The bar spans the interval, drawn inside the 0-100 scale an accuracy lives on.
    lows = [0.0 if not iv.resolved else m - max(iv.low, 0.0) for m, iv in zip(means, ivs)]
    highs = [0.0 if not iv.resolved else min(iv.high, 100.0) - m for m, iv in zip(means, ivs)]
    # More methods than the default colour cycle's 10 (--methods=all): tab20's distinct colours.
    color = plt.get_cmap("tab20")(j) if len(s.methods) > 10 else None
    ax.bar(xs, means, width, yerr=[lows, highs], capsize=3, label=METHOD_NAMES[method],
           color=color, error_kw={"elinewidth": 1.2})
  for i, target in enumerate(s.targets):
    ax.hlines(s.chance[target], i - 0.45, i + 0.45, colors="black", linestyles="dashed",
              label="chance" if i == 0 else None)
  ax.set_xticks(range(len(s.targets)), s.targets, fontsize=10)
  ax.set_ylabel("validation accuracy (%)", fontsize=10)
  ax.set_ylim(0, 102)
  ax.set_yticks(range(0, 101, 20))
  ax.grid(axis="y", alpha=0.3)
  ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
  ax.set_title(f"Mean of {len(s.seeds)} seeds with 95% intervals (toy T5)", fontsize=11)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write(output_dir: pathlib.Path, s: Summary, recipe: Mapping) -> list[pathlib.Path]:
  """results.json, results.md and results.png in `output_dir`; returns their paths."""
  paths = [output_dir / "results.json", output_dir / "results.md", output_dir / "results.png"]
  paths[0].write_text(json.dumps({"recipe": dict(recipe), **s.to_json()}, indent=1, sort_keys=True))
  seeds = ", ".join(str(x) for x in s.seeds)
  text = ["# spot-jax demo results", "",
          f"Validation accuracy (%) per target and method: mean ± 95% interval (Student t) over "
          f"seeds {seeds}; {recipe['target_steps']} target steps.", "", markdown(accuracy_rows(s))]
  if s.pairs():  # Prompt Tuning alone: nothing to compare
    text += [verdict_heading(s) + ":", "", markdown(verdict_rows(s))]
  if s.choices:
    text += ["The source retrieval chose for each SPoT run (* = in the suite's RELATED map, a "
             "check only):", "", markdown(source_rows(s))]
  if s.sources:
    text += ["Source prompts in the library:", "",
             markdown([["source", "accuracy"]] + [[t, f"{a:.1f}"] for t, a in s.sources])]
    if s.left_out:
      gone = (f"{x['task']} {x['accuracy']} (chance {x['chance']:.1f})" for x in s.left_out)
      text += [f"Left out of retrieval (accuracy not {source_library.MIN_GAIN:g} points above "
               f"the task's chance): {', '.join(gone)}.", ""]
  if len(headline_rows(s)) > 1:
    text += [HEADLINE_HEADING + ":", "", markdown(headline_rows(s))]
  text += ["Claims:", "", markdown(claim_rows(s))]
  if time_rows(s):
    text += ["Jobs trained by this process (every job's runs share one jitted step):", "",
             markdown(time_rows(s))]
  paths[1].write_text("\n".join(text))
  bar_chart(s, paths[2])
  return paths
