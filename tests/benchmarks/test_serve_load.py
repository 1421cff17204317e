"""`benchmarks.serve_load` at a tiny size: the arrivals it draws, the figures it reports, and
one real run of the batching server (two prompts, three requests) writing table and plot."""
from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import serve_load


def test_arrivals_are_poisson_at_the_rate_and_lengths_cover_the_range():
  reqs = serve_load.requests(np.random.RandomState(0), 4000, 2.5, 64, 8, 128)
  at = np.array([r["at"] for r in reqs])
  assert np.all(np.diff(at) > 0) and at[0] > 0
  gaps = np.diff(np.concatenate([[0.0], at]))
  assert abs(gaps.mean() - 1 / 2.5) < 0.02 and abs(gaps.std() - 1 / 2.5) < 0.03  # exponential
  lengths = [r["max_tokens"] for r in reqs]
  assert min(lengths) == 8 and max(lengths) == 128
  assert len({r["model"] for r in reqs}) == 64


def test_summary_percentiles_and_failures():
  ok = lambda ttft, gaps, n: {"ttft": ttft, "gaps": gaps, "tokens": n, "latency": 1.0,
                              "error": ""}
  rows = [ok(0.1, [0.01, 0.03], 3), ok(0.3, [0.02], 2),
          {"ttft": None, "gaps": [], "tokens": 0, "latency": None, "error": "HTTP 503"}]
  got = serve_load.summarize(rows, 2.0)
  assert got["failures"] == 1 and got["errors"] == ["HTTP 503"] and got["tokens_per_s"] == 2.5
  assert got["ttft_p50_ms"] == 200.0 and got["itl_p50_ms"] == 20.0
  assert got["ttft_p99_ms"] == round(1000 * float(np.percentile([0.1, 0.3], 99)), 1)


def test_a_tiny_run_of_the_batching_server(tmp_path):
  out = tmp_path / "out"
  assert serve_load.main(["--engines=batch", "--requests=3", "--rates=4", "--num_prompts=2",
                          "--min_tokens=2", "--max_tokens=4", f"--out={out}"]) == 0
  rows = json.loads((out / "results.json").read_text())["rows"]
  assert len(rows) == 1 and rows[0]["failures"] == 0 and rows[0]["tokens_per_s"] > 0
  assert rows[0]["ttft_p99_ms"] >= rows[0]["ttft_p50_ms"] > 0
  assert "| batch | 4.0 |" in (out / "serve_load.md").read_text()
  assert (out / "serve_load.png").read_bytes()[:4] == b"\x89PNG"


def test_a_tiny_run_of_the_peft_server(tmp_path):
  """The PEFT arm's server reads the batcher's validity masks and answers every request."""
  pytest.importorskip("torch")
  pytest.importorskip("peft")
  out = tmp_path / "out"
  assert serve_load.main(["--engines=peft", "--peft_requests=2", "--rates=4", "--num_prompts=2",
                          "--min_tokens=2", "--max_tokens=3", f"--out={out}"]) == 0
  rows = json.loads((out / "results.json").read_text())["rows"]
  assert len(rows) == 1 and rows[0]["failures"] == 0, rows[0]["errors"]
  assert rows[0]["tokens_per_s"] > 0


def test_rates_and_requests_per_model():
  args = serve_load.parse(["--models=toy,llama_3_2_1b", "--rates=toy=4,16;llama_3_2_1b=0.5",
                           "--requests=32", "--engines=toy=batch,peft;llama_3_2_1b=batch",
                           "--out=/tmp/unused"])
  assert serve_load.for_model(args.rates, "toy") == [4.0, 16.0]
  assert serve_load.for_model(args.rates, "llama_3_2_1b") == [0.5]
  assert serve_load.for_model(args.requests, "llama_3_2_1b") == [32]
  assert serve_load.for_model(args.engines, "llama_3_2_1b") == ["batch"]
  assert serve_load.for_model(args.peft_requests, "toy") == [16]
  assert args.peft_rates is None and args.num_layers == 2
  with pytest.raises(SystemExit) as refused:  # a model without rates
    serve_load.parse(["--models=toy,llama_3_2_1b", "--rates=toy=4", "--out=/tmp/unused"])
  assert refused.value.code == 2


def test_decode_steps_reach_the_continuous_server_only_when_given():
  given = serve_load.parse(["--decode_steps=2", "--out=/tmp/unused"])
  assert "--decode_steps=2" in serve_load.command("continuous", "/tmp/w", given)
  assert not any("decode_steps" in a for a in serve_load.command("batch", "/tmp/w", given))
  default = serve_load.parse(["--out=/tmp/unused"])
  assert not any("decode_steps" in a for a in serve_load.command("continuous", "/tmp/w", default))
  with pytest.raises(SystemExit):
    serve_load.parse(["--decode_steps=0", "--out=/tmp/unused"])


def _row(engine, rate, tokens, p99, load="", alone=5.0):
  return {"engine": engine, "rate": rate, "load": load, "model": "toy", "failures": 0,
          "tokens_per_s": tokens, "ttft_p99_ms": p99, "ttft_alone_ms": alone}


def test_goals_compare_throughput_at_equal_p99_ttft_and_the_half_load_ttft():
  rows = [_row("continuous", 16, 1000.0, 20.0), _row("continuous", 64, 4000.0, 300.0),
          _row("continuous", 128, 5000.0, 3000.0), _row("continuous", 40, 2500.0, 12.0, "half"),
          _row("batch", 16, 900.0, 250.0), _row("batch", 64, 3500.0, 900.0),
          _row("batch", 2, 100.0, 10.0)]
  got = serve_load.goals(rows)
  at = {g["batch_rate"]: g for g in got if "batch" in g}
  assert at[16]["continuous"] == 2500.0 and at[16]["ratio"] == round(2500 / 900, 2)  # half
  assert at[64]["continuous"] == 4000.0 and at[64]["ratio"] == round(4000 / 3500, 2)
  assert 2 not in at  # no continuous row is as quick as 10 ms
  half = [g for g in got if "alone_ms" in g]
  assert len(half) == 1 and half[0]["ratio"] == 2.4 and half[0]["rate"] == 40
  assert "| toy | p99 TTFT at half saturation / alone (<= 3x) | 40/s | 12.0 ms | 5.0 ms | 2.4 |" \
      in serve_load.markdown([{**r, "itl_p50_ms": None, "itl_p99_ms": None, "ttft_p50_ms": 1.0}
                              for r in rows], got)


def test_seconds_set_each_rates_requests_and_the_servers_queue():
  args = serve_load.parse(["--seconds=5", "--rates=2,40", "--out=/tmp/unused"])
  assert serve_load.count(args, "toy", 40.0, False) == 200
  assert serve_load.count(args, "toy", 2.0, False) == 16  # at least 16
  assert serve_load.count(args, "toy", 2.0, True) == 16  # peft: --peft_requests
  assert "--max_queue=800" in serve_load.command("batch", "/tmp/w", args)
