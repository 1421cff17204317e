"""The contrib model's training and evaluation under `t5x.train` with 2 CPU processes
(skips without t5x).

t5x runs several processes with `--multiprocess_gpu --coordinator_address --process_count
--process_index` (`jax.distributed.initialize`; launch/gpu_host.sh in t5x's repository); on CPU
the same flags give two processes of one device each, data-parallel under t5x's
`PjitPartitioner`. With evaluation on (t5x's training-eval loss and inference eval, the latter
through the model's `predict_batch_with_aux`, each host decoding its share), the two-process run
must give one process's results: the same predictions and metrics and, with the same global
batches (no shuffle: each host reads every other example of the same sequence), the same
trained prompt. The backbone starts from scratch at t5_1_1_byte_tiny (vocabulary 384), so the
greedy predictions are non-empty byte strings, which the real tiny checkpoint's 32k vocabulary
would not give under the synthetic task's byte vocabulary.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
from tests.helpers import REPO

pytest.importorskip("t5x.train",
                    reason="t5x is not importable (install it from its repository: docs/t5x.md)")

TASK = "spot_synthetic_sentiment_v100"
STEPS = 2
BINDINGS = [
    "CONFIG_NAME='t5_1_1_byte_tiny'", "PROMPT_LENGTH=3", "DROPOUT_RATE=0.0", f"TRAIN_STEPS={STEPS}",
    "utils.CheckpointConfig.restore=None",  # the backbone from scratch (see the docstring)
    "train/utils.DatasetConfig.shuffle=False",
    "train.train_eval_dataset_cfg=@train_eval/utils.DatasetConfig()",
    "train.infer_eval_dataset_cfg=@infer_eval/utils.DatasetConfig()",
    "train.eval_steps=2", f"train.eval_period={STEPS}", "EVALUATOR_NUM_EXAMPLES=16",
]
TRAIN_EVAL_LOSS = re.compile(rf"collection=training_eval/{TASK} accuracy=[-\d.e]+, "
                             r"cross_ent_loss=([-\d.e]+)")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _t5x_train(model_dir: pathlib.Path, processes: int) -> list[str]:
  """Runs `t5x.train` in `processes` processes; returns each one's stderr (all must succeed)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in sys.path if p])
  cmd = [sys.executable, "-m", "t5x.train", f"--gin_search_paths={REPO}",
         "--gin_file=gin/t5x/models/t5_1_1_tiny_prompt_tuning.gin",
         "--gin_file=gin/t5x/runs/prompt_tune.gin", "--gin_file=gin/t5x/test/synthetic.gin",
         f"--gin.MODEL_DIR='{model_dir}'",
         # Only recorded in backbone.json (nothing is restored: restore=None).
         f"--gin.INITIAL_CHECKPOINT_PATH='{model_dir.parent / 'no_backbone'}'"]
  cmd += [f"--gin.{b}" for b in BINDINGS]
  port = _free_port()
  procs = [subprocess.Popen(
      cmd + ([] if processes == 1 else [
          "--multiprocess_gpu", f"--coordinator_address=localhost:{port}",
          f"--process_count={processes}", f"--process_index={i}"]),
      cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
      for i in range(processes)]
  errs = []
  for i, proc in enumerate(procs):
    try:
      errs.append(proc.communicate(timeout=900)[1])
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      raise
    assert proc.returncode == 0, f"process {i} of {processes}: {errs[-1][-3000:]}"
  return errs


def test_two_processes_train_and_evaluate_like_one(tmp_path):
  one, two = tmp_path / "one", tmp_path / "two"
  err_one = _t5x_train(one, 1)[0]
  err_two = _t5x_train(two, 2)
  assert "process_count: 2" in err_two[0] and "process_index: 1" in err_two[1]

  # Inference eval (predict_batch_with_aux, each host its share, gathered by t5x): the same
  # predictions, non-trivial ones, and the same metrics.
  predictions = {}
  for name, run in (("one", one), ("two", two)):
    lines = (run / "inference_eval" / f"{TASK}-{STEPS:06d}.jsonl").read_text().splitlines()
    predictions[name] = [json.loads(line)["prediction"] for line in lines]
  assert len(predictions["one"]) == 16 and sum(bool(p) for p in predictions["one"]) >= 8
  assert predictions["two"] == predictions["one"]
  metrics = [(run / "inference_eval" / f"{TASK}-metrics.jsonl").read_text() for run in (one, two)]
  assert metrics[0] == metrics[1] and '"accuracy"' in metrics[0]

  # Training eval (t5x's eval step over the model's loss) and training itself: the same global
  # batches, so the same loss and prompt up to the order of the data-parallel reductions.
  loss_one = [float(x) for x in TRAIN_EVAL_LOSS.findall(err_one)]
  loss_two = [float(x) for x in TRAIN_EVAL_LOSS.findall(err_two[0])]
  assert len(loss_one) == len(loss_two) == 1
  np.testing.assert_allclose(loss_two, loss_one, rtol=1e-6)
  for step in range(STEPS + 1):
    name = pathlib.Path("prompts") / f"prompt_step_{step}.npy"
    np.testing.assert_allclose(np.load(two / name), np.load(one / name), rtol=0, atol=1e-5,
                               err_msg=str(name))
  assert not np.array_equal(np.load(one / "prompts" / f"prompt_step_{STEPS}.npy"),
                            np.load(one / "prompts" / "prompt_step_0.npy"))
