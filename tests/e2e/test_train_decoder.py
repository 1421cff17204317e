"""`python -m spot_jax.train` on a decoder-only backbone: SIGKILL, the same command, same prompt."""
from __future__ import annotations

import re
import subprocess

import numpy as np

from tests.helpers import REPO
from tests.helpers.kill import kill_at_checkpoint
from tests.helpers.train_cli import _cmd, _env, run_in_one_process

STEPS = 200
ARGS = ["--gin_file=gin/models/decoder_tiny_llama.gin",
        "--gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin",
        "--gin_file=gin/runs/prompt_tune.gin", "--gin.train.train.eval_cfg=None",
        "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
        "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'", "--gin.PROMPT_LENGTH=4",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 12}", "--gin.BATCH_SIZE=4",
        f"--gin.TRAIN_STEPS={STEPS}", "--gin.CHECKPOINT_PERIOD=10"]


def test_sigkill_then_the_same_command_resumes_exactly(tmp_path):
  killed = tmp_path / "killed"
  proc = subprocess.Popen(_cmd(*ARGS, f"--gin.MODEL_DIR='{killed}'"), cwd=REPO, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  kill_at_checkpoint(proc, killed, 10, STEPS)
  reference, resumed = run_in_one_process(
      [("spot_jax.train", [*ARGS, f"--gin.MODEL_DIR='{tmp_path / 'reference'}'"]),
       ("spot_jax.train", [*ARGS, f"--gin.MODEL_DIR='{killed}'"])])
  assert reference.returncode == 0, reference.stderr[-3000:]
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stdout
  first = int(re.search(rf"^step (\d+)/{STEPS}", resumed.stdout, re.M).group(1))
  assert first > 10, resumed.stdout  # it did not start over
  want = np.load(tmp_path / "reference" / "prompts" / f"prompt_step_{STEPS}.npy")
  got = np.load(killed / "prompts" / f"prompt_step_{STEPS}.npy")
  print(f"killed at step >= 10, resumed: max |diff| {np.max(np.abs(got - want)):.3g}")
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
