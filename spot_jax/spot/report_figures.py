"""Figures of a study, readable at native size, with intervals wherever a number is drawn.

  transfer_heatmap.png        targets x sources: mean relative error reduction over seeds and
                              its 95% t half-width ("±"), on a colour scale centred at 0
  similarity_heatmap.png      task-embedding similarities (mean over seeds where the target's
                              embedding differs by seed), ordered by average-linkage clustering
  similarity_vs_transfer.png  per target: each source's similarity vs its relative error
                              reduction (seed means with interval bars, source names on the
                              points), Pearson and Spearman with bootstrap intervals
  retrieval.png               share of the oracle's gain kept by each method, with intervals

Task names are shortened (`short_names`: the words every name shares at the start and end are
dropped, long words cut to 4 letters); each figure's caption says how. Figures are sized from the
grid, in inches, so a 3 x 2 study gets cells as large as an 8 x 4 one; a cell's label is white or
black by the luminance of the cell's colour.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from spot_jax import stats

CELL_W, CELL_H = 0.85, 0.55  # inches per heatmap cell
CHAR_W = 0.075  # inches per character of an 8-point label
DPI = 120


def short_names(names: Sequence[str]) -> tuple[dict[str, str], str]:
  """Short, distinct display names and a caption saying how they were made.

  Args:
    names: full task names (all the figure's tasks, so one rule serves them all).

  Returns:
    ({full: short}, caption).
  """
  parts = [n.split("_") for n in names]
  shortest = min(len(p) for p in parts)
  pre = 0
  while pre < shortest - 1 and len({p[pre] for p in parts}) == 1:
    pre += 1
  suf = 0
  while suf < shortest - pre - 1 and len({p[len(p) - 1 - suf] for p in parts}) == 1:
    suf += 1
  cores = ["_".join(p[pre:len(p) - suf]) for p in parts]
  cut: dict[str, str] = {}
  short = []
  for core in cores:
    words = core.split("_")
    if len(core) > 12:
      for i, w in enumerate(words[:-1]):
        if len(w) > 5:
          cut[w] = w[:4]
          words[i] = w[:4]
    short.append("_".join(words))
  if len(set(short)) != len(short):
    short, cut = cores, {}
  dropped = []
  if pre:
    dropped.append(f"prefix '{'_'.join(parts[0][:pre])}_'")
  if suf:
    dropped.append(f"suffix '_{'_'.join(parts[0][len(parts[0]) - suf:])}'")
  caption = (("task names without their shared " + " and ".join(dropped)) if dropped
             else "task names")
  if cut:
    caption += "; " + ", ".join(f"{v} = {k}" for k, v in sorted(cut.items()))
  return dict(zip(names, short)), caption


def cluster_order(sim: np.ndarray) -> np.ndarray:
  """Leaf order of average-linkage clustering on 1 - similarity."""
  from scipy.cluster import hierarchy  # pylint: disable=g-import-not-at-top
  from scipy.spatial.distance import squareform  # pylint: disable=g-import-not-at-top
  if len(sim) < 3:
    return np.arange(len(sim))
  dist = np.clip(1.0 - (sim + sim.T) / 2.0, 0.0, None)
  np.fill_diagonal(dist, 0.0)
  return hierarchy.leaves_list(hierarchy.linkage(squareform(dist, checks=False), method="average"))


def text_colour(rgba: Sequence[float]) -> str:
  """Black on light cells, white on dark ones (WCAG relative luminance of the cell's colour)."""
  def linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
  r, g, b = (linear(c) for c in rgba[:3])
  luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
  # contrast against black (L + 0.05) / 0.05 vs against white 1.05 / (L + 0.05): the larger wins
  return "black" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "white"


def wrap(caption: str, width_in: float) -> str:
  """The caption broken into lines that fit `width_in` inches at 7 points."""
  import textwrap  # pylint: disable=g-import-not-at-top
  chars = max(30, int(width_in / 0.062))
  return "\n".join(line for para in caption.split("\n")
                   for line in textwrap.wrap(para, chars) or [""])


def _cell_label(value: stats.Interval) -> str:
  if math.isnan(value.mean):
    return ""
  return f"{value.mean:.2f}\n±{value.half_width:.2f}" if value.resolved else f"{value.mean:.2f}"


def heatmap(plt, cells: Sequence[Sequence[stats.Interval]], rows: Sequence[str],
            cols: Sequence[str], title: str, caption: str, cmap: str,
            centre: Optional[float] = None):
  """A heatmap of intervals (label: mean, and ± half-width when there is one), sized in inches.

  Args:
    plt: matplotlib.pyplot.
    cells: [R][C] intervals (NaN mean: empty cell).
    rows, cols: the row and column labels (short names).
    title: the title.
    caption: text under the figure (abbreviations, what ± means).
    cmap: colour map name.
    centre: a value the colour scale is symmetric about (None: the data's range).

  Returns:
    The figure.
  """
  from matplotlib import colors, ticker  # pylint: disable=g-import-not-at-top
  means = np.array([[c.mean for c in row] for row in cells], np.float64)
  finite = means[np.isfinite(means)]
  lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
  if centre is not None:
    span = max(abs(lo - centre), abs(hi - centre), 1e-6)
    lo, hi = centre - span, centre + span
  elif hi - lo < 1e-6:
    lo, hi = lo - 0.5, hi + 0.5
  norm = colors.Normalize(lo, hi)
  cell_h = max(CELL_H, 1.6 / len(rows))  # a short grid keeps a colour bar with room for ticks
  left = 0.3 + CHAR_W * max(len(r) for r in rows)
  width, height = CELL_W * len(cols), cell_h * len(rows)
  fig_w = max(left + width + 1.2, 4.5)
  caption = wrap(caption, fig_w - 0.2)
  bottom = 0.25 + CHAR_W * 0.72 * max(len(c) for c in cols) + 0.15 * (1 + caption.count("\n"))
  fig_h = bottom + height + 0.5
  fig = plt.figure(figsize=(fig_w, fig_h))
  ax = fig.add_axes((left / fig_w, bottom / fig_h, width / fig_w, height / fig_h))
  cax = fig.add_axes(((left + width + 0.15) / fig_w, bottom / fig_h, 0.15 / fig_w, height / fig_h))
  image = ax.imshow(np.ma.masked_invalid(means), cmap=cmap, norm=norm, aspect="auto")
  ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", rotation_mode="anchor", fontsize=8)
  ax.set_yticks(range(len(rows)), rows, fontsize=8)
  mapper = image.cmap
  for (i, j), v in np.ndenumerate(means):
    if math.isfinite(v):
      ax.text(j, i, _cell_label(cells[i][j]), ha="center", va="center", fontsize=7,
              color=text_colour(mapper(norm(v))), linespacing=1.1)
  bar = fig.colorbar(image, cax=cax)
  bar.locator = ticker.MaxNLocator(nbins=max(3, int(height * 2)))
  bar.update_ticks()
  bar.ax.tick_params(labelsize=7)
  ax.set_title(title, fontsize=9)
  fig.text(0.1 / fig_w, 0.08 / fig_h, caption, fontsize=7, va="bottom", ha="left")
  return fig


def scatter(plt, targets: Sequence[str], points: dict, correlations: dict, short: dict[str, str],
            caption: str, metric: str):
  """Per target: sources at (similarity, relative error reduction) with interval bars and names.

  Args:
    plt: matplotlib.pyplot.
    targets: the panels.
    points: {target: [(source, similarity Interval, rer Interval)]}.
    correlations: `study_tables.correlations` output.
    short: {task: short name}.
    caption: text under the figure.
    metric: the similarity's name.
  """
  cols = min(len(targets), 2)
  rows = math.ceil(len(targets) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows + 0.5), squeeze=False)
  fig_h = 3.4 * rows + 0.5
  caption = wrap(caption, 4.2 * cols - 0.2)
  for ax, t in zip(axes.flat, targets):
    pts = points[t]
    for s, sim, rer in pts:
      ax.errorbar(sim.mean, rer.mean, xerr=sim.half_width if sim.resolved else None,
                  yerr=rer.half_width if rer.resolved else None, fmt="o", ms=4, color="tab:blue",
                  ecolor="0.7", elinewidth=0.8, capsize=2)
    ax.axhline(0.0, color="0.75", lw=0.6, zorder=0)
    ax.margins(0.18)
    _label_points(ax, [(short[s], sim.mean, rer.mean) for s, sim, rer in pts])
    ax.set_title(f"{short[t]}\n{describe(correlations[t])}", fontsize=8)
    ax.set_xlabel(f"similarity ({metric})", fontsize=8)
    ax.set_ylabel("relative error reduction", fontsize=8)
    ax.tick_params(labelsize=7)
  for ax in list(axes.flat)[len(targets):]:
    ax.axis("off")
  fig.suptitle(f"all (target, source) pairs: {describe(correlations['all'])}", fontsize=8)
  fig.tight_layout(rect=(0, (0.15 + 0.13 * (1 + caption.count("\n"))) / fig_h, 1, 1))
  fig.text(0.01, 0.1 / fig_h, caption, fontsize=7, va="bottom", ha="left")
  return fig


def _label_points(ax, labels: Sequence[tuple[str, float, float]]) -> None:
  """Names beside their points; a name that would overlap a placed one moves to the nearest free
  line above or below, on the right or the left, joined to its point by a thin leader line."""
  placed: list[tuple[float, float, float, float]] = []
  ax.figure.canvas.draw()  # final limits, so data -> display positions hold
  to_px = ax.transData.transform
  scale = ax.figure.dpi / 72
  line = 7 * scale * 1.3
  for name, x, y in sorted(labels, key=lambda p: (-p[2], p[1])):
    px, py = to_px((x, y))
    w = 0.62 * 7 * scale * len(name)
    offsets = [(4 * scale, -line / 2 + sign * k * line) for k in range(len(labels) + 2)
               for sign in ((1,) if k == 0 else (1, -1))]
    offsets = [(dx if side > 0 else -dx - w, dy) for dx, dy in offsets for side in (1, -1)]
    for dx, dy in offsets:
      box = (px + dx, py + dy, px + dx + w, py + dy + line)
      if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3]
                 and b[1] < box[3] for b in placed):
        break
    placed.append(box)
    moved = abs(dy + line / 2) > 1
    ax.annotate(name, (x, y), xytext=(dx / scale, (dy + line / 2) / scale),
                textcoords="offset points", fontsize=7, va="center",
                arrowprops=dict(arrowstyle="-", lw=0.4, color="0.45", shrinkA=0, shrinkB=2)
                if moved else None)


