"""QUANTIZATION='int8' as a user runs it: `python -m spot_jax.train` on the toy decoder with an
int8 backbone, then `spot_jax.eval` and `spot_jax.infer` on the run directory alone: both rebuild
the int8 backbone from run.json (eval's metric is the trainer's final one, infer answers)."""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("qwix")

from spot_jax.run_dir import RunDir  # noqa: E402
from spot_jax.serve.catalog import served_backbone  # noqa: E402
from tests.helpers.train_cli import run_in_one_process  # noqa: E402

MODEL = ["--gin_file=gin/models/decoder_toy.gin"]
COMMON = ["--gin.MIXTURE_OR_TASK_NAME='spot_toy_sentiment_travel_taskless_v100'",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.embedded'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 8}",
          "--gin.INITIAL_CHECKPOINT_PATH='spot_jax/embedded/toy_decoder/checkpoint'",
          "--gin.PROMPT_LENGTH=5"]
TRAIN = [*MODEL, "--gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin",
         "--gin_file=gin/runs/prompt_tune.gin", *COMMON, "--gin.TRAIN_STEPS=12",
         "--gin.EVAL_PERIOD=12", "--gin.BATCH_SIZE=8", "--gin.QUANTIZATION='int8'"]


def _metric(text: str) -> str:
  found = re.findall(r"accuracy[ =:]+([0-9.]+)", text)
  assert found, text[-3000:]
  return found[-1]


def test_int8_run_is_recorded_and_rebuilt_by_eval_and_infer(tmp_path):
  run = tmp_path / "run"
  (tmp_path / "in.jsonl").write_text(
      "\n".join(json.dumps({"input": t}) for t in ["a good trip", "the hotel was dirty"]) + "\n")
  cases = [("spot_jax.train", [*TRAIN, f"--gin.MODEL_DIR='{run}'"]),
           ("spot_jax.eval", [*MODEL, "--gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin",
                              "--gin_file=gin/runs/eval.gin", *COMMON,
                              f"--gin.MODEL_DIR='{run}'"]),
           ("spot_jax.infer", [f"--prompt=p={run}", f"--input={tmp_path / 'in.jsonl'}",
                               f"--output={tmp_path / 'out.jsonl'}", "--input_length=48",
                               "--target_length=8"])]
  train, evaluate, infer = run_in_one_process(cases)
  assert train.returncode == 0, train.stderr[-3000:]
  record = RunDir(run).read_record()
  assert record.backbone["config"]["quantization"] == "int8"
  assert served_backbone.recorded_config(record, str(run)).quantization == "int8"
  assert evaluate.returncode == 0, evaluate.stderr[-3000:]
  assert _metric(evaluate.stdout) == _metric(train.stdout + train.stderr)
  assert infer.returncode == 0, infer.stderr[-3000:]
  rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert len(rows) == 2
