"""Loading a bfloat16 checkpoint never holds a float32 copy of the model on the host.

A random decoder of ~50M parameters is written as a bfloat16 Hugging Face directory
(config.json `dtype` "bfloat16"); a fresh process loads it with FROZEN_DTYPE None (the
checkpoint's: bfloat16) and reports its resident memory: the peak growth over the load (Linux's
VmHWM, reset just before it) must stay under 1.5 x the checkpoint's bytes. Reading every tensor
as float32 first, then placing it, peaks above 3 x (float32 copy + placed copy), so the check
fails on that path.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from spot_jax.backbones.decoder import checkpoints, network
from spot_jax.backbones.decoder.config import DecoderConfig
from spot_jax import models

CONFIG = DecoderConfig(vocab_size=4096, emb_dim=512, num_heads=8, num_kv_heads=4, num_layers=12,
                       head_dim=64, mlp_dim=2048, bos_id=1, eos_id=2)

_LOAD = """
import json, sys
import jax, numpy as np
jax.device_put(np.zeros(4))  # the backend is up before the measure starts
from spot_jax.backbones.decoder import checkpoints
def status(key):
  return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
before = status("VmRSS")
config, params = checkpoints.load_checkpoint(sys.argv[1])
jax.block_until_ready(params)
leaves = jax.tree.leaves(params)
print(json.dumps({"growth": status("VmHWM") - before, "param_dtype": config.param_dtype,
                  "dtypes": sorted({str(x.dtype) for x in leaves}),
                  "nbytes": sum(x.nbytes for x in leaves)}))
"""


def _linux_peak_reset() -> bool:
  try:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
      f.write("5")
    return True
  except OSError:
    return False


@pytest.mark.skipif(not _linux_peak_reset(), reason="needs Linux's /proc/self/clear_refs")
def test_bfloat16_load_stays_near_the_checkpoint_size(tmp_path):
  shapes = models.unbox(network.abstract_params(CONFIG))
  rs = np.random.RandomState(0)
  params = jax.tree.map(lambda s: (rs.standard_normal(s.shape) * 0.02).astype(np.float32), shapes)
  folder = checkpoints.save_hf_dir(str(tmp_path / "bf16"), CONFIG, params, dtype="bfloat16")
  del params
  assert checkpoints.stored_dtype(folder) == "bfloat16"
  size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
             if f.endswith(".safetensors"))
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _LOAD, folder], capture_output=True, text=True,
                       env=env, check=True, timeout=300)
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert got["dtypes"] == ["bfloat16"] and got["param_dtype"] is None
  assert abs(got["nbytes"] - size) < 0.01 * size  # the placed tree is the checkpoint's size
  assert got["growth"] < 1.5 * size, (got["growth"] / 2**20, size / 2**20)
