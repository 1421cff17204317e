"""What the HTTP serving tests share: toy prompts of five methods (for the toy T5, and for a tiny
random decoder-only model), and the real server in a subprocess on 127.0.0.1 (a free port the
server picks and prints)."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request
from typing import Optional, Sequence

import numpy as np

from spot_jax import embedded, fileio
from spot_jax.serve.export import peft_causal, peft_io
from spot_jax.backbones.decoder import config as decoder_config
from spot_jax.backbones.t5 import config_by_name
from spot_jax.train import checkpointer
from tests.helpers import REPO

CONFIG = config_by_name(embedded.CONFIG_NAME, dropout_rate=0.0)
CHECKPOINT = embedded.CHECKPOINT_PATH
BACKBONE = [f"--model={embedded.CONFIG_NAME}", f"--checkpoint={CHECKPOINT}",
            f"--vocab={embedded.VOCAB_PATH}"]
OFFSET = 16  # the DePT prompt offsets this many input positions
DECODER_BACKBONE = ["--model=decoder_tiny_gemma3", "--seed=0", "--vocab=byte"]


def _run(root: pathlib.Path, name: str) -> checkpointer.Checkpointer:
  return checkpointer.Checkpointer(str(root / name))


def make_prompts(root: pathlib.Path) -> dict[str, str]:
  """Five prompts of different methods for the embedded toy T5 -> {name: path}: Prompt Tuning
  (.npy), SMoP (run directory with its router), a PEFT prompt-tuning adapter, a PEFT
  prefix-tuning adapter (per-layer decoder prefixes) and DePT (run directory, prompt + input
  offset)."""
  rs = np.random.RandomState(0)
  normal = lambda scale, *shape: rs.normal(0, scale, shape).astype(np.float32)
  e = CONFIG.emb_dim
  np.save(root / "pt.npy", normal(0.5, 4, e))
  run = _run(root, "smop_run")
  smop = {"prompts": normal(0.5, 3, 2, e), "router": {"kernel": normal(3.0, e, 3)}}
  run.save_best(7, {"params": {"prompt": smop}, "step": np.int32(7)}, "accuracy", 0.5)
  fileio.save_npy(run.run_dir.prompt_path("best"), smop["prompts"])
  run.close()
  peft_io.export_adapter(normal(0.5, 5, e), CONFIG, str(root / "peft_pt"))
  kv = normal(0.5, CONFIG.num_decoder_layers, 2, 3, CONFIG.num_heads, CONFIG.head_dim)
  peft_io.export_prefix_adapter({"decoder": kv}, CONFIG, str(root / "peft_prefix"))
  run = _run(root, "dept_run")
  fileio.save_npy(run.run_dir.prompts / "prompt_step_5.npy", normal(0.5, 3, e))
  fileio.save_npy(run.run_dir.prompts / "offset_step_5.npy", normal(0.3, OFFSET, e))
  run.close()
  return {"pt": str(root / "pt.npy"), "smop": str(root / "smop_run"),
          "peft": str(root / "peft_pt"), "prefix": str(root / "peft_prefix"),
          "dept": str(root / "dept_run")}


def make_decoder_prompts(root: pathlib.Path) -> dict[str, str]:
  """Five prompts of different methods for a random decoder_tiny_gemma3 -> {name: path}: Prompt
  Tuning (.npy), SMoP (run directory with its router), a PEFT CAUSAL_LM prompt-tuning adapter,
  a PEFT CAUSAL_LM prefix-tuning adapter (per-layer prefixes) and DePT (run directory, prompt +
  input offset)."""
  cfg = decoder_config.config_by_name("decoder_tiny_gemma3")
  rs = np.random.RandomState(1)
  normal = lambda scale, *shape: rs.normal(0, scale, shape).astype(np.float32)
  e = cfg.emb_dim
  np.save(root / "pt.npy", normal(1.0, 4, e))
  run = _run(root, "smop_run")
  smop = {"prompts": normal(1.0, 3, 2, e), "router": {"kernel": normal(3.0, e, 3)}}
  run.save_best(7, {"params": {"prompt": smop}, "step": np.int32(7)}, "accuracy", 0.5)
  fileio.save_npy(run.run_dir.prompt_path("best"), smop["prompts"])
  run.close()
  peft_causal.export_prompt_adapter(normal(1.0, 5, e), cfg, str(root / "peft_pt"))
  kv = normal(1.0, cfg.num_layers, 2, 3, cfg.num_kv_heads, cfg.head_dim)
  peft_causal.export_prefix_adapter(kv, cfg, str(root / "peft_prefix"))
  run = _run(root, "dept_run")
  fileio.save_npy(run.run_dir.prompts / "prompt_step_5.npy", normal(1.0, 3, e))
  fileio.save_npy(run.run_dir.prompts / "offset_step_5.npy", normal(0.5, OFFSET, e))
  run.close()
  return {"pt": str(root / "pt.npy"), "smop": str(root / "smop_run"),
          "peft": str(root / "peft_pt"), "prefix": str(root / "peft_prefix"),
          "dept": str(root / "dept_run")}


class Served:
  """A running `python -m spot_jax.serve` (see `start`).

  Attributes:
    proc: the process; url: http://127.0.0.1:PORT; lines: stdout lines up to "listening".
  """

  def __init__(self, proc: subprocess.Popen, url: str, lines: list[str]):
    self.proc, self.url, self.lines = proc, url, lines

  def get(self, path: str) -> dict:
    with urllib.request.urlopen(self.url + path, timeout=60) as r:
      return json.loads(r.read())

  def metric(self, name: str, **labels: str) -> float:
    """A sample of /metrics (0 when absent)."""
    with urllib.request.urlopen(self.url + "/metrics", timeout=60) as r:
      text = r.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
      sample, _, value = line.rpartition(" ")
      if sample == (f"{name}{{{want}}}" if labels else name):
        return float(value)
    return 0.0

  def stop(self) -> int:
    if self.proc.poll() is None:
      self.proc.terminate()
    try:
      return self.proc.wait(120)
    finally:
      self.proc.stdout.close()


def start(prompts: dict[str, str], extra: Sequence[str] = (), timeout: float = 600,
          backbone: Sequence[str] = tuple(BACKBONE)) -> Served:
  """Starts the server on `backbone` (default: the toy T5) with `prompts`; returns once it
  listens."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3",
         "PYTHONPATH": str(REPO)}
  argv = [sys.executable, "-m", "spot_jax.serve", *backbone, "--port=0",
          *(f"--prompt={n}={p}" for n, p in prompts.items()), *extra]
  proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, cwd=REPO)
  lines, deadline = [], time.monotonic() + timeout
  while time.monotonic() < deadline:
    line = proc.stdout.readline()
    if not line:
      break
    lines.append(line.rstrip("\n"))
    found: Optional[re.Match] = re.search(r"listening on (http://\S+)", line)
    if found:
      return Served(proc, found.group(1), lines)
  proc.kill()
  raise AssertionError("the server did not start:\n" + "\n".join(lines[-30:]))
