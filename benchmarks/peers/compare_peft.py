"""`python -m benchmarks --vs=peft`: the PyTorch + PEFT counterpart of a row, timed in a
process of its own (`benchmarks.peers.peft_train`), and the side-by-side table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional, Sequence

from spot_jax import runtime
from benchmarks import tables
from benchmarks.peers import peft_train as bench_peft
from benchmarks.common import bench_config


PEFT_COUNTERPART = {"prompt_tuning": "pt", "residual": "ptune"}


def peer_env(peer_malloc: str) -> dict:
  """The environment of a peer's process: this one's, with SPOT_JAX_MALLOC=`peer_malloc`."""
  return dict(os.environ, **{runtime.ENV: peer_malloc})


def run_peft(row: dict, steps: int, warmup: int, peak_flops: Optional[float] = None,
             peer_malloc: str = "system") -> Optional[dict]:
  """Times the PEFT counterpart of a spot-jax row in a separate process; None if it has none.

  `peer_malloc` "keep" has it apply `runtime.keep_heap()` as spot-jax does (glibc's part for
  PyTorch; both parts for t5x).
  """
  method = PEFT_COUNTERPART.get(row["prompt_method"])
  if method is None:
    return None
  shape = bench_peft.hf_shape(bench_config(row["config"], row["config_overrides"]))
  cmd = [sys.executable, "-m", "benchmarks.peers.peft_train", f"--method={method}",
         f"--shape={json.dumps(shape)}", f"--batch_size={row['batch_size']}",
         f"--input_length={row['input_length']}", f"--target_length={row['target_length']}",
         f"--prompt_length={row['prompt_length']}", f"--dropout_rate={row['dropout_rate']}",
         f"--steps={steps}", f"--warmup={warmup}"]
  if peak_flops:
    cmd.append(f"--peak_flops={peak_flops}")
  proc = subprocess.run(cmd, capture_output=True, text=True, env=peer_env(peer_malloc))
  if proc.returncode != 0:
    raise RuntimeError("the PEFT benchmark failed: "
                       f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
  peft_row = json.loads(proc.stdout.strip().splitlines()[-1])
  peft_row["speedup_of_spot_jax"] = peft_row["step_sec_median"] / row["step_sec_median"]
  return peft_row


def table(rows: Sequence[dict]) -> str:
  """spot-jax and PEFT side by side (rows that ran `--vs=peft`)."""
  peft_rows = [r for r in rows if "peft" in r]
  if not peft_rows:
    return ""
  lines = ["", "| method | spot-jax step s | PEFT method | PEFT step s | spot-jax speed-up | "
           "spot-jax MFU | PEFT MFU | PEFT MFU at spot-jax's FLOPs | spot-jax peak RSS GiB | "
           "PEFT peak RSS GiB | malloc (spot-jax / PEFT) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in peft_rows:
    p = r["peft"]
    # PEFT does the same arithmetic: its MFU if XLA's FLOP count of the same step is used.
    same_flops = {"mfu": r["mfu"] * r["step_sec_median"] / p["step_sec_median"]
                  if r.get("mfu") else None}
    lines.append(f"| {r['method']} | {r['step_sec_median']:.3f} | {p['method']} | "
                 f"{p['step_sec_median']:.3f} "
                 f"| {p['speedup_of_spot_jax']:.2f}x | {tables.cell(r, 'mfu', '{:.1%}')} | "
                 f"{tables.cell(p, 'mfu', '{:.1%}')} "
                 f"| {tables.cell(same_flops, 'mfu', '{:.1%}')} | "
                 f"{r['peak_host_memory_bytes'] / 2**30:.2f} "
                 f"| {p['peak_host_memory_bytes'] / 2**30:.2f} | {r.get('malloc', '?')} / "
                 f"{p.get('malloc', '?')} |")
  return "\n".join(lines) + "\n"
