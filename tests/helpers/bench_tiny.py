"""`benchmarks` at its tiny shape, in this process.

Shared by tests/benchmarks/test_interleaved.py, tests/benchmarks/test_train_step.py.
"""

import json

from benchmarks import train_step as bench

# The tiny shape every in-process bench test runs at (plus its own flags).
TINY = ["--model=t5_1_1_test", "--target_length=4", "--batch_size=2", "--warmup=0",
        "--inference_steps=1"]


def run_tiny(tmp_path, *flags: str):
  """`benchmarks` in this process at the tiny shape with `flags`, writing JSON and Markdown;
  -> (the JSON, the Markdown file's path)."""
  out, md = tmp_path / "bench.json", tmp_path / "bench.md"
  assert bench.main([*TINY, *flags, f"--json={out}", f"--markdown={md}"]) == 0
  return json.loads(out.read_text()), md
