"""The report of a study: the figures (`report_figures.py`) and report.md,
every number with its interval.

Reads <study_dir>/results.json (written by `python -m spot_jax.study`) and the task embeddings it
points to; the aggregates are `study_tables.py`'s. Where a sample is too small for an interval the
report says so ("n=3: too few points for an interval") instead of printing one.
"""
from __future__ import annotations

import math
import pathlib
from typing import Optional, Sequence

import numpy as np

from spot_jax import fileio
from spot_jax import stats
from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.spot import report_figures
from spot_jax.spot import study_tables
from spot_jax.spot import similarity

PM = "± is the 95% Student-t half-width over seeds"


def load(study_dir: str | pathlib.Path) -> dict:
  """The study's results.json, checked to be one (one-line errors naming what is wrong)."""
  path = pathlib.Path(study_dir) / "results.json"
  if not path.is_file():
    raise ConfigError(f"no results.json in {str(study_dir)!r}; give the --study_dir of a "
                      f"`python -m spot_jax.study` run")
  doc = fileio.read_json(path, "--study_dir's results.json")
  grid = doc.get("grid") if isinstance(doc, dict) else None
  if (not isinstance(grid, dict) or not isinstance(doc.get("rows"), list)
      or not isinstance(doc.get("embeddings"), dict)
      or not all(isinstance(grid.get(k), list) for k in ("sources", "targets", "seeds"))):
    raise ConfigError(f"{str(path)!r} is not the results.json of a `python -m spot_jax.study` run "
                      f"(it lacks rows, embeddings or the grid's sources, targets and seeds); give "
                      f"the --study_dir of a study")
  return doc


def similarity_matrix(study_dir: pathlib.Path, embeddings: dict, metric: str
                      ) -> tuple[list[str], list[list[stats.Interval]]]:
  """Every task pair's similarity over seeds: a target's embedding is its baseline's of each seed.

  Source pairs have one value (one source seed); a target pair is compared seed by seed.
  """
  def load_npy(rel: str) -> np.ndarray:
    return fileio.read_npy(study_dir / rel, "a task embedding of the study")
  per_seed: dict[str, dict[Optional[str], np.ndarray]] = {
      s: {None: load_npy(p)} for s, p in embeddings["sources"].items()}
  for t, by_seed in embeddings["targets"].items():
    per_seed.setdefault(t, {}).update({seed: load_npy(p) for seed, p in by_seed.items()})
  names = list(per_seed)
  cells = []
  for a in names:
    row = []
    for b in names:
      if a == b:
        row.append(stats.Interval(1.0, math.nan, math.nan, 1, "the same task"))
        continue
      ea, eb = per_seed[a], per_seed[b]
      if None in ea or None in eb:
        pairs = [(x, y) for x in ea.values() for y in eb.values()]
      else:
        pairs = [(ea[s], eb[s]) for s in ea if s in eb]
      row.append(
          stats.interval([float(similarity.similarities(x, [y], metric)[0]) for x, y in pairs]))
    cells.append(row)
  return names, cells


def _table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
  def cell(v) -> str:
    if isinstance(v, stats.Interval):
      return v.format(3) if v.resolved else (f"{v.mean:.3g} ({v.why})" if v.why
                                             and not math.isnan(v.mean) else v.format(3))
    if v is None or (isinstance(v, float) and math.isnan(v)):
      return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
  return "\n".join(lines)


def _save(plt, fig, path: pathlib.Path) -> None:
  fig.savefig(path, dpi=report_figures.DPI)
  plt.close(fig)


