"""The demo's results: a console/Markdown table, JSON and a bar chart PNG."""
from __future__ import annotations

import json
import pathlib
from typing import Mapping, Sequence

from spot_jax.demo.runs import METHOD_NAMES


def table_rows(results: Sequence[Mapping], targets: Sequence[str], methods: Sequence[str],
               chance: Mapping[str, float]) -> list[list[str]]:
  """Header + one row per target: chance, then "accuracy (seconds)" per method."""
  by_key = {(r["task"], r["method"]): r for r in results if r["role"] == "target"}
  rows = [["target", "chance"] + [METHOD_NAMES[m] for m in methods]]
  for target in targets:
    row = [target, f"{chance[target]:.1f}"]
    for method in methods:
      r = by_key.get((target, method))
      row.append("-" if r is None else f"{r['accuracy']:.1f} ({r['seconds']:.0f}s)")
    rows.append(row)
  return rows


def markdown(rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
  lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
  return "\n".join(lines) + "\n"


def plain(rows: Sequence[Sequence[str]]) -> str:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def bar_chart(results: Sequence[Mapping], targets: Sequence[str], methods: Sequence[str],
              chance: Mapping[str, float], path: pathlib.Path) -> None:
  """Grouped bars of validation accuracy per target and method, chance as a tick line."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  by_key = {(r["task"], r["method"]): r["accuracy"] for r in results if r["role"] == "target"}
  width = 0.8 / max(len(methods), 1)
  fig, ax = plt.subplots(figsize=(2.2 * len(targets) + 2, 4))
  for j, method in enumerate(methods):
    xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(targets))]
    ax.bar(xs, [by_key.get((t, method), 0.0) for t in targets], width, label=METHOD_NAMES[method])
  for i, target in enumerate(targets):
    ax.hlines(chance[target], i - 0.45, i + 0.45, colors="black", linestyles="dashed",
              label="chance" if i == 0 else None)
  ax.set_xticks(range(len(targets)), targets)
  ax.set_ylabel("validation accuracy (%)")
  ax.set_ylim(0, 112)
  ax.legend(loc="upper center", ncol=len(methods) + 1, fontsize=8)
  ax.set_title("Prompt methods on the embedded toy T5")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write(output_dir: pathlib.Path, summary: Mapping, rows: Sequence[Sequence[str]]) -> list[pathlib.Path]:
  """results.json, results.md and results.png in `output_dir`; returns their paths."""
  paths = [output_dir / "results.json", output_dir / "results.md", output_dir / "results.png"]
  paths[0].write_text(json.dumps(summary, indent=1, sort_keys=True))
  sources = [r for r in summary["runs"] if r["role"] == "source"]
  text = ["# spot-jax demo results", "",
          f"Validation accuracy (%) of each method on each target (wall time of the run), "
          f"seed {summary['settings']['seed']}, {summary['settings']['target_steps']} target steps.", "",
          markdown(rows)]
  if sources:
    text += ["Source prompts (SPoT starts each target from its best related source):", "",
             markdown([["source", "accuracy", "seconds"]] +
                      [[r["task"], f"{r['accuracy']:.1f}", f"{r['seconds']:.0f}"] for r in sources])]
  paths[1].write_text("\n".join(text))
  bar_chart(summary["runs"], summary["targets"], summary["methods"], summary["chance"], paths[2])
  return paths
