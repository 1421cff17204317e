"""`python -m benchmarks.runs`: K runs in one step, reported per K (no timing assertions)."""
import json
import subprocess
import sys

import pytest

from benchmarks import runs as bench_runs
from tests.helpers import REPO


def test_rows_per_k_with_flops_growing_with_k(tmp_path):
  out, md = tmp_path / "runs.json", tmp_path / "runs.md"
  assert bench_runs.main(["--models=t5_1_1_test", "--method=pt20", "--runs=2,3", "--steps=2",
                          "--warmup=0", "--batch_size=2", "--input_length=16", "--target_length=4",
                          f"--json={out}", f"--markdown={md}"]) == 0
  rows = json.loads(out.read_text())
  assert [r["runs"] for r in rows] == [1, 2, 3]  # the single run is always the baseline
  one = rows[0]
  assert one["wall_vs_one"] == 1.0
  for row in rows:
    assert len(row["step_sec_all"]) == row["steps"] == 2
    assert row["sec_per_run"] == pytest.approx(row["step_sec_median"] / row["runs"])
    assert row["examples_per_sec"] == pytest.approx(row["runs"] * 2 / row["step_sec_median"])
    # The K-run step does K runs' arithmetic (the frozen weights are read once, not multiplied):
    # XLA's FLOP count grows in proportion to K.
    assert row["flops_per_step"] == pytest.approx(row["runs"] * one["flops_per_step"], rel=0.02)
    # Each run keeps its own optimizer state; the frozen backbone is one copy for all K.
    assert row["trainable_state_bytes"] == row["runs"] * one["trainable_state_bytes"]
    assert row["frozen_params"] == one["frozen_params"]
  table = md.read_text().splitlines()
  assert len([line for line in table if line.startswith("| t5_1_1_test")]) == 3


@pytest.mark.parametrize("args,message", [
    (["--runs=0"], "--runs='0': entry 0 (0) must be >= 1"),
    (["--models=t5_nope"], "t5_nope"),
    (["--method=lora"], "entry 0 ('lora') is unknown"),
    (["--method=model_tuning", "--models=t5_1_1_test", "--steps=1"],
     "K runs share a frozen backbone"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
  proc = subprocess.run([sys.executable, "-m", "benchmarks.runs", *args,
                         f"--json={tmp_path / 'r.json'}"], cwd=REPO, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("benchmarks.runs: error: "), proc.stderr
  assert message in lines[0]
  assert not (tmp_path / "r.json").exists()
