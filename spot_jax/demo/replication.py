r"""`python -m spot_jax.demo.replication`: would another seed set give the same verdicts?

Pools the per-seed scores of demo folders (the results.json of `python -m spot_jax.demo` runs
with the same recipe, targets and methods, and disjoint seeds), then draws pairs of disjoint seed
subsets of one table's size from the pool and computes both subsets' verdicts exactly as the demo
does (`spot_jax.demo.results.Summary.verdicts`: the per-target family and the targets'-mean
family, simultaneous 95% intervals, each comparison judged by its test). It prints how often the
two tables of a pair give the same verdict on every comparison, how often one says "better" where
the other says "worse" (or "holds" where the other says "does not hold": a reversal), and, per
comparison, the pool's mean difference, the share of tables giving each verdict and the
replication rate: the probability that a disjoint seed set of the same size gives the same
verdict.

  python -m spot_jax.demo --output_dir=a                   # seeds 0-19
  python -m spot_jax.demo --seed_offset=20 --output_dir=b  # seeds 20-39
  python -m spot_jax.demo --seed_offset=40 --output_dir=c  # seeds 40-59
  python -m spot_jax.demo.replication a b c                # tables of 20 seeds, as the demo's
  python -m spot_jax.demo.replication a b c --test=smop=equivalence:5   # judge one otherwise

The pool is finite: subsets of 20 seeds are not independent samples of every seed, so the rates
are estimates, and a pool of exactly twice the table's size only ever splits into halves. Each
folder's SPoT runs used that folder's source library; pooling folders mixes their libraries, as
two demos with different seed sets do. Nothing is written.
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Sequence

import numpy as np

from spot_jax import cli
from spot_jax import fileio
from spot_jax import verdicts as verdicts_lib
from spot_jax import validate
from spot_jax.demo import results as results_lib
from spot_jax.demo.methods import DEFAULT_SEEDS, METHOD_NAMES
from spot_jax.errors import ConfigError

DEFAULT_TABLE_SEEDS = DEFAULT_SEEDS  # the demo's table
DEFAULT_DRAWS = 2000


@dataclasses.dataclass(frozen=True)
class Replication:
  """How often two disjoint seed subsets of one pool agree.

  Attributes:
    table_seeds: seeds per table.
    draws: pairs of tables drawn.
    identical: share of pairs whose tables give the same verdict on every comparison.
    reversal: share of pairs where some comparison is "better" ("holds") in one table, "worse"
      ("does not hold") in the other.
    resolved_per_table: mean number of resolved comparisons in a table.
    none_resolved: share of tables that resolve no comparison.
    better, worse: comparison -> share of tables saying "better" or "holds", "worse" or "does not
      hold".
    same: comparison -> share of pairs whose two tables give it the same verdict.
  """
  table_seeds: int
  draws: int
  identical: float
  reversal: float
  resolved_per_table: float
  none_resolved: float
  better: dict
  worse: dict
  same: dict


def load(folder: str) -> tuple[results_lib.Summary, dict]:
  """The Summary and recipe of a demo folder's results.json (one-line errors naming what is
  wrong)."""
  path = pathlib.Path(folder) / "results.json"
  if not path.is_file():
    raise ConfigError(f"{folder!r} has no results.json; give folders where `python -m "
                      f"spot_jax.demo` wrote its results (its --output_dir)")
  doc = fileio.read_json(path, "the demo's results")
  try:
    summary = results_lib.Summary.from_json(doc)
  except (KeyError, TypeError, ValueError, AttributeError):
    raise ConfigError(f"{str(path)!r} is not the results.json of a `python -m spot_jax.demo` run "
                      f"(it lacks the per-seed scores of every target and method)") from None
  return summary, doc.get("recipe", {})


def pool(folders: Sequence[str]) -> results_lib.Summary:
  """One Summary of every folder's seeds: same targets, methods and recipe, disjoint seeds."""
  if not folders:
    raise ConfigError("give at least one demo folder, e.g. spot_jax.demo.replication a b")
  loaded = [load(f) for f in folders]
  summaries = [s for s, _ in loaded]
  first, recipe = loaded[0]
  for folder, (s, other) in zip(folders[1:], loaded[1:]):
    for what in ("targets", "methods"):
      if getattr(s, what) != getattr(first, what):
        raise ConfigError(f"{folder!r} ran {what} {getattr(s, what)}, {folders[0]!r} ran "
                          f"{getattr(first, what)}; pool folders of the same demo command")
    if s.tests != first.tests:
      raise ConfigError(f"{folder!r} judged its comparisons by other tests than {folders[0]!r}; "
                        f"pool folders of the same demo command, or set them with --test")
    if other != recipe:
      raise ConfigError(f"{folder!r} ran another recipe than {folders[0]!r} (steps, lengths or "
                        f"rates differ); pool folders of the same demo command")
  seeds: list[int] = []
  for folder, s in zip(folders, summaries):
    shared = sorted(set(seeds) & set(s.seeds))
    if shared:
      raise ConfigError(f"{folder!r} repeats seeds {shared} of an earlier folder; pooled seeds "
                        f"must be distinct")
    seeds += s.seeds
  scores = {k: [x for s in summaries for x in s.scores[k]] for k in first.scores}
  return dataclasses.replace(first, seeds=seeds, scores=scores, choices={}, seconds={})


