"""`benchmarks.prefix_cache` at a tiny shape: both prefills choose the same token (the bench
checks it before timing) and the cached one costs fewer FLOPs (no timing asserted)."""
from __future__ import annotations

import json

from benchmarks import prefix_cache
from spot_jax import cli


def test_the_cached_prefix_prefill_matches_and_costs_fewer_flops(tmp_path):
  out = tmp_path / "prefix.json"
  argv = ["--model=decoder_tiny_llama", "--num_layers=2", "--prompt_length=12",
          "--input_length=5", "--repeats=1", f"--json={out}"]
  assert cli.run(prefix_cache.main, argv, "benchmarks.prefix_cache") == 0
  result = json.loads(out.read_text())
  assert result["bucket"] == 8 and 0 < result["cached_gflops"] < result["prompt_gflops"]
