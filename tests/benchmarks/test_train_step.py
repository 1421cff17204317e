"""The benchmark runs and reports what trains (no timing assertions here)."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from spot_jax import cli
from benchmarks import train_step as bench
from tests.helpers.bench_tiny import TINY, run_tiny


# One sequential run at the tiny shape builds every method the row tests below read (each build
# compiles a train step and a scoring step); with peft installed, the Prompt Tuning and
# Residual rows also time their PEFT counterparts (--vs=peft, the peer in spot-jax's malloc).
METHODS = ("prompt_tuning", "smop4x5", "model_tuning", "dept", "smop", "residual_smop", "attempt",
           "mpt", "mpt_distill", "residual10")
SHAPE = ["--steps=2", "--input_length=16", "--prompt_length=8"]
HAS_PEFT = importlib.util.find_spec("peft") is not None


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
  """(the JSON, the Markdown text, rows by method) of the shared run."""
  peers = ["--vs=peft", "--peer_malloc=keep"] if HAS_PEFT else []
  meta, md = run_tiny(tmp_path_factory.mktemp("bench"), *SHAPE,
                      f"--methods={','.join(METHODS)}", *peers)
  return meta, md.read_text(), {r["method"]: r for r in meta["rows"]}


def test_bench_rows(bench_run):
  meta, text, rows = bench_run
  assert list(rows) == list(METHODS)
  assert rows["prompt_tuning"]["trainable_params"] == 8 * 32
  assert rows["smop4x5"]["prompt_length"] == 20
  assert rows["model_tuning"]["frozen_params"] == 0
  assert rows["prompt_tuning"]["frozen_params"] == rows["model_tuning"]["trainable_params"]
  for row in rows.values():
    assert row["step_sec_min"] <= row["step_sec_median"] <= row["step_sec_max"]
    assert row["timing"] == "sequential" and len(row["step_sec_all"]) == row["steps"] == 2
    assert "paired_step_ratio" not in row
    assert row["compile_sec"] < row["compile_plus_first_step_sec"]
    assert row["flops_per_step"] > 0 and 0 < row["mfu"]
    assert row["tokens_per_sec"] == pytest.approx(row["examples_per_sec"] * 20)
    assert row["malloc"] == "keep"  # the command line's heap mode (`runtime.keep_heap`)
  # Model tuning also back-propagates into every weight: more FLOPs than prompt tuning (8 tokens).
  assert rows["model_tuning"]["flops_per_step"] > rows["prompt_tuning"]["flops_per_step"]
  table = text.split("\n\n")[1].splitlines()  # the rows' table (a PEFT table may follow)
  assert len([l for l in table if l.startswith("| ")]) == 1 + len(rows)
  assert meta["matmul_peak_flops_per_sec"] > 0


def test_dept_and_residual_smop_rows(bench_run):
  """Their rows train the papers' parameter counts and cost more FLOPs than PT / SMoP alone."""
  _, _, rows = bench_run
  e = 32
  assert rows["dept"]["trainable_params"] == 8 * e + 16 * 30 + 30 * e  # m E + s r + r E, s = 16
  mlp = 2 * e * 128 + 128 + 3 * e  # Residual's MLP at the bench's bottleneck 128
  assert rows["residual_smop"]["trainable_params"] == 4 * 2 * e + e * 4 + mlp
  assert rows["dept"]["prompt_length"] == rows["prompt_tuning"]["prompt_length"] == 8
  assert rows["dept"]["flops_per_step"] > rows["prompt_tuning"]["flops_per_step"]
  assert rows["residual_smop"]["flops_per_step"] > rows["smop"]["flops_per_step"]


def test_interleaved_rows_pair_each_round(tmp_path):
  meta, md = run_tiny(tmp_path, "--steps=3", "--input_length=16", "--prompt_length=8",
                      "--methods=prompt_tuning,smop4x5,prompt_tuning", "--interleave")
  rows = meta["rows"]
  assert [r["method"] for r in rows] == ["prompt_tuning", "smop4x5", "prompt_tuning"]
  first = np.asarray(rows[0]["step_sec_all"])
  for row in rows:
    times = np.asarray(row["step_sec_all"])
    assert row["timing"] == "interleaved" and row["paired_with"] == "prompt_tuning"
    assert row["steps"] == len(times) == 3 and row["step_sec_median"] == np.median(times)
    assert row["paired_step_ratio"] == pytest.approx(np.median(times / first))
  assert rows[0]["paired_step_ratio"] == 1.0
  # The same method twice: the same program, the same FLOPs and the same trained prompt.
  assert rows[2]["flops_per_step"] == rows[0]["flops_per_step"]
  assert rows[2]["final_loss"] == rows[0]["final_loss"]
  assert rows[1]["final_loss"] != rows[0]["final_loss"]
  text = md.read_text()
  assert "smop4x5 / prompt_tuning at 16 input tokens: " in text and "3 interleaved rounds" in text


def test_round_order_alternates():
  assert [bench.round_order(3, r) for r in range(3)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2]]


