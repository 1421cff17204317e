"""`python -m benchmarks` at its tiny shape, in a process of its own.

Shared by tests/benchmarks/test_interleaved.py, tests/benchmarks/test_train_step.py. The
benchmark compiles several steps; a fresh process keeps it apart from whatever an earlier test
file left in the test worker (compiled executables, a persistent compilation cache).
"""

import json
import os
import subprocess
import sys

from tests.helpers import REPO

# The tiny shape every bench test runs at (plus its own flags).
TINY = ["--model=t5_1_1_test", "--target_length=4", "--batch_size=2", "--warmup=0",
        "--inference_steps=1"]


def run_tiny(tmp_path, *flags: str):
  """`benchmarks.train_step` at the tiny shape with `flags`, writing JSON and Markdown;
  -> (the JSON, the Markdown file's path)."""
  out, md = tmp_path / "bench.json", tmp_path / "bench.md"
  env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run([sys.executable, "-m", "benchmarks.train_step", *TINY, *flags,
                         f"--json={out}", f"--markdown={md}"], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(out.read_text()), md
