"""What the four papers claim, as the demo tests them: each claim's comparison, its test and
margin, and the claims table read off a `results.Summary`.

A claim that a method beats another is a superiority test (better / worse / not resolved, read as
holds / does not hold); a claim that a method matches another is a non-inferiority test at
`MARGIN` points, and the control (SPoT from an unrelated source) an equivalence test at the same
margin (`spot_jax.verdicts`: holds / does not hold / not resolved).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from spot_jax import power as power_lib
from spot_jax import stats
from spot_jax import verdicts as verdicts_lib

HOLDS, DOES_NOT_HOLD = verdicts_lib.HOLDS, verdicts_lib.DOES_NOT_HOLD
SUPERIORITY = verdicts_lib.Test()

CLAIM_COLUMNS = ("claim", "target", "measured", "seeds", "verdict")
PAIRED_CLAIMS = (
    ("spot", "pt", "SPoT beats Prompt Tuning on a related target (retrieved source)", "better"),
    ("spot_unrelated", "pt", "SPoT from an unrelated source neither helps nor hurts (control)",
     "not better"),
    ("spot", "spot_unrelated", "the retrieved source beats an unrelated one", "better"),
    ("smop", "pt", "SMoP 4x5 (5 prompt tokens per input) matches or beats {L}-token Prompt Tuning",
     "not worse"),
    ("residual", "pt", "Residual PT ends higher than Prompt Tuning at the same steps", "better"),
    # The successors (on request): each against the method it set out to improve.
    ("prefix", "pt", "Prefix tuning ({L} keys and values in every attention) beats {L}-token "
     "Prompt Tuning", "better"),
    ("ptuning_v2", "pt", "P-tuning v2 ({L} tokens in every encoder layer) beats {L}-token Prompt "
     "Tuning", "better"),
    ("dept", "pt", "DePT (10 tokens + rank-8 offsets{budget}) matches or beats "
     "{L}-token Prompt Tuning", "not worse"),
    ("residual_smop", "smop", "Residual SMoP beats SMoP 4x5", "better"),
    ("attempt", "spot", "ATTEMPT (an attentional mixture of the 8 sources) beats SPoT (one "
     "retrieved source)", "better"),
    ("attempt", "pt", "ATTEMPT beats Prompt Tuning", "better"),
    ("mpt", "spot", "MPT (a prompt distilled from the 8 sources) beats SPoT", "better"),
    ("mpt", "pt", "MPT beats Prompt Tuning", "better"),
    ("ulpt", "pt", "ULPT at r = 8 (a quarter of Prompt Tuning's parameters; the paper's tenth, "
     "r = 64 of 768, is out of reach at width 128) is non-inferior to {L}-token Prompt Tuning",
     "not worse"),
    ("pt_int8", "pt", "Prompt Tuning on the int8 backbone is non-inferior to it on float32",
     "not worse"),
)


# The smallest difference worth reporting on the targets' mean, in points: the margin of the
# claims that a method matches another, and the effect the power analysis plans superiority for.
MARGIN = 3.0
# The claims judged by a margin: SMoP 4x5 (half the prompt tokens per input) and ULPT (a quarter
# of the parameters) are not worse than Prompt Tuning; the control is equivalent to it. The
# others are superiority claims.
MARGIN_KINDS = {("smop", "pt"): verdicts_lib.NONINFERIORITY,
                ("spot_unrelated", "pt"): verdicts_lib.EQUIVALENCE,
                ("ulpt", "pt"): verdicts_lib.NONINFERIORITY,
                ("pt_int8", "pt"): verdicts_lib.NONINFERIORITY}


def claim_tests(margin: float = MARGIN) -> dict[tuple[str, str], verdicts_lib.Test]:
  """(method, baseline) -> the test of each claim judged by a margin (`margin` points)."""
  return {pair: verdicts_lib.Test(kind, margin) for pair, kind in MARGIN_KINDS.items()}


CLAIM_TESTS = claim_tests()


# The claims the default demo is for, in this order, then ULPT's when it is asked for
# (`--methods=...,ulpt`); the other rows of PAIRED_CLAIMS are in the claims table only.
HEADLINE_HEADING = "The papers' headline claims on the targets' mean"
HEADLINE = (("spot", "pt"), ("spot_unrelated", "pt"), ("residual", "pt"), ("smop", "pt"),
            ("ulpt", "pt"))


# The pilot: the SD (points) of one seed's paired difference on the targets' mean, per headline
# claim, over the default design's pool of 60 seeds (`python -m spot_jax.demo` with seeds 0-19,
# 20-39 and 40-59; docs/embedded.md, "Power"); ULPT's from `--methods=pt,ulpt` on the same seeds.
PILOT_SD = {("spot", "pt"): 5.79, ("spot_unrelated", "pt"): 7.06, ("residual", "pt"): 5.69,
            ("smop", "pt"): 6.71, ("ulpt", "pt"): 7.36}


@dataclasses.dataclass(frozen=True)
class Design:
  """The seeds each headline claim needs: at least `target` power for a `margin`-point effect
  (superiority), or for a true difference of 0 (non-inferiority and equivalence at `margin`), in a
  family of `comparisons` verdicts at 95% together, at the pilot's SDs."""
  margin: float = MARGIN
  target: float = power_lib.POWER
  comparisons: int = 5
  claims: tuple[tuple[str, str], ...] = HEADLINE  # the headline claims the table makes

  def plans(self) -> dict[tuple[str, str], power_lib.Plan]:
    tests = claim_tests(self.margin)
    out = {}
    for pair, sd in PILOT_SD.items():
      if pair not in self.claims:
        continue
      test = tests.get(pair, SUPERIORITY)
      difference = self.margin if test == SUPERIORITY else 0.0
      out[pair] = power_lib.plan(sd, difference, test, self.target, comparisons=self.comparisons)
    return out

  def seeds(self) -> int:
    """The seeds a table needs for every headline claim it makes to reach the target power (2
    when it makes none)."""
    return max([p.seeds for p in self.plans().values()], default=2)

  def shortfall(self, seeds: int) -> str | None:
    """One warning line naming the power `seeds` seeds reach on the claim that needs the most,
    or None when they are enough."""
    plans = self.plans()
    if not plans:
      return None
    worst = max(plans, key=lambda pair: plans[pair].seeds)
    return power_lib.shortfall_warning(plans[worst], seeds)