def test_xla_flops_counts_a_matmul():
  import jax
  import jax.numpy as jnp
  x = jnp.ones((64, 32), jnp.float32)
  compiled = jax.jit(lambda a, b: a @ b).lower(x, x.T).compile()
  assert bench.xla_flops(compiled) == pytest.approx(2 * 64 * 32 * 64, rel=0.01)


def test_bench_checks_its_output_files_before_measuring(tmp_path, capsys):
  """A bad --json or --markdown stops the run at once (not after minutes of timing); an
  existing file there is left as it was."""
  (tmp_path / "old.json").write_text("previous")
  for args, message in [([f"--json={tmp_path}/no_dir/b.json"], "no_dir' does not exist"),
                        ([f"--json={tmp_path}/old.json", f"--markdown={tmp_path}"],
                         "is a directory")]:
    assert cli.run(bench.main, ["--methods=pt100", *args], "benchmarks") == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err
  assert (tmp_path / "old.json").read_text() == "previous"


def test_bench_command_line_error_is_one_line():
  proc = subprocess.run([sys.executable, "-m", "benchmarks", "--methods=lora"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]


@pytest.mark.skipif(not HAS_PEFT, reason="peft is not installed")
def test_vs_peft_reports_the_counterparts(bench_run):
  meta, text, rows = bench_run
  assert [m for m, r in rows.items() if "peft" in r] == ["prompt_tuning", "residual10"]
  pt, ptune = rows["prompt_tuning"]["peft"], rows["residual10"]["peft"]
  assert (pt["method"], ptune["method"]) == ("pt", "ptune")
  assert pt["trainable_params"] == rows["prompt_tuning"]["trainable_params"] == 8 * 32
  assert ptune["prompt_length"] == 10 and ptune["trainable_params"] > 10 * 32
  assert (pt["speedup_of_spot_jax"]
          == pytest.approx(pt["step_sec_median"] / rows["prompt_tuning"]["step_sec_median"]))
  assert "| prompt_tuning |" in text and "PEFT step s" in text
  peak = meta["matmul_peak_flops_per_sec"]
  # torch's own FLOP count of a train step, and the MFU against the same peak
  for row in (pt, ptune):
    assert row["flops_per_step"] > 0
    assert row["mfu"] == pytest.approx(row["flops_per_step"] / row["step_sec_median"] / peak)
  assert "PEFT MFU" in text
  # --peer_malloc=keep: SPOT_JAX_MALLOC=keep in its env
  assert pt["malloc"] == ptune["malloc"] == "keep"


def test_bench_peft_rejects_bad_shape():
  proc = subprocess.run([sys.executable, "-m", "benchmarks.peers.peft_train", "--method=pt",
                         "--shape={"],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().startswith("benchmarks.peers.peft_train: error: --shape is not JSON")


def test_cpu_devices_runs_the_data_parallel_mesh(bench_run, tmp_path):
  """--cpu_devices=2 splits the batch over two CPU devices: the one-device run's losses and
  whole-step FLOPs (the shared run's Prompt Tuning row, the same flags on one device)."""
  out = tmp_path / "d2.json"
  proc = subprocess.run([sys.executable, "-m", "benchmarks", *TINY, *SHAPE,
                         "--methods=prompt_tuning", "--cpu_devices=2", f"--json={out}"],
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = {1: bench_run[2]["prompt_tuning"], 2: json.loads(out.read_text())["rows"][0]}
  assert (rows[1]["devices"], rows[2]["devices"]) == (1, 2)
  assert rows[1]["batch_size"] == rows[2]["batch_size"] == 2 and rows[1]["steps"] == 2
  assert rows[2]["final_loss"] == pytest.approx(rows[1]["final_loss"], rel=1e-5)
  assert rows[2]["flops_per_step"] == pytest.approx(rows[1]["flops_per_step"], rel=0.05)
  bad = subprocess.run([sys.executable, "-m", "benchmarks", "--batch_size=4", "--cpu_devices=3"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert bad.returncode == 2 and "Traceback" not in bad.stderr
  assert bad.stderr.strip() == ("benchmarks: error: --batch_size=4 must be divisible by the 3 "
                                "devices (--cpu_devices)")


def test_bench_rows_of_attempt_and_mpt(bench_run):
  """ATTEMPT, an MPT target and MPT's distillation step: the papers' parameter counts, and the
  extra FLOPs each adds to Prompt Tuning of the same length (the distillation's teacher pass)."""
  _, _, rows = bench_run
  e, m, r = 32, 8, 100  # t5_1_1_test width; bench ATTEMPT: 6 sources, attention width 100
  assert rows["attempt"]["trainable_params"] == m * e + 2 * e * r + 2 * e
  assert rows["mpt"]["trainable_params"] == m * e + (m + e)  # P* and u, v (rank 1)
  assert rows["mpt_distill"]["trainable_params"] == m * e + 2 * (m + e)  # two source tasks
  flops = {k: v["flops_per_step"] for k, v in rows.items()}
  assert flops["prompt_tuning"] < flops["mpt"] < flops["attempt"] < flops["mpt_distill"]
  # The teacher's forward pass: more than a tenth of a train step, less than a whole one.
  assert 1.1 * flops["prompt_tuning"] < flops["mpt_distill"] < 2 * flops["prompt_tuning"]