def write(study_dir: str | pathlib.Path, out_dir: Optional[str | pathlib.Path] = None,
          metric: str = "average") -> dict:
  """Writes the figures and report.md; returns the numbers (for callers and tests)."""
  validate.one_of(metric, "--similarity", similarity.METRICS)
  study_dir = pathlib.Path(study_dir)
  doc = load(study_dir)
  rows, grid = doc["rows"], doc["grid"]
  sources, targets = list(grid["sources"]), list(grid["targets"])
  if not rows:
    raise ConfigError(f"{str(study_dir)!r} has no finished target runs yet; run the study first")
  out = fileio.writable_dir(out_dir or study_dir / "report", "--output_dir")
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  short, how = report_figures.short_names(sources + targets)
  gains = study_tables.transfer_gains(rows, targets, sources)
  transfer = [[gains[(t, s)]["rer"] for s in sources] for t in targets]
  _save(plt, report_figures.heatmap(plt, transfer, [short[t] for t in targets],
                                    [short[s] for s in sources],
                             "relative error reduction (rows: targets, columns: sources)",
                             f"{how}\n{PM}; no ± with one seed", "RdBu", centre=0.0),
        out / "transfer_heatmap.png")

  names, sim = similarity_matrix(study_dir, doc["embeddings"], metric)
  order = report_figures.cluster_order(np.array([[c.mean for c in row] for row in sim]))
  ordered = [names[i] for i in order]
  sim_ordered = [[sim[i][j] for j in order] for i in order]
  _save(plt, report_figures.heatmap(plt, sim_ordered, [short.get(n, n) for n in ordered],
                             [short.get(n, n) for n in ordered],
                             f"task-embedding similarity ({metric}), clustered",
                             f"{how}\n{PM} (target embeddings differ by seed); source pairs: "
                             f"one seed, no ±", "viridis"),
        out / "similarity_heatmap.png")

  corr = study_tables.correlations(rows, targets, sources, metric)
  ranking = study_tables.source_ranking(rows, targets, sources, metric)
  _save(plt, report_figures.scatter(plt, targets, ranking, corr, short,
                             f"{how}. Points: seed means, bars: 95% t intervals over seeds; "
                             f"correlations over the points, bootstrap 95% intervals", metric),
        out / "similarity_vs_transfer.png")

  retrieval = study_tables.retrieval_table(rows, sources, metric,
                                           retrieval_k=int(grid.get("retrieval_k") or 0))
  _save(plt, report_figures.retrieval_bars(plt, retrieval,
                                    f"bootstrap 95% intervals over the {retrieval[0]['cases']} "
                                    f"(target, seed) cases (none below {study_tables.MIN_CASES})"),
        out / "retrieval.png")

  md = _markdown(study_dir, doc, short, how, gains, ordered, sim_ordered, ranking, corr,
                 retrieval, metric)
  (out / "report.md").write_text(md)
  return {"transfer": gains, "similarity": sim, "names": names, "order": order,
          "correlations": corr, "retrieval": retrieval, "ranking": ranking, "short": short,
          "out_dir": str(out)}


def _markdown(study_dir, doc, short, how, gains, ordered, sim, ranking, corr, retrieval,
              metric) -> str:
  grid = doc["grid"]
  sources, targets = list(grid["sources"]), list(grid["targets"])
  secs = doc.get("training_seconds") or {}
  timing = [f"{secs[m]:.0f} s for {secs[f'runs_{m}']} runs {m.replace('_', ' ')}"
            for m in ("in_one_step", "one_at_a_time") if secs.get(f"runs_{m}")]
  md = [f"# SPoT study report: {study_dir.name}", "",
        f"{len(doc['rows'])} finished target runs; {len(sources)} sources x "
        f"{len(targets)} targets; "
        f"seeds {', '.join(map(str, grid['seeds']))}"
        + (f"; training time {', '.join(timing)}" if timing else "")
        + ".", "", f"Names: {how}.", "",
        _table(["short", "task"], [[short[n], n] for n in sources + targets]), "",
        "## Transfer: relative error reduction against the same seed's baseline", "",
        "![transfer heatmap](transfer_heatmap.png)", "",
        f"Mean over seeds {PM}; the points column is the paired difference in score "
        f"(transfer - baseline) with its verdict.", "",
        _table(["target", "source", "seeds", "relative error reduction", "points", "verdict"],
               [[short[t], short[s], len(gains[(t, s)]["seeds"]), gains[(t, s)]["rer"],
                 gains[(t, s)]["points"], gains[(t, s)]["verdict"]] for t in targets
                for s in sources]), "",
        f"## Task-embedding similarity ({metric}), clustered", "",
        "![similarity heatmap](similarity_heatmap.png)", "",
        _table(["task"] + [short.get(n, n) for n in ordered],
               [[short.get(n, n)] + list(row) for n, row in zip(ordered, sim)]), "",
        "## Sources ranked by similarity to each target", "",
        _table(["target", "ranking: source (similarity; relative error reduction)"],
               [[short[t], ", ".join(f"{short[s]} ({si.format(3)}; {g.format(3)})"
                                     for s, si, g in ranking[t])]
                for t in targets]), "",
        "## Similarity vs transfer", "", "![scatter](similarity_vs_transfer.png)", "",
        "Over the seed-averaged (target, source) points; 95% percentile-bootstrap intervals over "
        f"points; fewer than {stats.MIN_CORRELATION_POINTS} points carry none.", "",
        _table(["target", "points", "Pearson r", "Spearman r"],
               [[short.get(t, t), corr[t]["n"], corr[t]["pearson"], corr[t]["spearman"]]
                for t in targets + ["all"]]), "",
        "## Retrieval vs the brute-force oracle", "", "![retrieval](retrieval.png)", "",
        "Mean score: mean over targets, then a t interval over seeds. Share of the oracle's gain: "
        "(mean(method) - mean(baseline)) / (mean(oracle) - mean(baseline)) over the complete "
        "(target, seed) cases, percentile-bootstrap interval over cases (none below "
        f"{study_tables.MIN_CASES}).", "",
        _table(["method", "k", "cases", "target runs per case", "mean score",
                "share of oracle gain kept"],
               [[r["method"], r["k"] or "-", r["cases"], r["runs"], r["mean_score"],
                 r["oracle_gain_kept"]]
                for r in retrieval]), ""]
  return "\n".join(md)
