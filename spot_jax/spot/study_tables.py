"""A study's results: one row per finished target run, and the seeded aggregates behind the report.

Rows (results.csv / results.json) are read from the run records; the aggregates carry intervals
over seeds (`spot_jax.stats`):

  transfer_gains   per (target, source): relative error reduction against the same seed's
                   baseline, mean over seeds with a Student-t interval, the paired difference in
                   points and its verdict (better / worse / not resolved)
  correlations     Pearson and Spearman of similarity vs relative error reduction over the
                   seed-averaged (target, source) points, per target and pooled, with a bootstrap
                   interval over points (fewer than 5 points: the coefficient and why no interval)
  retrieval_table  the paper's Table 3: each method's mean score (t interval over seeds of the
                   mean over targets) and share of the oracle's gain kept (bootstrap interval
                   over (target, seed) cases)
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import pathlib
from typing import Optional, Sequence

import numpy as np

from spot_jax import fileio
from spot_jax import stats
from spot_jax.spot import study as grid_lib
from spot_jax.spot import similarity
from spot_jax.spot.settings import RunSettings

COLUMNS = ("target", "seed", "init", "score", "baseline_score", "relative_error_reduction",
           "similarity_average", "similarity_per_token", "retrieved")
# Target-side kinds whose runs become rows, and the row's "init" for each.
_ROW_KINDS = (("generic", "generic"), ("weighted_average", "weighted_average"),
              ("mixture", "mixture"))
# A bootstrap over fewer (target, seed) cases has too few distinct resamples to mean anything.
MIN_CASES = 5


def relative_error_reduction(score: float, baseline: float, metric_max: float) -> Optional[float]:
  """(err_baseline - err) / err_baseline with err = metric_max - score; None if err_baseline = 0."""
  base_error = metric_max - baseline
  if base_error <= 0:
    return None
  return (base_error - (metric_max - score)) / base_error


def collect(settings: RunSettings, study_dir: pathlib.Path, grid: grid_lib.Grid) -> list[dict]:
  """One row per finished target run (baseline, each source, generic, retrieval runs)."""
  layout = grid_lib.Layout(settings)
  sources = {s: grid_lib.read(study_dir, layout, grid_lib.Cell("source", s, grid.source_seed))
             for s in grid.sources}
  rows = []
  for target in grid.targets:
    for seed in grid.seeds:
      base = grid_lib.read(study_dir, layout, grid_lib.Cell("baseline", target, seed))
      if base is None:
        continue
      embedding = base.embedding()
      inits = [("baseline", grid_lib.Cell("baseline", target, seed))]
      inits += [(s, grid_lib.Cell("transfer", target, seed, s)) for s in grid.sources]
      inits += [(init, grid_lib.Cell(kind, target, seed)) for kind, init in _ROW_KINDS]
      retrieved = None
      for init, cell in inits:
        outcome = grid_lib.read(study_dir, layout, cell)
        if outcome is None:
          continue
        row = {"target": target, "seed": seed, "init": init, "score": outcome.score,
               "baseline_score": base.score,
               "relative_error_reduction": relative_error_reduction(outcome.score, base.score,
                                                                    settings.metric_max),
               "similarity_average": None, "similarity_per_token": None, "retrieved": None}
        if cell.kind == "transfer" and sources[init] is not None:
          for metric in similarity.METRICS:
            row[f"similarity_{metric}"] = float(similarity.similarities(
                embedding, [sources[init].embedding()], metric)[0])
        if cell.kind in ("weighted_average", "mixture"):
          if retrieved is None:
            ranked = grid_lib.ranking(study_dir, layout, grid, target, seed, grid.similarity)
            retrieved = ";".join(s for s, _ in ranked[:grid.retrieval_k])
          row["retrieved"] = retrieved
        rows.append(row)
  return rows


def _csv_value(value) -> str:
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return ""
  return repr(value) if isinstance(value, float) else str(value)


def write_tables(study_dir: pathlib.Path, rows: Sequence[dict], grid: grid_lib.Grid,
                 settings: RunSettings) -> None:
  """results.csv and results.json (rows, grid, the task-embedding files, the training time)."""
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  writer.writerow(COLUMNS)
  for row in rows:
    writer.writerow([_csv_value(row[c]) for c in COLUMNS])
  fileio.atomic_write_bytes(study_dir / "results.csv", buf.getvalue().encode())
  layout = grid_lib.Layout(settings)
  embeddings: dict = {"sources": {}, "targets": {}}
  for s in grid.sources:
    rec = grid_lib.read(study_dir, layout, grid_lib.Cell("source", s, grid.source_seed))
    if rec is not None:
      embeddings["sources"][s] = str(rec.embedding_path.relative_to(study_dir))
  for t in grid.targets:
    for seed in grid.seeds:
      rec = grid_lib.read(study_dir, layout, grid_lib.Cell("baseline", t, seed))
      if rec is not None:
        embeddings["targets"].setdefault(t, {})[str(seed)] = str(
            rec.embedding_path.relative_to(study_dir))
  doc = {"grid": dataclasses.asdict(grid), "columns": list(COLUMNS), "rows": list(rows),
         "embeddings": embeddings, "training_seconds": training_seconds(study_dir)}
  fileio.atomic_write_bytes(study_dir / "results.json", json.dumps(doc, indent=1).encode())


def training_seconds(study_dir: pathlib.Path) -> dict:
  """Seconds spent in jobs (every invocation, from timing.jsonl), by mode."""
  out = {"in_one_step": 0.0, "one_at_a_time": 0.0, "runs_in_one_step": 0, "runs_one_at_a_time": 0}
  path = study_dir / grid_lib.TIMING
  if path.is_file():
    for line in path.read_text().splitlines():
      entry = json.loads(line)
      mode = "one_at_a_time" if entry["one_at_a_time"] else "in_one_step"
      out[mode] += entry["seconds"]
      out[f"runs_{mode}"] += entry["runs"]
  return out


# --- aggregates over seeds ------------------------------------------------------------------------

def cases(rows: Sequence[dict]) -> dict[tuple[str, int], dict[str, dict]]:
  """{(target, seed): {init: row}}."""
  out: dict = {}
  for r in rows:
    out.setdefault((r["target"], r["seed"]), {})[r["init"]] = r
  return out


def transfer_gains(rows: Sequence[dict], targets: Sequence[str],
                   sources: Sequence[str]) -> dict[tuple[str, str], dict]:
  """Per (target, source): {"rer": Interval, "points": Interval, "verdict", "seeds"}."""
  by_case = cases(rows)
  out = {}
  for t in targets:
    for s in sources:
      pairs = [(c["baseline"], c[s]) for (tt, _), c in sorted(by_case.items())
               if tt == t and "baseline" in c and s in c]
      rers = [r["relative_error_reduction"] for _, r in pairs
              if r["relative_error_reduction"] is not None]
      points = stats.paired_difference([b["score"] for b, _ in pairs],
                                       [r["score"] for _, r in pairs])
      out[(t, s)] = {"rer": stats.interval(rers), "points": points,
                     "verdict": stats.verdict(points), "seeds": [r["seed"] for _, r in pairs]}
  return out


def mean_similarity(rows: Sequence[dict], targets: Sequence[str], sources: Sequence[str],
                    metric: str) -> dict[tuple[str, str], stats.Interval]:
  """Per (target, source): the similarity over seeds (each seed has its own target embedding)."""
  return {(t, s): stats.interval([r[f"similarity_{metric}"] for r in rows if r["target"] == t
                                  and r["init"] == s and r[f"similarity_{metric}"] is not None])
          for t in targets for s in sources}


def correlations(rows: Sequence[dict], targets: Sequence[str], sources: Sequence[str],
                 metric: str) -> dict[str, dict]:
  """Per target and "all" (pooled pairs): {"n", "pearson", "spearman"} over seed-averaged points."""
  gains = transfer_gains(rows, targets, sources)
  sims = mean_similarity(rows, targets, sources, metric)
  out = {}
  for name, members in [(t, [t]) for t in targets] + [("all", list(targets))]:
    pts = [(sims[(t, s)].mean, gains[(t, s)]["rer"].mean) for t in members for s in sources
           if not math.isnan(sims[(t, s)].mean) and not math.isnan(gains[(t, s)]["rer"].mean)]
    x, y = (np.array([p[0] for p in pts]), np.array([p[1] for p in pts]))
    out[name] = {"n": len(pts), "pearson": stats.correlation(x, y, "pearson"),
                 "spearman": stats.correlation(x, y, "spearman")}
  return out


def _share(table: np.ndarray) -> float:
  """Share of the oracle's gain: columns [baseline, oracle, method] of [N, 3] cases."""
  base, oracle, method = table.mean(0)
  return float((method - base) / (oracle - base)) if oracle - base > 0 else math.nan


