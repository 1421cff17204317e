"""`benchmarks --vs=t5x`: t5x's train step beside spot-jax's own, on a Prompt Tuning row's shape.

The t5x side runs in its own process (`python -m benchmarks.peers.t5x_train`; nothing here
imports t5x) and times t5x's `Trainer` step for two models: google-research/prompt-tuning's
(row key "t5x") and spot-jax's contrib model, what `t5x.train` runs with gin/t5x (row key
"t5x_contrib"). With `interleave` that process also builds spot-jax's own step
("t5x_process_spot_jax") and times the three in interleaved rounds, so each t5x row carries
`paired_step_ratio`: its step time over spot-jax's in the same round (median), which a drifting
machine does not skew.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional, Sequence

from spot_jax import cli
from spot_jax import runtime
from benchmarks import common
from spot_jax.errors import ConfigError

# The peer's row "model" -> the key under the spot-jax row, and the table's framework name.
ROW_KEYS = {"prompt_tuning": "t5x", "contrib": "t5x_contrib", "spot-jax": "t5x_process_spot_jax"}
NAMES = {"t5x": "t5x + prompt-tuning", "t5x_contrib": "t5x + spot-jax contrib",
         "t5x_process_spot_jax": "spot-jax (in t5x's process)"}


def run_t5x(row: dict, steps: int, warmup: int, compilation_cache_dir: str = "",
            peer_malloc: str = "system", interleave: bool = False) -> Optional[dict]:
  """Times t5x's step of both models on a spot-jax Prompt Tuning row's shape in a separate process.

  Returns {ROW_KEYS value: peer row} (None for rows of other methods); each peer row gets
  `speedup_of_spot_jax` (its median step time over `row`'s) and `compile_plus_first_step_ratio`.
  `peer_malloc` "keep" gives the peer spot-jax's host-memory setting (default: t5x's own).

  Raises:
    ConfigError: when t5x is not importable (the peer's one-line error).
  """
  if row["prompt_method"] != "prompt_tuning":
    return None
  shape = common.t5x_shape(common.bench_config(row["config"], row["config_overrides"]))
  cmd = [sys.executable, "-m", "benchmarks.peers.t5x_train", f"--shape={json.dumps(shape)}",
         f"--batch_size={row['batch_size']}", f"--input_length={row['input_length']}",
         f"--target_length={row['target_length']}", f"--prompt_length={row['prompt_length']}",
         f"--dropout_rate={row['dropout_rate']}", f"--steps={steps}", f"--warmup={warmup}",
         f"--compilation_cache_dir={compilation_cache_dir or ''}", "--models=prompt_tuning,contrib"]
  if interleave:
    cmd += ["--spot_jax_step", "--interleave"]
  if row["dropout_rng"] == "unsafe_rbg":
    cmd.append("--use_hardware_rng")  # t5x's USE_HARDWARE_RNG: the same RNG for the dropout masks
  proc = subprocess.run(cmd, capture_output=True, text=True,
                        env=dict(os.environ, **{runtime.ENV: peer_malloc}))
  if proc.returncode != 0:
    last = (proc.stderr.strip().splitlines() or ["?"])[-1]
    if proc.returncode == cli.EXIT_USER_ERROR:
      raise ConfigError(last.split(": error: ", 1)[-1])
    raise RuntimeError(f"the t5x benchmark failed: {last}")
  result = {}
  for peer in json.loads(proc.stdout.strip().splitlines()[-1])["rows"]:
    peer["speedup_of_spot_jax"] = peer["step_sec_median"] / row["step_sec_median"]
    peer["compile_plus_first_step_ratio"] = (row["compile_plus_first_step_sec"]
                                             / peer["compile_plus_first_step_sec"])
    result[ROW_KEYS[peer["model"]]] = peer
  return result


def summary_lines(row: dict) -> list[str]:
  """What `benchmarks` prints for a row with t5x peers: one line per t5x model."""
  lines = []
  for key in ("t5x_contrib", "t5x"):
    if key in row:
      peer = row[key]
      paired = (f"; paired in t5x's process: {peer['paired_step_ratio']:.3f}x spot-jax's step"
                if "paired_step_ratio" in peer else "")
      lines.append(f"{NAMES[key]} for {row['method']}: {peer['step_sec_median']:.3f} s/step, "
                   f"compile+1st {peer['compile_plus_first_step_sec']:.1f} s; spot-jax "
                   f"{peer['speedup_of_spot_jax']:.2f}x faster per step{paired}")
  return lines


def table(rows: Sequence[dict]) -> str:
  """spot-jax and the t5x rows side by side; compile phases are differences
  of cumulative timestamps."""
  groups = [(r, [("spot-jax", r)]
             + [(NAMES[k], r[k]) for k in ("t5x_process_spot_jax", "t5x_contrib", "t5x")
                if k in r]) for r in rows if "t5x" in r]
  if not groups:
    return ""
  lines = ["", "| method | framework | step s (median) | spot-jax speed-up | step / spot-jax step, "
           "paired | trace+lower s | XLA compile s | first step s | compile+1st s | StableHLO ops "
           "| optimized HLO ops | GFLOP/step | peak RSS GiB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for ours, members in groups:
    for name, r in members:
      speedup = "1.00x" if r is ours else f"{r['speedup_of_spot_jax']:.2f}x"
      paired = (f"{r['paired_step_ratio']:.3f}"
                if r is not ours and "paired_step_ratio" in r else "-")
      lines.append(
          f"| {ours['method']} | {name} | {r['step_sec_median']:.3f} | {speedup} | {paired} "
          f"| {r['lower_sec']:.1f} | {r['compile_sec'] - r['lower_sec']:.1f} "
          f"| {r['compile_plus_first_step_sec'] - r['compile_sec']:.1f} "
          f"| {r['compile_plus_first_step_sec']:.1f} | {r['hlo_ops']['stablehlo']:,} "
          f"| {r['hlo_ops']['optimized_hlo']:,} | {(r['flops_per_step'] or 0) / 1e9:.1f} "
          f"| {r['peak_host_memory_bytes'] / 2**30:.2f} |")
  return "\n".join(lines) + "\n"
