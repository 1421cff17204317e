"""The same 5 steps on 1 device and on 8 fake CPU devices give the same losses."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
from tests.helpers import REPO

SCRIPT = REPO / "tests" / "helpers" / "mesh_train_script.py"


def _run(out: pathlib.Path, devices: int, partitions: list[int]) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  proc = subprocess.run([sys.executable, str(SCRIPT), str(out), *map(str, partitions)], env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):])


def test_losses_match_across_meshes(tmp_path):
  single = _run(tmp_path / "one", 1, [1])["1"]
  multi = _run(tmp_path / "eight", 8, [4, 1])
  assert single["devices"] == 1
  assert multi["4"]["mesh"] == {"data": 2, "model": 4}
  assert multi["1"]["mesh"] == {"data": 8, "model": 1}
  for key in ("4", "1"):
    assert multi[key]["devices"] == 8
    np.testing.assert_allclose(multi[key]["losses"], single["losses"], rtol=0, atol=1e-5)
    assert multi[key]["prompt_replicated"], multi[key]["prompt_spec"]
    assert multi[key]["compilations"] == 1
  specs = multi["4"]["frozen_specs"]
  # The rule table: vocab, mlp, heads/joined_kv over "model"; embed replicated.
  assert specs["['token_embedder']['embedding']"] == "P('model', None)"
  assert specs["['encoder']['layers_0']['mlp']['wi_0']['kernel']"] == "P(None, 'model')"
  assert specs["['encoder']['layers_0']['mlp']['wo']['kernel']"] == "P('model', None)"
  assert specs["['encoder']['layers_0']['attention']['query']['kernel']"] == "P(None, 'model')"
  assert specs["['encoder']['layers_0']['attention']['out']['kernel']"] == "P('model', None)"
  assert specs["['decoder']['logits_dense']['kernel']"] == "P(None, 'model')"
  assert specs["['encoder']['encoder_norm']['scale']"] == "P(None,)"
