"""What `python -m spot_jax.infer` costs before its first prediction: serving a text file on the
embedded toy T5 imports neither TensorFlow nor seqio, `--timing` accounts for the time from
process start, and a persistent compilation cache gives the same predictions."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from spot_jax import embedded
from tests.helpers import REPO


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("cold")
  (root / "run" / "prompts").mkdir(parents=True)
  prompt = np.random.RandomState(0).uniform(-0.5, 0.5, (7, 128)).astype(np.float32)
  np.save(root / "run" / "prompts" / "prompt_best.npy", prompt)
  (root / "in.txt").write_text("sentiment: the food was great\nnli: a man plays . a person plays\n")
  return root


def _infer(root, *extra) -> list[str]:
  return ["--model=t5_1_1_toy", f"--checkpoint={embedded.CHECKPOINT_PATH}",
          f"--vocab={embedded.VOCAB_PATH}", f"--prompt=toy={root}/run", f"--input={root}/in.txt",
          "--input_length=32", "--target_length=6", "--batch_size=2", *extra]


def test_serving_text_imports_no_tensorflow(run_dir):
  out = run_dir / "pred.jsonl"
  code = ("import sys; from spot_jax import cli, infer; "
          "status = cli.run(infer.main, sys.argv[1:], infer.PROG); "
          "print(status, sorted(m for m in ('tensorflow', 'seqio', 'tensorflow_text') "
          "if m in sys.modules))")
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "-c", code, *_infer(run_dir, f"--output={out}")],
                        capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines()[-1] == "0 []", proc.stdout
  records = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["prompt"] for r in records] == ["toy", "toy"]


def test_timing_and_compilation_cache(run_dir):
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
  cache = run_dir / "jax_cache"
  outputs = []
  for i in range(2):  # cold cache, then warm
    out = run_dir / f"cached_{i}.jsonl"
    proc = subprocess.run([sys.executable, "-m", "spot_jax.infer",
                           *_infer(run_dir, f"--output={out}", "--timing",
                                   f"--compilation_cache_dir={cache}")],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    line = [l for l in proc.stderr.splitlines() if l.startswith("spot_jax.infer: timing:")]
    assert len(line) == 1, proc.stderr
    phases, _, first = line[0].split(": timing: ")[1].partition("; ")
    parts = {name.strip(): float(sec) for name, sec in re.findall(r"([a-z ]+) ([0-9.]+) s", phases)}
    assert list(parts) == ["process start to main", "imports and prompts", "inputs and vocabulary",
                           "backbone", "first batch", "other batches and writing"]
    first = float(re.fullmatch(r"first prediction ([0-9.]+) s after process start", first).group(1))
    assert first >= sum(list(parts.values())[:-1]) - 0.05
    outputs.append(out.read_text())
  assert any(cache.iterdir())  # the decoder's executable was stored, then read
  assert outputs[0] == outputs[1]


def test_infer_keeps_a_compilation_cache_by_default(run_dir, tmp_path):
  """Without --compilation_cache_dir: $SPOT_JAX_COMPILATION_CACHE,
  else $XDG_CACHE_HOME/spot_jax/jax; "none" (the variable or the flag) keeps nothing; an unwritable
  default is a note, not an error."""
  base = {k: v for k, v in os.environ.items() if k != "SPOT_JAX_COMPILATION_CACHE"}
  base.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")

  def infer(env, *extra):
    out = tmp_path / "pred.jsonl"
    proc = subprocess.run([sys.executable, "-m", "spot_jax.infer",
                           *_infer(run_dir, f"--output={out}",
                                  *extra)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc, out.read_text()

  _, reference = infer({**base, "SPOT_JAX_COMPILATION_CACHE": "none"})
  named = tmp_path / "named"
  _, got = infer({**base, "SPOT_JAX_COMPILATION_CACHE": str(named)})
  assert got == reference and any(named.iterdir())
  xdg = tmp_path / "xdg"
  _, got = infer({**base, "XDG_CACHE_HOME": str(xdg)})
  assert got == reference and any((xdg / "spot_jax" / "jax").iterdir())
  off = tmp_path / "off"
  infer({**base, "XDG_CACHE_HOME": str(off)}, "--compilation_cache_dir=none")
  assert not off.exists()
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  proc, got = infer({**base, "SPOT_JAX_COMPILATION_CACHE": str(blocker / "cache")})
  assert got == reference and "note: no compilation cache" in proc.stderr
