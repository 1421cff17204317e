"""Reports of a study: heatmaps, similarity-vs-transfer scatter plots, retrieval vs the oracle.

Reads <study_dir>/results.json (written by `study.py`) and the task embeddings it points to,
and writes PNG figures plus report.md:

  transfer_heatmap.png    targets x sources, mean relative error reduction over seeds
  similarity_heatmap.png  task-embedding similarities, rows/columns ordered by average-linkage
                          hierarchical clustering (scipy) of the distance 1 - similarity
  similarity_vs_transfer.png  per target: similarity to each source vs the transfer's relative
                          error reduction, with Pearson and Spearman r and p-values
  report.md               the tables behind the figures and the retrieval comparison (the
                          paper's Table 3): mean score, share of the oracle's gain kept and
                          share of the search space removed by each strategy
"""
from __future__ import annotations

import math
import pathlib
from typing import Optional, Sequence

import numpy as np

from spot_jax import fileio
from spot_jax.errors import ConfigError
from spot_jax.spot import similarity


def load(study_dir: str | pathlib.Path) -> dict:
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


def _mean(values: Sequence[Optional[float]]) -> float:
  real = [v for v in values if v is not None]
  return float(np.mean(real)) if real else math.nan


def transfer_matrix(rows: Sequence[dict], targets: Sequence[str], sources: Sequence[str]) -> np.ndarray:
  """[T, S] mean relative error reduction over seeds (NaN where nothing finished)."""
  out = np.full((len(targets), len(sources)), math.nan)
  for i, t in enumerate(targets):
    for j, s in enumerate(sources):
      out[i, j] = _mean([r["relative_error_reduction"] for r in rows
                         if r["target"] == t and r["init"] == s])
  return out


def cluster_order(sim: np.ndarray) -> np.ndarray:
  """Leaf order of average-linkage clustering on 1 - similarity."""
  from scipy.cluster import hierarchy  # pylint: disable=g-import-not-at-top
  from scipy.spatial.distance import squareform  # pylint: disable=g-import-not-at-top
  if len(sim) < 3:
    return np.arange(len(sim))
  dist = np.clip(1.0 - (sim + sim.T) / 2.0, 0.0, None)
  np.fill_diagonal(dist, 0.0)
  return hierarchy.leaves_list(hierarchy.linkage(squareform(dist, checks=False), method="average"))


