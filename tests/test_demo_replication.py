"""`python -m spot_jax.demo.replication`: pooled demo folders, disjoint seed subsets, verdict agreement.

The demo's results.json files here are written from hand-made scores (no training): the tool
only reads per-seed scores, so its rates can be checked against an independent enumeration.
"""
from __future__ import annotations

import itertools
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as scipy_stats

from spot_jax import cli
from spot_jax.demo import replication
from spot_jax.demo import results

REPO = pathlib.Path(__file__).resolve().parents[1]
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
  assert picked.seeds == [4, 1] and picked.scores[("a", "pt")] == [scores[("a", "pt")][i] for i in (4, 1)]


def test_agreement_rates_match_an_enumeration_of_every_split(tmp_path):
  # One pair (SPoT against PT) on two targets: the per-target family is 2 intervals (97.5% each),
  # the targets' mean one 95% interval. On "sum" seeds 0-2 differ by about +10 (resolved) and
  # seeds 3-5 scatter, so which seeds a table holds decides its verdicts there; on "x" SPoT is
  # 30 points better on every seed (resolved in every table).
  pt = {"sum": [50.0] * 6, "x": [40.0, 42.0, 44.0, 41.0, 43.0, 45.0]}
  spot = {"sum": [60.0, 60.2, 59.8, 60.0, 40.0, 50.5], "x": [70.1, 71.9, 74.0, 71.2, 72.8, 75.1]}
  scores = lambda i, j: {**{(t, "pt"): pt[t][i:j] for t in pt}, **{(t, "spot"): spot[t][i:j] for t in pt}}
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
  rep = replication.replicate(replication.pool([a, b]), draws=300)  # the demo's 5 seeds per table
  assert all(rep.better[("spot", "pt", t)] == 1.0 for t in ("x", "y", results.MEAN_ROW))
  assert rep.reversal == 0.0
  # As docs/embedded.md shows it (`python -m spot_jax.demo.replication a b`), fewer draws.
  assert cli.run(replication.main, [a, b, "--draws=300"], "spot_jax.demo.replication") == 0
  out = capsys.readouterr().out
  assert "pooled 10 seeds from 2 folder(s); 300 pairs of disjoint 5-seed tables, 6 comparisons each" in out
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
  assert len(err) == 1 and err[0].startswith("spot_jax.demo.replication: error: ") and fragment in err[0]
  assert sorted((p, p.read_bytes() if p.is_file() else b"") for p in tmp_path.rglob("*")) == before


def _json(path: pathlib.Path, doc) -> str:
  path.mkdir(parents=True)
  (path / "results.json").write_text(json.dumps(doc))
  return str(path)


def test_module_runs_as_a_program(tmp_path):
  a = _folder(tmp_path / "a", [0, 1, 2], {("sum", "pt"): [1.0, 2.0, 3.0], ("sum", "spot"): [4.0, 6.0, 5.0]})
  b = _folder(tmp_path / "b", [3, 4, 5], {("sum", "pt"): [1.5, 2.0, 2.5], ("sum", "spot"): [9.0, 3.0, 5.0]})
  done = subprocess.run([sys.executable, "-m", "spot_jax.demo.replication", a, b,
                         "--seeds_per_table=3", "--draws=50"], cwd=REPO, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert "pooled 6 seeds from 2 folder(s); 50 pairs of disjoint 3-seed tables, 1 comparison each" in done.stdout