def power_rows(design: Design, seeds: int,
               names: Mapping[str, str]) -> list[list[str]]:
  """Header + one row per headline claim: its test, the pilot's SD, the seeds it needs and the
  power `seeds` seeds give."""
  rows = [["comparison", "test", "pilot SD", "seeds needed", f"power at {seeds} seeds"]]
  for (method, base), p in design.plans().items():
    rows.append([f"{names[method]} - {names[base]}",
                 p.test.label if p.test != SUPERIORITY else f"superiority at +{p.difference:g}",
                 f"{p.sd:.2f}", str(p.seeds),
                 f"{100 * (p.power_at(seeds) if seeds >= 2 else 0.0):.0f}%"])
  return rows


def claim_verdict(verdict: str, wanted: str) -> str:
  """A paired verdict read against what the claim predicts."""
  if wanted == "better":
    return {stats.BETTER: HOLDS, stats.WORSE: DOES_NOT_HOLD}.get(verdict, stats.UNRESOLVED)
  if wanted == "not better":  # only a resolved loss shows it; a resolved win refutes it
    return {stats.WORSE: HOLDS, stats.BETTER: DOES_NOT_HOLD}.get(verdict, stats.UNRESOLVED)
  # "not worse": a resolved win shows it; a resolved loss refutes it; a tie is not an equivalence
  return {stats.BETTER: HOLDS, stats.WORSE: DOES_NOT_HOLD}.get(verdict, stats.UNRESOLVED)


def _claim_text(text: str, prompt_length: int) -> str:
  """A claim's words for the recipe's prompt length (DePT's budget matches 20 tokens only)."""
  return text.format(L=prompt_length,
                     budget=", about the same parameters" if prompt_length == 20 else "")


def claim_rows(s) -> list[list[str]]:
  """Header + one row per (claim, target) the demo measures, and retrieval's ranking claim;
  with `s.tests`, a last column names each row's test."""
  rows = [list(CLAIM_COLUMNS) + (["test"] if s.tests else [])]
  for method, base, text, wanted in PAIRED_CLAIMS:
    if method in s.methods and base in s.methods:
      rows += [_paired_row(s, method, base, text, wanted, t, diff, with_test=bool(s.tests))
               for t, diff in s.differences(method, base)]
  if s.choices:
    rows.append(_retrieval_row(s))
  rows.append(["retrieval keeps most of the oracle's gain", "-", "see docs/spot.md (the study)",
               "-", "-"])
  return [r + ["-"] * (len(rows[0]) - len(r)) for r in rows]


def headline_rows(s) -> list[list[str]]:
  """Header + the four papers' headline claims on the targets' mean (on the one target when
  there is one) with their tests, and retrieval's ranking claim: what the demo is for."""
  rows = [list(CLAIM_COLUMNS) + ["test"]]
  for method, base, text, wanted in PAIRED_CLAIMS:
    if (method, base) in HEADLINE and method in s.methods and base in s.methods:
      t, diff = s.differences(method, base)[-1]
      rows.append(_paired_row(s, method, base, text, wanted, t, diff, with_test=True))
  if s.choices:
    rows.append(_retrieval_row(s) + ["share above chance"])
  return rows


def _paired_row(s, method: str, base: str, text: str, wanted: str, target: str,
                diff: stats.Interval, with_test: bool) -> list[str]:
  test = s.test(method, base)
  verdict = verdicts_lib.verdict(diff, test)
  return ([_claim_text(text, s.prompt_length), target, f"{signed(diff)} points", str(len(s.seeds)),
           claim_verdict(verdict, wanted) if test == SUPERIORITY else verdict]
          + ([test.label] if with_test else []))


def _retrieval_row(s) -> list[str]:
  """Task embeddings rank a related source first more often than a random pick would."""
  from tasks import embedded as suite  # pylint: disable=g-import-not-at-top
  hits = np.array([1.0 if c["related"] else 0.0 for c in s.choices.values()])
  chance = float(np.mean([sum(r[0] in suite.RELATED[c["target"]] for r in c["ranking"])
                          / len(c["ranking"]) for c in s.choices.values()]))
  share = stats.interval(100 * hits)
  verdict = (HOLDS if share.resolved and share.low > 100 * chance else
             DOES_NOT_HOLD if share.resolved and share.high < 100 * chance else stats.UNRESOLVED)
  return ["task embeddings rank a related source first (top-1 of the library)", "all",
          f"{share.format()}% of {len(hits)} target runs (chance {100 * chance:.0f}%)",
          str(len(s.seeds)), verdict]


def signed(iv: stats.Interval) -> str:
  """The interval as +m ± h (or -m ± h)."""
  text = iv.format()
  return text if text.startswith("-") or text == "n/a" else "+" + text
