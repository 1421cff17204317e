"""The train-step bench's tables: one Markdown row per (method, length), and the paired lines of
an interleaved run."""
from __future__ import annotations

from typing import Sequence


def paired_lines(rows: Sequence[dict]) -> list[str]:
  """One line per interleaved row that is not its length's first: its paired step ratio to the
  first method, beside the FLOP ratio."""
  lines, firsts = [], set()
  for r in rows:
    if "paired_step_ratio" not in r or r["input_length"] not in firsts:
      firsts.add(r["input_length"])
      continue
    line = (f"{r['method']} / {r['paired_with']} at {r['input_length']} input tokens: step time "
            f"{r['paired_step_ratio']:.3f} (median over {r['steps']} interleaved rounds)")
    if r.get("flop_ratio"):
      line += (f", FLOPs {r['flop_ratio']:.3f}; time / FLOP ratio "
               f"{r['paired_step_ratio'] / r['flop_ratio']:.3f}")
    lines.append(line)
  return lines


_COLUMNS = (("method", "method", "{}"), ("input T", "input_length", "{}"),
            ("devices", "devices", "{}"),
            ("step s (median)", "step_sec_median", "{:.3f}"),
            ("ex/s", "examples_per_sec", "{:.2f}"), ("tok/s", "tokens_per_sec", "{:.0f}"),
            ("GFLOP/step", "flops_per_step", "{:.1f}"), ("MFU", "mfu", "{:.1%}"),
            ("infer s", "inference_step_sec_median", "{:.3f}"),
            ("compile s", "compile_sec", "{:.1f}"),
            ("compile+1st s", "compile_plus_first_step_sec", "{:.1f}"),
            ("trainable", "trainable_params", "{:,}"),
            ("peak RSS GiB", "peak_host_memory_bytes", "{:.2f}"))


def cell(row: dict, key: str, fmt: str) -> str:
  value = row.get(key)
  if key == "mfu" and row.get("mfu_flagged"):
    return "flagged (>100%)"  # the peak was measured slower than the step ran: not an MFU
  if value is None:
    return "-"
  if key == "flops_per_step":
    value = value / 1e9
  if key == "peak_host_memory_bytes":
    value = value / 2 ** 30
  return fmt.format(value)


def markdown_table(rows: Sequence[dict]) -> str:
  """The rows as a GitHub Markdown table."""
  lines = ["| " + " | ".join(c[0] for c in _COLUMNS) + " |",
           "|" + "|".join("---" for _ in _COLUMNS) + "|"]
  lines += ["| " + " | ".join(cell(r, k, f) for _, k, f in _COLUMNS) + " |" for r in rows]
  return "\n".join(lines) + "\n"
