"""SPOT_JAX_MALLOC: with "keep" an XLA:CPU step's scratch block stops page-faulting in every step.

XLA:CPU mallocs each execution's temporaries as one block, by default from a worker thread, and
glibc serves a block over 32 MB with a fresh mmap every time. Each case runs in its own process
(the settings are process-wide and must precede JAX's start) and counts minor page faults of
repeated calls.
"""
import json
import os
import subprocess
import sys

import pytest

from spot_jax import runtime
from tests.helpers import REPO


# A jitted function whose temporaries (two live [4096, 1024] float32 products, 32 MiB) exceed
# glibc's largest mmap threshold; prints the minor faults of each of its 3rd to 12th calls.
PROBE = """
import json, resource, sys
import jax, jax.numpy as jnp
from spot_jax import runtime
applied = runtime.keep_heap()
x = jnp.ones((4096, 1024), jnp.float32) / 1024
w = jnp.eye(1024, dtype=jnp.float32) * 0.5
@jax.jit
def f(x, w):
  a = x @ w
  b = jnp.tanh(a) @ w
  return jnp.sum((a + b) @ w) + jnp.sum(a * b)
for _ in range(2):
  f(x, w).block_until_ready()
faults = []
for _ in range(10):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(x, w).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults,
                  "async_dispatch": jax.config.values["jax_cpu_enable_async_dispatch"]}))
"""


def _probe(mode):
  env = dict(os.environ, SPOT_JAX_MALLOC=mode, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
            "MALLOC_ARENA_MAX"):
    env.pop(k, None)
  proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_keep_removes_the_per_step_page_faults():
  block_pages = 2 * 4096 * 1024 * 4 // 4096
  system, keep = _probe("system"), _probe("keep")
  assert system["applied"] == "system" and keep["applied"] == "keep"
  assert system["async_dispatch"] and not keep["async_dispatch"]
  assert min(system["faults"]) > block_pages // 2, system  # the block is faulted in every call
  # With "keep" it stays in the heap: the heap still grows over the first calls (a block taken
  # while another is not yet freed), then the calls stop faulting.
  assert sum(f < block_pages // 20 for f in keep["faults"]) >= 6, keep
  assert sum(keep["faults"]) < sum(system["faults"]) / 3, (keep, system)


def test_bad_setting_is_one_line_and_exit_2():
  env = dict(os.environ, SPOT_JAX_MALLOC="turbo", JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  proc = subprocess.run([sys.executable, "-m", "spot_jax.report", "--help"], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
  assert (lines[-1] == "spot_jax.report: error: SPOT_JAX_MALLOC='turbo'; valid: "
                       "'keep', 'system'"), lines


def test_mode_reads_the_environment(monkeypatch):
  monkeypatch.delenv(runtime.ENV, raising=False)
  assert runtime.mode() == "keep"
  monkeypatch.setenv(runtime.ENV, " System ")
  assert runtime.mode() == "system"
  monkeypatch.setenv(runtime.ENV, "fast")
  with pytest.raises(ValueError, match="SPOT_JAX_MALLOC='fast'; valid: 'keep', 'system'"):
    runtime.mode()
