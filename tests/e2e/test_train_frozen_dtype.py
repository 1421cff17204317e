"""`python -m spot_jax.train` with FROZEN_DTYPE='bfloat16' and REMAT='full' on a tiny decoder and
a tiny T5, against the same runs in float32 without remat.

Each bfloat16 run's loss falls and ends within bfloat16 noise of the float32 run's (the same
seed, data and prompt initialisation); its prompt stays float32; run.json records the frozen
dtype and the remat policy while the backbone's fingerprint stays the float32 run's (a stored
dtype is not the weights' identity); `infer` on the run directory serves with the recorded
bfloat16 weights.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from spot_jax.serve import served_backbone
from tests.helpers.train_cli import _losses, run_in_one_process

STEPS = 30
COMMON = ["--gin_file=gin/runs/prompt_tune.gin", "--gin.train.train.eval_cfg=None",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
          "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 12}", "--gin.BATCH_SIZE=8",
          f"--gin.TRAIN_STEPS={STEPS}", "--gin.train.train.log_period=5",
          "--gin.SAVE_PROMPT_STEPS=[]"]
MODELS = {"decoder": ["--gin_file=gin/models/decoder_tiny_llama.gin",
                      "--gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin",
                      "--gin.PROMPT_LENGTH=4"],
          "t5": ["--gin_file=gin/models/t5_1_1_byte_tiny.gin",
                 "--gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin",
                 "--gin.PROMPT_LENGTH=4", "--gin.DROPOUT_RATE=0.0"]}
BF16 = ["--gin.FROZEN_DTYPE='bfloat16'", "--gin.REMAT='full'"]


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_bfloat16_remat_trains_as_float32_and_serves(kind, tmp_path):
  half, full = tmp_path / "bf16", tmp_path / "f32"
  (tmp_path / "in.txt").write_text("a fine film\na dull film\n")
  train = lambda run, extra: ("spot_jax.train", [*MODELS[kind], *COMMON, *extra,  # noqa: E731
                                                  f"--gin.MODEL_DIR='{run}'"])
  served = tmp_path / "served.jsonl"
  ran = run_in_one_process([
      train(half, BF16), train(full, []),
      ("spot_jax.infer", [f"--prompt={half}", f"--input={tmp_path / 'in.txt'}",
                          f"--output={served}", "--input_length=32", "--target_length=12",
                          "--compilation_cache_dir=none"])])
  for proc in ran:
    assert proc.returncode == 0, proc.stderr[-3000:]
  got, want = _losses(ran[0].stdout), _losses(ran[1].stdout)
  print(f"{kind}: bfloat16 + remat losses {got}; float32 {want}")
  assert len(got) == len(want) == STEPS // 5
  assert got[-1] < got[0]
  assert abs(got[-1] - want[-1]) <= 0.02 * want[-1] + 0.01
  prompt = np.load(half / "prompts" / f"prompt_step_{STEPS}.npy")
  assert prompt.dtype == np.float32
  record = json.loads((half / "run.json").read_text())["backbone"]
  other = json.loads((full / "run.json").read_text())["backbone"]
  assert (record["config"]["param_dtype"], record["config"]["remat_policy"]) == ("bfloat16",
                                                                                 "full")
  assert (other["config"]["param_dtype"], other["config"]["remat_policy"]) == ("float32", "none")
  assert record["fingerprint"]["id"] == other["fingerprint"]["id"]
  resolved = served_backbone.resolve([str(half)], checkpoint=None, seed=0, config=None,
                                     allow_backbone_change=False)
  assert resolved.config.param_dtype == "bfloat16"
  assert len(served.read_text().splitlines()) == 2
