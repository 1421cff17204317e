"""`python -m spot_jax.demo.replication`: pooled demo folders, disjoint seed subsets,
verdict agreement.

The demo's results.json files here are written from hand-made scores (no training): the tool
only reads per-seed scores, so its rates can be checked against an independent enumeration.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as scipy_stats

from spot_jax import cli
from spot_jax.demo import claims as claims_lib
from spot_jax.demo import replication
from spot_jax.demo import results
from tests.helpers import REPO

RECIPE = {"target_steps": 40, "source_steps": 80}


def _folder(path: pathlib.Path, seeds, scores, methods=("pt", "spot"), targets=("sum",),
            recipe=RECIPE) -> str:
  """A demo folder whose results.json holds `scores[(target, method)]` (one value per seed)."""
  summary = results.Summary(list(targets), list(methods), list(seeds),
                            {t: 10.0 for t in targets}, scores, [], {}, {})
  path.mkdir(parents=True)
  (path / "results.json").write_text(json.dumps({"recipe": recipe, **summary.to_json()}))
  return str(path)


def _split(values, at):
  return values[:at], values[at:]


def test_results_json_reads_back_with_the_same_verdicts(tmp_path):
  rng = np.random.default_rng(0)
  scores = {(t, m): list(np.round(rng.uniform(20, 90, 6), 1))
            for t in ("a", "b") for m in ("pt", "spot", "smop")}
  scores[("a", "spot")] = [x + 20.0 for x in scores[("a", "pt")]]
  summary = results.Summary(["a", "b"], ["pt", "spot", "smop"], list(range(6)),
                            {"a": 50.0, "b": 10.0}, scores, [], {}, {})
  back = results.Summary.from_json(json.loads(json.dumps(summary.to_json())))
  assert back.scores == summary.scores and back.seeds == summary.seeds
  assert back.verdicts() == summary.verdicts()
  # 2 pairs (SPoT and SMoP against PT) x 2 targets, then the targets' mean of each pair.
  assert list(summary.verdicts()) == [("spot", "pt", "a"), ("spot", "pt", "b"), ("smop", "pt", "a"),
                                      ("smop", "pt", "b"), ("spot", "pt", results.MEAN_ROW),
                                      ("smop", "pt", results.MEAN_ROW)]
  assert summary.verdicts()[("spot", "pt", "a")] == "better"
  picked = summary.select([4, 1])
  assert (picked.seeds == [4, 1]
          and picked.scores[("a", "pt")] == [scores[("a", "pt")][i] for i in (4, 1)])


def test_agreement_rates_match_an_enumeration_of_every_split(tmp_path):
  # One pair (SPoT against PT) on two targets: the per-target family is 2 intervals (97.5% each),
  # the targets' mean one 95% interval. On "sum" seeds 0-2 differ by about +10 (resolved) and
  # seeds 3-5 scatter, so which seeds a table holds decides its verdicts there; on "x" SPoT is
  # 30 points better on every seed (resolved in every table).
  pt = {"sum": [50.0] * 6, "x": [40.0, 42.0, 44.0, 41.0, 43.0, 45.0]}
  spot = {"sum": [60.0, 60.2, 59.8, 60.0, 40.0, 50.5], "x": [70.1, 71.9, 74.0, 71.2, 72.8, 75.1]}
  scores = lambda i, j: {**{(t, "pt"): pt[t][i:j] for t in pt},
                         **{(t, "spot"): spot[t][i:j] for t in pt}}
  a = _folder(tmp_path / "a", [0, 1, 2], scores(0, 3), targets=("sum", "x"))
  b = _folder(tmp_path / "b", [3, 4, 5], scores(3, 6), targets=("sum", "x"))
  pooled = replication.pool([a, b])
  assert pooled.seeds == [0, 1, 2, 3, 4, 5]
  rep = replication.replicate(pooled, table_seeds=3, draws=4000, seed=1)
  diff = {t: np.subtract(spot[t], pt[t]) for t in pt}
  diff["mean"] = (diff["sum"] + diff["x"]) / 2

  def verdicts(idx):
    out = []
    for key, level in (("sum", 0.975), ("x", 0.975), ("mean", 0.95)):
      d = diff[key][list(idx)]
      half = scipy_stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
      out.append(bool(d.mean() - half > 0))
    return out

  # A pool of twice the table's size splits into complementary halves: every split equally likely.
  splits = [(s, tuple(sorted(set(range(6)) - set(s)))) for s in itertools.combinations(range(6), 3)]
  same = np.mean([verdicts(x) == verdicts(y) for x, y in splits])
  share = np.mean([verdicts(x) for x, _ in splits], axis=0)
  assert 0 < same < 1 and 0 < share[0] < 1 and share[1] == 1
  assert rep.identical == pytest.approx(same, abs=0.04)
  for key, expected in zip(("sum", "x", results.MEAN_ROW), share):
    assert rep.better[("spot", "pt", key)] == pytest.approx(expected, abs=0.04)
    assert rep.worse[("spot", "pt", key)] == 0.0
  assert rep.reversal == 0.0
  assert rep.resolved_per_table == pytest.approx(share.sum(), abs=0.08)


def test_a_large_effect_replicates_and_the_command_prints_its_rates(tmp_path, capsys):
  rng = np.random.default_rng(3)
  scores = {}
  for t in ("x", "y"):
    base = rng.uniform(30, 60, 10)
    scores[(t, "pt")] = list(base)
    scores[(t, "spot")] = list(base + 30 + rng.normal(0, 0.5, 10))  # resolved in every table
    scores[(t, "smop")] = list(base + rng.normal(0, 8.0, 10))  # no effect
  halves = [{k: _split(v, 5)[i] for k, v in scores.items()} for i in (0, 1)]
  kw = dict(methods=("pt", "spot", "smop"), targets=("x", "y"))
  a = _folder(tmp_path / "a", range(5), halves[0], **kw)
  b = _folder(tmp_path / "b", range(5, 10), halves[1], **kw)
  rep = replication.replicate(replication.pool([a, b]), table_seeds=5, draws=300)
  assert all(rep.better[("spot", "pt", t)] == 1.0 for t in ("x", "y", results.MEAN_ROW))
  assert rep.reversal == 0.0
  # As docs/embedded.md shows it (`python -m spot_jax.demo.replication a b`), fewer draws.
  assert cli.run(replication.main, [a, b, "--draws=300", "--seeds_per_table=5"],
                 "spot_jax.demo.replication") == 0
  out = capsys.readouterr().out
  assert ("pooled 10 seeds from 2 folder(s); 300 pairs of disjoint 5-seed tables, 6 "
          "comparisons each" in out)
  assert f"the same verdict on all 6 comparisons: {100 * rep.identical:.1f}% of pairs" in out
  assert "SPoT - Prompt Tuning      mean of targets" in out


@pytest.mark.parametrize("case", ["no results", "not a demo's", "shared seeds", "other methods",
                                  "other recipe", "pool too small", "one seed per table",
                                  "no draws", "prompt tuning alone"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, case):
  two = {("sum", "pt"): [1.0, 2.0], ("sum", "spot"): [3.0, 4.0]}
  a = _folder(tmp_path / "a", [0, 1], two)
  b = lambda seeds, scores=two, **kw: _folder(tmp_path / "b", seeds, scores, **kw)
  cases = {
      "no results": lambda: ([a, str(tmp_path / "empty")], "has no results.json"),
      "not a demo's": lambda: ([a, _json(tmp_path / "study", {"rows": []})],
                               "is not the results.json of a"),
      "shared seeds": lambda: ([a, b([1, 2])], "repeats seeds [1]"),
      "other methods": lambda: ([a, b([2, 3], {("sum", "pt"): [1.0, 2.0]}, methods=("pt",))],
                                "ran methods ['pt']"),
      "other recipe": lambda: ([a, b([2, 3], recipe={"target_steps": 60})], "ran another recipe"),
      "pool too small": lambda: ([a, "--seeds_per_table=2"], "needs a pool of at least 4 seeds"),
      "one seed per table": lambda: ([a, "--seeds_per_table=1"], "at least 2 seeds"),
      "no draws": lambda: ([a, b([2, 3]), "--seeds_per_table=2", "--draws=0"],
                           "--draws=0 must be a positive integer"),
      "prompt tuning alone": lambda: (
          [_folder(tmp_path / "c", [0, 1, 2, 3], {("sum", "pt"): [1.0] * 4}, methods=("pt",)),
           "--seeds_per_table=2"], "no comparison to replicate"),
  }
  args, fragment = cases[case]()
  (tmp_path / "empty").mkdir(exist_ok=True)
  before = sorted((p, p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*"))
  assert cli.run(replication.main, args, "spot_jax.demo.replication") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert (len(err) == 1 and err[0].startswith("spot_jax.demo.replication: error: ")
          and fragment in err[0])
  assert sorted((p, p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*")) == before


def _json(path: pathlib.Path, doc) -> str:
  path.mkdir(parents=True)
  (path / "results.json").write_text(json.dumps(doc))
  return str(path)


def test_module_runs_as_a_program(tmp_path):
  a = _folder(tmp_path / "a", [0, 1, 2],
              {("sum", "pt"): [1.0, 2.0, 3.0], ("sum", "spot"): [4.0, 6.0, 5.0]})
  b = _folder(tmp_path / "b", [3, 4, 5],
              {("sum", "pt"): [1.5, 2.0, 2.5], ("sum", "spot"): [9.0, 3.0, 5.0]})
  done = subprocess.run([sys.executable, "-m", "spot_jax.demo.replication", a, b,
                         "--seeds_per_table=3", "--draws=50"], cwd=REPO, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert ("pooled 6 seeds from 2 folder(s); 50 pairs of disjoint 3-seed tables, 1 comparison each"
          in done.stdout)


def test_summary_judges_each_comparison_by_its_test_and_names_it():
  from spot_jax import verdicts  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  pt = list(rng.uniform(40, 60, 8))
  scores = {("a", "pt"): pt, ("a", "spot"): [x + 10 + rng.normal(0, 0.5) for x in pt],
            ("a", "smop"): [x + rng.normal(0, 0.5) for x in pt],
            ("a", "spot_unrelated"): [x + rng.normal(0, 0.5) for x in pt]}
  methods = ["pt", "spot", "smop", "spot_unrelated"]
  plain = results.Summary(["a"], methods, list(range(8)), {"a": 10.0}, scores, [], {}, {})
  tests = {("smop", "pt"): verdicts.Test(verdicts.NONINFERIORITY, 2.0),
           ("spot_unrelated", "pt"): verdicts.Test(verdicts.EQUIVALENCE, 2.0)}
  judged = dataclasses.replace(plain, tests=tests)
  # Superiority cannot show a match: the same differences are "not resolved" there.
  assert plain.verdicts()[("smop", "pt", "a")] == "not resolved"
  assert judged.verdicts()[("smop", "pt", "a")] == "holds"
  assert judged.verdicts()[("spot_unrelated", "pt", "a")] == "holds"
  assert judged.verdicts()[("spot", "pt", "a")] == plain.verdicts()[("spot", "pt", "a")] == "better"
  # Rows name the test and margin; without tests the tables are as they were.
  assert results.verdict_rows(judged)[0][2] == "SMoP 4x5 - PT (non-inferiority, margin 2 points)"
  assert results.verdict_rows(plain)[0] == ["target", "SPoT - PT", "SMoP 4x5 - PT",
                                            "SPoT unrelated - PT"]
  claims = results.claim_rows(judged)
  assert claims[0] == list(claims_lib.CLAIM_COLUMNS) + ["test"]
  smop_row = next(r for r in claims if r[0].startswith("SMoP"))
  assert smop_row[4:] == ["holds", "non-inferiority, margin 2 points"]
  assert results.claim_rows(plain)[0] == list(claims_lib.CLAIM_COLUMNS)
  back = results.Summary.from_json(json.loads(json.dumps(judged.to_json())))
  assert back.tests == tests and back.verdicts() == judged.verdicts()
  assert "tests" not in plain.to_json()


def test_replication_rates_of_non_inferiority_match_an_enumeration(tmp_path):
  from spot_jax import verdicts  # pylint: disable=g-import-not-at-top
  # SMoP against PT at margin 2: seeds 0-2 differ by about 0, seeds 3-5 scatter, so a 3-seed
  # table's non-inferiority verdict depends on its seeds.
  pt = [50.0, 52.0, 48.0, 51.0, 49.0, 50.0]
  smop = [50.2, 51.9, 48.1, 47.0, 52.0, 46.5]
  scores = lambda i, j: {("sum", "pt"): pt[i:j], ("sum", "smop"): smop[i:j]}
  kw = dict(methods=("pt", "smop"))
  a = _folder(tmp_path / "a", [0, 1, 2], scores(0, 3), **kw)
  b = _folder(tmp_path / "b", [3, 4, 5], scores(3, 6), **kw)
  pooled = dataclasses.replace(
      replication.pool([a, b]), tests={("smop", "pt"): verdicts.Test(verdicts.NONINFERIORITY, 2.0)})
  rep = replication.replicate(pooled, table_seeds=3, draws=4000, seed=2)
  diff = np.subtract(smop, pt)

  def verdict(idx):  # one comparison: a 95% interval; holds above -2, does not hold below
    d = diff[list(idx)]
    half = scipy_stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    return 1 if d.mean() - half > -2 else -1 if d.mean() + half < -2 else 0

  splits = [(s, tuple(sorted(set(range(6)) - set(s)))) for s in itertools.combinations(range(6), 3)]
  same = np.mean([verdict(x) == verdict(y) for x, y in splits])
  holds = np.mean([verdict(x) == 1 for x, _ in splits])
  assert 0 < same < 1 and 0 < holds < 1
  key = ("smop", "pt", "sum")
  assert rep.same[key] == pytest.approx(same, abs=0.04) and rep.identical == rep.same[key]
  assert rep.better[key] == pytest.approx(holds, abs=0.04)


def test_the_command_judges_comparisons_by_the_tests_given(tmp_path, capsys):
  rng = np.random.default_rng(4)
  base = rng.uniform(40, 60, 10)
  scores = {("x", "pt"): list(base), ("x", "smop"): list(base + rng.normal(0, 0.3, 10))}
  halves = [{k: _split(v, 5)[i] for k, v in scores.items()} for i in (0, 1)]
  kw = dict(methods=("pt", "smop"), targets=("x",))
  a = _folder(tmp_path / "a", range(5), halves[0], **kw)
  b = _folder(tmp_path / "b", range(5, 10), halves[1], **kw)
  assert cli.run(replication.main, [a, b, "--draws=200", "--test=smop=non-inferiority:3",
                                    "--seeds_per_table=5"], "spot_jax.demo.replication") == 0
  out = capsys.readouterr().out
  assert "better / holds" in out and "same verdict" in out
  # Within 0.3 points of PT on every seed: non-inferiority at 3 points holds in every table.
  assert re.split(r"\s{2,}", out.strip().splitlines()[-1]) == [
      "SMoP 4x5 - Prompt Tuning", "x", "non-inferiority, margin 3 points", "+0.0", "100%", "0%",
      "100%"]


@pytest.mark.parametrize("flag, fragment", [
    ("--test=smop=non-inferiority:0", "--test='smop=non-inferiority:0': non-inferiority margin=0.0 "
                                      "must be a number of points > 0"),
    ("--test=smop=equivalence:-1", "equivalence margin=-1.0 must be a number of points > 0"),
    ("--test=smop=equivalence", "names no margin"),
    ("--test=prefix=equivalence:2", "with methods the folders ran (pt, smop)"),
    ("--test=smop=better:2", "test='better' is unknown"),
])
def test_a_bad_test_is_one_line_and_writes_nothing(tmp_path, capsys, flag, fragment):
  two = {("sum", "pt"): [1.0, 2.0], ("sum", "smop"): [3.0, 4.0]}
  a = _folder(tmp_path / "a", [0, 1], two, methods=("pt", "smop"))
  b = _folder(tmp_path / "b", [2, 3], two, methods=("pt", "smop"))
  before = sorted((p, p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*"))
  assert cli.run(replication.main, [a, b, "--seeds_per_table=2", flag],
                 "spot_jax.demo.replication") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and fragment in err[0], err
  assert sorted((p, p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*")) == before
