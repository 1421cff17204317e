"""`python -m benchmarks`: an MFU is never reported above 100% (the matmul peak is sampled
through the run), and one interleaved run pairs methods at several input lengths with their
FLOP ratio beside the time ratio (no timing asserted)."""

import numpy as np
import pytest

from benchmarks import common
from benchmarks import tables
from benchmarks import train_step as bench
from tests.helpers.bench_tiny import run_tiny


def test_mfu_above_100_percent_is_flagged_not_reported():
  assert common.mfu(50.0, 1.0, 100.0) == {"mfu": 0.5}
  assert common.mfu(100.0, 1.0, 100.0) == {"mfu": 1.0}
  assert common.mfu(120.0, 1.0, 100.0) == {"mfu": None, "mfu_flagged": pytest.approx(1.2)}
  assert common.mfu(None, 1.0, 100.0) == {"mfu": None}
  assert common.mfu(50.0, 1.0, None) == {"mfu": None}
  row = {"mfu": None, "mfu_flagged": 1.2}
  assert tables.cell(row, "mfu", "{:.1%}") == "flagged (>100%)"


def test_matmul_peak_keeps_every_sample_and_its_maximum():
  peak = common.MatmulPeak(n=64)
  values = [peak.sample(2) for _ in range(4)]
  assert peak.samples == values and peak.max == max(values) > 0


def test_interleaved_input_lengths_pair_per_length(tmp_path):
  meta, md = run_tiny(tmp_path, "--steps=2", "--input_lengths=8,16", "--prompt_length=8",
                      "--methods=prompt_tuning,smop4x5", "--interleave")
  rows = meta["rows"]
  assert [(r["method"], r["input_length"]) for r in rows] == [
      ("prompt_tuning", 8), ("smop4x5", 8), ("prompt_tuning", 16), ("smop4x5", 16)]
  for first, other in (rows[:2], rows[2:]):
    assert first["paired_step_ratio"] == 1.0 and first["flop_ratio"] == 1.0
    assert other["paired_with"] == "prompt_tuning"
    assert other["paired_step_ratio"] == pytest.approx(np.median(
        np.asarray(other["step_sec_all"]) / np.asarray(first["step_sec_all"])))
    assert other["flop_ratio"] == pytest.approx(other["flops_per_step"] / first["flops_per_step"])
  # SMoP 4x5 sends 5 prompt tokens against 8: fewer FLOPs, and the gap narrows with the input.
  assert rows[1]["flop_ratio"] < rows[3]["flop_ratio"] < 1.0
  # Every MFU divides by the largest peak sample (one before and one after each timed step).
  assert len(meta["matmul_peak_samples"]) == 1 + 2 * 4
  assert meta["matmul_peak_flops_per_sec"] == max(meta["matmul_peak_samples"])
  for r in rows:
    assert r["matmul_peak_flops_per_sec"] == meta["matmul_peak_flops_per_sec"]
    assert r["mfu"] == pytest.approx(r["flops_per_step"] / r["step_sec_median"]
                                     / meta["matmul_peak_flops_per_sec"])
  text = md.read_text()
  assert "smop4x5 / prompt_tuning at 16 input tokens: step time" in text and "FLOPs 0." in text


def test_input_lengths_must_be_integers(capsys):
  from spot_jax import cli  # pylint: disable=import-outside-toplevel
  assert cli.run(bench.main, ["--input_lengths=64,x"], "benchmarks") == cli.EXIT_USER_ERROR
  assert "--input_lengths='64,x' is not a comma-separated list" in capsys.readouterr().err