def retrieval_table(rows: Sequence[dict], sources: Sequence[str], metric: str,
                    ks: Sequence[int] = (1, 3, 5), retrieval_k: int = 0) -> list[dict]:
  """Retrieval against the brute-force oracle over the complete (target, seed) cases.

  best_of_top_k keeps the best transfer among the k sources most similar to the target (that
  seed's embedding); the oracle keeps the best of all; generic, weighted_average and mixture are
  their own runs. Returns rows {"method", "cases", "runs", "mean_score": Interval,
  "oracle_gain_kept": Interval}; the gain kept is (mean(method) - mean(baseline)) /
  (mean(oracle) - mean(baseline)) over cases.
  """
  by_case = cases(rows)
  ks = [k for k in ks if k <= len(sources)] or [len(sources)]
  extra = [m for m in ("generic", "weighted_average", "mixture")
           if any(m in c for c in by_case.values())]
  methods = ["baseline", "oracle"] + [f"best_of_top_{k}" for k in ks] + extra
  table, seeds = [], []
  for (_, seed), case in sorted(by_case.items()):
    transfers = [case[s] for s in sources if s in case]
    if "baseline" not in case or len(transfers) < len(sources) or any(m not in case for m in extra):
      continue  # only complete cases are compared
    by_sim = sorted(transfers, key=lambda t: -t[f"similarity_{metric}"])
    values = [case["baseline"]["score"], max(t["score"] for t in transfers)]
    values += [max(t["score"] for t in by_sim[:k]) for k in ks]
    values += [case[m]["score"] for m in extra]
    table.append(values)
    seeds.append(seed)
  table = np.array(table, np.float64).reshape(len(table), len(methods))
  runs = {"baseline": 1, "oracle": len(sources), "generic": 2, "weighted_average": 1, "mixture": 2}
  out = []
  for j, method in enumerate(methods):
    per_seed = [float(np.mean(table[np.array(seeds) == s, j])) for s in sorted(set(seeds))]
    cols = table[:, [0, 1, j]]
    share = stats.bootstrap(cols, _share, min_samples=MIN_CASES)
    if method in ("baseline", "oracle"):  # 0 and 1 by definition: no interval to draw
      share = stats.Interval(share.mean, math.nan, math.nan, share.n, "by definition")
    out.append({"method": method, "cases": len(table),
                "runs": runs.get(method) or int(method.rsplit("_", 1)[1]),
                "k": retrieval_k if method in ("weighted_average", "mixture") else None,
                "mean_score": stats.interval(per_seed), "oracle_gain_kept": share})
  return out


def source_ranking(rows: Sequence[dict], targets: Sequence[str], sources: Sequence[str],
                   metric: str) -> dict[str, list[tuple[str, stats.Interval, stats.Interval]]]:
  """Per target: (source, similarity, relative error reduction) by decreasing mean similarity."""
  gains = transfer_gains(rows, targets, sources)
  sims = mean_similarity(rows, targets, sources, metric)
  return {t: sorted([(s, sims[(t, s)], gains[(t, s)]["rer"]) for s in sources
                     if not math.isnan(sims[(t, s)].mean)], key=lambda x: -x[1].mean)
          for t in targets}
