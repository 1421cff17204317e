"""`python -m benchmarks.serve` at a tiny shape: every mixed row equals the one-prompt path
before it is timed, the PEFT peer serves the same requests with the same weights and agrees,
and `--vs=peft` without torch skips with a reason (no timing asserted)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import serve, serve_workload
from spot_jax.errors import ConfigError
from tests.helpers import REPO

TINY = ["--model=t5_1_1_test", "--workloads=4x2,2x4,1x8", "--batch_size=4", "--input_length=12",
        "--target_length=5", "--repeats=1"]


def _rows(path) -> list[dict]:
  return json.loads(pathlib.Path(path).read_text())["rows"]


def test_mixed_rows_equal_one_prompt_and_peft_agrees(tmp_path):
  out, md = tmp_path / "serve.json", tmp_path / "serve.md"
  assert serve.main(TINY + ["--methods=pt20,smop4x5", "--tasks=generate,score,beam", "--vs=peft",
                            f"--json={out}", f"--markdown={md}"]) == 0
  rows = _rows(out)
  mixed = [r for r in rows if r["way"] == "mixed"]
  assert len(mixed) == 2 * 3 * 3  # methods x workloads x tasks
  for r in mixed:
    check = r["checked_against_one_prompt"]
    assert check["identical"] and check["agree"] == check["of"] == 8, r
    if r["task"] == "score":
      assert check["max_score_diff"] <= serve.SCORE_TOLERANCE
    assert r["distinct_predictions"] > 2  # the check compares real answers, not one repeated
  for r in rows:
    assert r["requests"] == 8 and r["examples_per_sec"] > 0
    assert r["latency_p50_sec"] <= r["latency_p95_sec"] <= r["pass_sec_median"] + 1e-9
    assert (r["generated_tokens"] is None) == (r["task"] == "score")
  one = {(r["method"], r["workload"], r["task"]): r for r in rows if r["way"] == "one-prompt"}
  # One prompt at a time: 4x2 takes 4 calls of 2 rows; mixed takes 2 calls of 4.
  assert one[("pt20", "4x2", "generate")]["calls_per_pass"] == 4
  assert one[("pt20", "4x2", "generate")]["batch_rows"] == 2
  assert all(r["calls_per_pass"] == 2 and r["batch_rows"] == 4 for r in mixed)
  # PEFT: Prompt Tuning rows only (no SMoP in PEFT), the same predictions for greedy and labels.
  peft = [r for r in rows if r["way"] == "peft"]
  assert ({(r["method"], r["task"]) for r in peft}
          == {("pt20", t) for t in ("generate", "score", "beam")})
  for r in peft:
    assert r["adapters_loaded"] == 4
    if r["task"] != "beam":  # beam search: PEFT ranks by another length penalty
      assert r["agreement_with_mixed"]["agree"] == 8, r
  assert (sum(l.startswith("| pt20 ")
              or l.startswith("| smop4x5 ") for l in md.read_text().splitlines()) == len(rows))


def test_peft_absent_skips_with_a_reason(tmp_path):
  out = tmp_path / "serve.json"
  code = ("import sys, runpy; sys.modules['torch'] = None; sys.argv[0] = 'serve'; "
          "runpy.run_module('benchmarks.serve', run_name='__main__')")
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", code] + TINY + [
      "--workloads=2x2", "--methods=pt20", "--tasks=score", "--vs=peft", f"--json={out}"],
      capture_output=True, text=True, env=env, cwd=REPO)
  assert proc.returncode == 0, proc.stderr
  assert "--vs=peft: torch not installed" in proc.stdout
  meta = json.loads(out.read_text())
  assert meta["peft_skipped"].startswith("torch not installed")
  assert {r["way"] for r in meta["rows"]} == {"mixed", "one-prompt"}


def test_compare_finds_a_difference():
  assert serve.compare("generate", [[5, 1], [7]], [[5, 1], [7]])["identical"]
  assert serve.compare("generate", [[5, 1], [7]], [[5, 1], [8]])["agree"] == 1
  scores = [np.array([-1.0, -2.0])]
  assert serve.compare("score", scores, [scores[0] + 5e-5])["identical"]
  assert not serve.compare("score", scores, [scores[0] + 1e-3])["identical"]  # same label
  assert serve.compare("score", scores, [np.array([-2.0, -1.0])])["agree"] == 0


def test_workload_queue():
  w = serve_workload.make_workload("3x4", ["a", "b", "c", "d"], 50, 10, 2, 3, seed=0)
  assert w.num_requests == 12 and sorted(set(w.request_prompts)) == ["a", "b", "c"]
  assert [n for n, _ in serve_workload.prompt_groups(w)] == list(dict.fromkeys(w.request_prompts))
  assert all(len(idx) == 4 for _, idx in serve_workload.prompt_groups(w))
  lengths = (w.tokens > 0).sum(1)
  assert lengths.min() >= 5 and lengths.max() <= 10
  assert all(row[n - 1] == serve_workload.EOS_ID and row[:n - 1].min() >= 3
             for row, n in zip(w.tokens, lengths))
  assert w.labels.shape == (2, 4) and (w.labels[:, 3] == 1).all()
  again = serve_workload.make_workload("3x4", ["a", "b", "c", "d"], 50, 10, 2, 3, seed=0)
  np.testing.assert_array_equal(again.tokens, w.tokens)
  assert serve_workload.until_eos([4, 0, 1, 0, 0]) == [4, 0, 1]
  assert serve_workload.until_eos([4, 5]) == [4, 5]


def test_workload_needs_enough_prompts():
  with pytest.raises(ConfigError, match="needs 5 prompts, 4 built"):
    serve_workload.make_workload("5x1", ["a", "b", "c", "d"], 50, 10, 2, 3, seed=0)


def test_end_to_end_processes_write_the_same_predictions(tmp_path):
  """`bench.serve_e2e` on the embedded toy T5: infer (no cache, warm cache) and the PEFT script,
  whole processes on one JSONL file, write identical predictions."""
  pytest.importorskip("peft")
  from benchmarks import serve_e2e  # pylint: disable=import-outside-toplevel
  out = tmp_path / "e2e.json"
  assert serve_e2e.main(["--workloads=3x2", "--repeats=1", "--cold_start_repeats=0",
                         "--batch_size=4", f"--output_dir={tmp_path / 'work'}",
                         f"--json={out}"]) == 0
  row = json.loads(out.read_text())["rows"][0]
  assert row["requests"] == 6 and row["identical_predictions"] == 6 and row["warm_equals_cold"]
  for k in ("cold", "warm", "peft"):
    assert 0 < row[f"{k}_first_prediction_sec"] <= row[f"{k}_wall_sec"]
  preds = [json.loads(l) for l in (tmp_path / "work" / "3x2.cold.jsonl").read_text().splitlines()]
  assert sorted({p["prompt"] for p in preds}) == ["p0", "p1", "p2"]
  assert len({p["prediction"] for p in preds}) > 1  # not one degenerate answer