def describe(corr: dict) -> str:
  """'Pearson 0.63 [0.10, 0.90], Spearman 0.76 [0.20, 0.95] (n=8)', or why no interval."""
  p, s = corr["pearson"], corr["spearman"]
  if math.isnan(p.mean) and math.isnan(s.mean):
    return f"n={corr['n']}: no correlation (too few points or a constant)"
  if not p.resolved:
    return (f"Pearson {p.mean:.2f}, Spearman {s.mean:.2f}; n={corr['n']}: too few points for an "
            f"interval")
  return f"Pearson {p.format(2)}, Spearman {s.format(2)} (n={corr['n']})"


def retrieval_bars(plt, table: Sequence[dict], caption: str):
  """Share of the oracle's gain kept by each method, with its interval (or the reason for none)."""
  methods = [r for r in table if r["method"] not in ("baseline", "oracle")]
  fig_h = 0.9 + 0.4 * len(methods) + 0.3
  fig, ax = plt.subplots(figsize=(7.5, fig_h))
  for i, r in enumerate(methods):
    share = r["oracle_gain_kept"]
    xerr = None if not share.resolved else [[share.mean - share.low], [share.high - share.mean]]
    ax.barh(i, share.mean if math.isfinite(share.mean) else 0.0, color="tab:blue", alpha=0.7,
            xerr=xerr, ecolor="0.3", capsize=3)
    label = (share.format(2) if share.resolved
             else f"{share.mean:.2f} ({share.why or 'no interval'})")
    ax.text(1.02, i, label, va="center", ha="left", fontsize=7, color="black",
            transform=ax.get_yaxis_transform(), clip_on=False)
  ax.set_yticks(range(len(methods)), [r["method"] for r in methods], fontsize=8)
  ax.axvline(1.0, color="0.5", lw=0.8, ls="--")
  ax.axvline(0.0, color="0.5", lw=0.8)
  ax.invert_yaxis()
  ax.set_xlabel("share of the oracle's gain kept", fontsize=8)
  ax.tick_params(labelsize=7)
  ax.set_title("retrieval vs the brute-force oracle", fontsize=9)
  fig.tight_layout(rect=(0, 0.3 / fig_h, 0.8, 1))
  fig.text(0.01, 0.02, wrap(caption, 7.3), fontsize=7, va="bottom", ha="left")
  return fig