def correlations(rows: Sequence[dict], target: str, metric: str) -> dict:
  """Pearson and Spearman (r, p) of similarity vs relative error reduction over one target's
  transfers (all sources and seeds); NaN when fewer than 3 points or a constant variable."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  pairs = [(r[f"similarity_{metric}"], r["relative_error_reduction"]) for r in rows
           if r["target"] == target and r[f"similarity_{metric}"] is not None
           and r["relative_error_reduction"] is not None]
  out = {"n": len(pairs), "pearson_r": math.nan, "pearson_p": math.nan,
         "spearman_r": math.nan, "spearman_p": math.nan}
  if len(pairs) >= 3:
    x, y = np.array(pairs).T
    if np.ptp(x) > 0 and np.ptp(y) > 0:
      out["pearson_r"], out["pearson_p"] = map(float, stats.pearsonr(x, y))
      out["spearman_r"], out["spearman_p"] = map(float, stats.spearmanr(x, y))
  return out


def retrieval_table(rows: Sequence[dict], sources: Sequence[str], metric: str,
                    ks: Sequence[int] = (1, 3, 5)) -> list[dict]:
  """The paper's Table 3 from the grid: for each (target, seed), best-of-top-k keeps the best
  transfer among the k sources most similar to the target; the oracle keeps the best of all.

  Returns rows {"method", "mean_score", "oracle_gain_kept", "search_space_removed"}; the gain
  kept is (mean(method) - mean(baseline)) / (mean(oracle) - mean(baseline)).
  """
  cases = {}
  for r in rows:
    cases.setdefault((r["target"], r["seed"]), {})[r["init"]] = r
  scores: dict[str, list[float]] = {"baseline": [], "oracle": []}
  ks = [k for k in ks if k <= len(sources)] or [len(sources)]
  for k in ks:
    scores[f"best_of_top_{k}"] = []
  has_generic = any("generic" in c for c in cases.values())
  if has_generic:
    scores["generic"] = []
  for case in cases.values():
    transfers = [case[s] for s in sources if s in case]
    if "baseline" not in case or len(transfers) < len(sources) or (has_generic and "generic" not in case):
      continue  # only complete cases are compared
    scores["baseline"].append(case["baseline"]["score"])
    scores["oracle"].append(max(t["score"] for t in transfers))
    by_sim = sorted(transfers, key=lambda t: -t[f"similarity_{metric}"])
    for k in ks:
      scores[f"best_of_top_{k}"].append(max(t["score"] for t in by_sim[:k]))
    if has_generic:
      scores["generic"].append(case["generic"]["score"])
  base, oracle = _mean(scores["baseline"]), _mean(scores["oracle"])
  out = []
  for method, values in scores.items():
    mean = _mean(values)
    gain = (mean - base) / (oracle - base) if oracle - base > 0 else math.nan
    removed = {"baseline": 1.0, "oracle": 0.0, "generic": 1.0}.get(method)
    if removed is None:
      removed = 1.0 - int(method.rsplit("_", 1)[1]) / len(sources)
    out.append({"method": method, "cases": len(values), "mean_score": mean,
                "oracle_gain_kept": gain, "search_space_removed": removed})
  return out


def source_ranking(rows: Sequence[dict], targets: Sequence[str], sources: Sequence[str],
                   metric: str) -> dict[str, list[tuple[str, float, float]]]:
  """Per target: (source, mean similarity, mean relative error reduction) by decreasing similarity."""
  out = {}
  for t in targets:
    items = []
    for s in sources:
      mine = [r for r in rows if r["target"] == t and r["init"] == s]
      if mine:
        items.append((s, _mean([r[f"similarity_{metric}"] for r in mine]),
                      _mean([r["relative_error_reduction"] for r in mine])))
    out[t] = sorted(items, key=lambda x: -x[1])
  return out


def _fmt(x) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "-"
  return f"{x:.4g}" if isinstance(x, float) else str(x)


def _table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
  return "\n".join(lines)


def _heatmap(ax, matrix, rows, cols, title, cmap):
  image = ax.imshow(matrix, cmap=cmap, aspect="auto")
  ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=7)
  ax.set_yticks(range(len(rows)), rows, fontsize=7)
  for (i, j), v in np.ndenumerate(matrix):
    if not math.isnan(v):
      ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
  ax.set_title(title, fontsize=9)
  return image


def write(study_dir: str | pathlib.Path, out_dir: Optional[str | pathlib.Path] = None,
          metric: str = "average") -> dict:
  """Writes the figures and report.md; returns the numbers (for callers and tests)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  if metric not in similarity.METRICS:
    raise ConfigError(f"--similarity {metric!r} is unknown; valid: {', '.join(similarity.METRICS)}")
  study_dir = pathlib.Path(study_dir)
  doc = load(study_dir)
  rows, grid = doc["rows"], doc["grid"]
  sources, targets = list(grid["sources"]), list(grid["targets"])
  if not rows:
    raise ConfigError(f"{str(study_dir)!r} has no finished target runs yet; run the study first")
  out = fileio.writable_dir(out_dir or study_dir / "report", "--output_dir")

  transfer = transfer_matrix(rows, targets, sources)
  fig, ax = plt.subplots(figsize=(3.0 + 0.5 * len(sources), 2.0 + 0.4 * len(targets)))
  fig.colorbar(_heatmap(ax, transfer, targets, sources, "relative error reduction (target x source)",
                        "RdBu"), ax=ax)
  fig.tight_layout()
  fig.savefig(out / "transfer_heatmap.png", dpi=120)
  plt.close(fig)

  names = list(doc["embeddings"])
  embeddings = [fileio.read_npy(study_dir / doc["embeddings"][n], f"the task embedding of {n}")
                for n in names]
  sim = similarity.pairwise(embeddings, metric)
  order = cluster_order(sim)
  ordered = [names[i] for i in order]
  fig, ax = plt.subplots(figsize=(3.0 + 0.45 * len(names), 1.5 + 0.45 * len(names)))
  fig.colorbar(_heatmap(ax, sim[np.ix_(order, order)], ordered, ordered,
                        f"task-embedding similarity ({metric}), clustered", "viridis"), ax=ax)
  fig.tight_layout()
  fig.savefig(out / "similarity_heatmap.png", dpi=120)
  plt.close(fig)

  corr = {t: correlations(rows, t, metric) for t in targets}
  cols = min(len(targets), 4)
  fig, axes = plt.subplots(math.ceil(len(targets) / cols), cols, figsize=(3.2 * cols, 2.8 * math.ceil(len(targets) / cols)),
                           squeeze=False)
  for ax, t in zip(axes.flat, targets):
    pts = [(r[f"similarity_{metric}"], r["relative_error_reduction"], r["init"]) for r in rows
           if r["target"] == t and r[f"similarity_{metric}"] is not None
           and r["relative_error_reduction"] is not None]
    if pts:
      ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=12)
    c = corr[t]
    ax.set_title(f"{t}\nPearson {_fmt(c['pearson_r'])} (p {_fmt(c['pearson_p'])}), "
                 f"Spearman {_fmt(c['spearman_r'])} (p {_fmt(c['spearman_p'])})", fontsize=6)
    ax.set_xlabel(f"similarity ({metric})", fontsize=7)
    ax.set_ylabel("relative error reduction", fontsize=7)
  for ax in list(axes.flat)[len(targets):]:
    ax.axis("off")
  fig.tight_layout()
  fig.savefig(out / "similarity_vs_transfer.png", dpi=120)
  plt.close(fig)

  retrieval = retrieval_table(rows, sources, metric)
  ranking = source_ranking(rows, targets, sources, metric)
  md = [f"# SPoT study report: {study_dir.name}", "",
        f"{len(rows)} finished target runs; sources: {', '.join(sources)}; targets: "
        f"{', '.join(targets)}; seeds: {', '.join(map(str, grid['seeds']))}.", "",
        "## Transfer (relative error reduction, mean over seeds)", "",
        "![transfer heatmap](transfer_heatmap.png)", "",
        _table(["target"] + sources, [[t] + list(transfer[i]) for i, t in enumerate(targets)]), "",
        f"## Task-embedding similarity ({metric}), clustered", "",
        "![similarity heatmap](similarity_heatmap.png)", "",
        _table(["task"] + ordered, [[n] + list(sim[i, order]) for n, i in zip(ordered, order)]), "",
        "## Sources ranked by similarity to each target (seed-averaged)", "",
        _table(["target", "ranking (similarity, relative error reduction)"],
               [[t, ", ".join(f"{s} ({_fmt(sim_)}, {_fmt(rer)})" for s, sim_, rer in ranking[t])]
                for t in targets]), "",
        "## Similarity vs transfer", "", "![scatter](similarity_vs_transfer.png)", "",
        _table(["target", "n", "Pearson r", "p", "Spearman r", "p"],
               [[t, corr[t]["n"], corr[t]["pearson_r"], corr[t]["pearson_p"], corr[t]["spearman_r"],
                 corr[t]["spearman_p"]] for t in targets]), "",
        "## Retrieval vs the brute-force oracle", "",
        _table(["method", "cases", "mean score", "share of oracle gain kept", "share of search space removed"],
               [[r["method"], r["cases"], r["mean_score"], r["oracle_gain_kept"],
                 r["search_space_removed"]] for r in retrieval]), ""]
  (out / "report.md").write_text("\n".join(md))
  return {"transfer": transfer, "similarity": sim, "names": names, "order": order,
          "correlations": corr, "retrieval": retrieval, "ranking": ranking, "out_dir": str(out)}