def replicate(pooled: results_lib.Summary, table_seeds: int = DEFAULT_TABLE_SEEDS,
              draws: int = DEFAULT_DRAWS, seed: int = 0) -> Replication:
  """Draws `draws` pairs of disjoint `table_seeds`-seed subsets and compares their verdicts."""
  if table_seeds < 2:
    raise ConfigError(f"--seeds_per_table={table_seeds}: a table needs at least 2 seeds for an "
                      f"interval")
  if 2 * table_seeds > len(pooled.seeds):
    raise ConfigError(f"--seeds_per_table={table_seeds} needs a pool of at least "
                      f"{2 * table_seeds} seeds for two disjoint tables; the folders hold "
                      f"{len(pooled.seeds)}")
  validate.positive_int(draws, "--draws", example=DEFAULT_DRAWS)
  if not pooled.pairs():
    raise ConfigError("the folders ran Prompt Tuning alone: there is no comparison to replicate")
  rng = np.random.default_rng(seed)
  keys = list(pooled.verdicts())
  code = verdicts_lib.CODES
  tables = []
  for _ in range(draws):
    order = rng.permutation(len(pooled.seeds))
    for part in (order[:table_seeds], order[table_seeds:2 * table_seeds]):
      verdicts = pooled.select([pooled.seeds[i] for i in part]).verdicts()
      tables.append([code[verdicts[k]] for k in keys])
  v = np.asarray(tables).reshape(draws, 2, len(keys))
  resolved = np.abs(v).sum(-1)
  return Replication(
      table_seeds, draws, identical=float(np.mean(np.all(v[:, 0] == v[:, 1], -1))),
      reversal=float(np.mean(np.any(v[:, 0] * v[:, 1] < 0, -1))),
      resolved_per_table=float(resolved.mean()), none_resolved=float(np.mean(resolved == 0)),
      better=dict(zip(keys, np.mean(v == 1, (0, 1)).tolist())),
      worse=dict(zip(keys, np.mean(v == -1, (0, 1)).tolist())),
      same=dict(zip(keys, np.mean(v[:, 0] == v[:, 1], 0).tolist())))


