"""runtime.quick_compiles: XLA's backend optimisation level 1 for the demo's process, never over
a level the user set, and never claimed once XLA has started (it reads XLA_FLAGS once)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.helpers import REPO


PROGRAM = """
import json, os, sys
import jax
from spot_jax import runtime
if sys.argv[1] == "after_a_compile":
  jax.jit(lambda x: x + 1)(1.0).block_until_ready()
applied = runtime.quick_compiles()
again = runtime.quick_compiles()
value = float(jax.jit(lambda x: x * 3.0 - 2.0)(2.0))  # XLA accepts the flags it was given
print(json.dumps({"applied": applied, "again": again, "flags": os.environ.get("XLA_FLAGS"),
                  "value": value}))
"""


def _run(case: str, xla_flags=None) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  if xla_flags is not None:
    env["XLA_FLAGS"] = xla_flags
  proc = subprocess.run([sys.executable, "-c", PROGRAM, case], env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("given, expected", [
    (None, "--xla_backend_optimization_level=1"),
    ("--xla_cpu_enable_fast_math=false",
     "--xla_cpu_enable_fast_math=false --xla_backend_optimization_level=1"),
])
def test_the_level_is_added_before_the_first_compile(given, expected):
  out = _run("first", given)
  assert out == {"applied": True, "again": True, "flags": expected, "value": 4.0}


def test_a_level_the_user_set_is_kept():
  out = _run("first", "--xla_backend_optimization_level=2")
  assert out == {"applied": False, "again": False, "flags": "--xla_backend_optimization_level=2",
                 "value": 4.0}


def test_nothing_is_claimed_after_xla_started():
  out = _run("after_a_compile")
  assert out == {"applied": False, "again": False, "flags": None, "value": 4.0}