def comparison_rows(pooled: results_lib.Summary, rep: Replication) -> list[list[str]]:
  """Header + one row per comparison: the pool's mean difference, the shares of verdicts."""
  named = bool(pooled.tests)
  yes, no = ("better / holds", "worse / does not hold") if named else ("better", "worse")
  rows = [["comparison", "target"] + (["test"] if named else []) +
          [f"pool mean ({len(pooled.seeds)} seeds)", yes, no, "same verdict"]]
  means = {(m, b, t): iv.mean for m, b in pooled.pairs() for t, iv in pooled.differences(m, b)}
  for key, better in rep.better.items():
    m, b, t = key
    rows.append([f"{METHOD_NAMES[m]} - {METHOD_NAMES[b]}", t]
                + ([pooled.test(m, b).label] if named else [])
                + [f"{means[key]:+.1f}", f"{100 * better:.0f}%", f"{100 * rep.worse[key]:.0f}%",
                   f"{100 * rep.same[key]:.0f}%"])
  return rows


def parse_tests(texts: Sequence[str], pooled: results_lib.Summary) -> dict:
  """--test values 'METHOD[/BASELINE]=KIND[:MARGIN]' as (method, baseline) -> Test."""
  tests = {}
  for text in texts:
    pair, sep, kind = text.partition("=")
    method, _, baseline = pair.partition("/")
    baseline = baseline or results_lib.BASELINE
    if not sep or method not in pooled.methods or baseline not in pooled.methods:
      raise ConfigError(f"--test={text!r} must be METHOD[/BASELINE]=KIND[:MARGIN] with methods "
                        f"the folders ran ({', '.join(pooled.methods)}), e.g. "
                        f"--test=smop=non-inferiority:3")
    if method == baseline:
      raise ConfigError(f"--test={text!r} compares {method} with itself; name two methods")
    try:
      tests[(method, baseline)] = verdicts_lib.Test.parse(kind)
    except ConfigError as err:
      raise ConfigError(f"--test={text!r}: {err}") from None
  return tests


def _parser() -> cli.ArgumentParser:
  p = cli.ArgumentParser(prog="spot_jax.demo.replication", description=__doc__.splitlines()[0])
  p.add_argument("folders", nargs="+", help="demo output folders (their results.json) to pool")
  p.add_argument("--seeds_per_table", type=int, default=DEFAULT_TABLE_SEEDS,
                 help=f"seeds in each table (default {DEFAULT_TABLE_SEEDS}, the demo's)")
  p.add_argument("--draws", type=int, default=DEFAULT_DRAWS,
                 help=f"pairs of tables drawn (default {DEFAULT_DRAWS})")
  p.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
  p.add_argument("--test", action="append", default=[], metavar="METHOD=TEST",
                 help="judge a comparison by another test, e.g. smop=non-inferiority:3 or "
                      "spot_unrelated=equivalence:3 (baseline: pt; default: the folders' tests)")
  return p


def main(argv: Sequence[str]) -> int:
  args = _parser().parse_args(argv)
  pooled = pool(args.folders)
  if args.test:
    pooled = dataclasses.replace(pooled, tests={**pooled.tests, **parse_tests(args.test, pooled)})
  rep = replicate(pooled, args.seeds_per_table, args.draws, args.seed)
  n = len(rep.better)
  print(f"pooled {len(pooled.seeds)} seeds from {len(args.folders)} folder(s); {rep.draws} pairs "
        f"of disjoint {rep.table_seeds}-seed tables, {n} comparison{'s' if n > 1 else ''} each "
        f"(the demo's families)")
  print(f"  the same verdict on all {n} comparisons: {100 * rep.identical:.1f}% of pairs")
  print("  a reversal (better in one table, worse in the other): "
        f"{100 * rep.reversal:.1f}% of pairs")
  print(f"  resolved comparisons per table: {rep.resolved_per_table:.2f} on average; none "
        f"resolved in {100 * rep.none_resolved:.0f}% of tables")
  print("\nshare of tables giving each verdict, and how often a disjoint seed set of the same "
        "size gives the same one:")
  print(results_lib.plain(comparison_rows(pooled, rep)))
  return 0


if __name__ == "__main__":
  sys.exit(cli.run(main, sys.argv[1:], "spot_jax.demo.replication", keep_heap=False))
