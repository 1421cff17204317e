"""`python -m spot_jax.train` as a user runs it: errors, kill/resume, model-tuning baselines."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess

import jax
import numpy as np
import pytest
from tests.helpers import REPO  # noqa: E402
from tests.helpers.kill import kill_at_checkpoint  # noqa: E402
from tests.helpers.train_cli import _cmd, _env, _losses, _run  # noqa: E402

SMOKE = ["--gin_file=gin/test/smoke.gin"]
NO_EVAL = ["--gin.train.train.eval_cfg=None"]


def _assert_one_line_error(proc: subprocess.CompletedProcess, fragment: str) -> None:
  assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  errors = [l for l in proc.stderr.splitlines() if l.startswith("spot_jax.train: error:")]
  assert len(errors) == 1, proc.stderr[-3000:]
  assert fragment in errors[0], errors[0]


@pytest.fixture(scope="module")
def mismatched_checkpoint(tmp_path_factory) -> str:
  """A valid checkpoint of another architecture (the 128-vocab test model)."""
  from spot_jax import models  # pylint: disable=g-import-not-at-top
  from spot_jax.t5 import Transformer, config_by_name, save_checkpoint  # pylint: disable=g-import-not-at-top
  model = models.EncoderDecoderModel(Transformer(config_by_name("t5_1_1_test")))
  params = models.unbox(model.init_backbone(jax.random.PRNGKey(0), model.dummy_batch(4, 4)))
  path = tmp_path_factory.mktemp("other") / "checkpoint_0"
  save_checkpoint(jax.device_get(params), str(path))
  return str(path)


def _bad_cases(tmp: pathlib.Path, mismatched: str):
  blocker = tmp / "a_file"
  blocker.write_text("not a directory")
  run = f"--gin.MODEL_DIR='{tmp / 'run'}'"
  return {
      "unknown gin parameter": ([*SMOKE, run, "--gin.train.train.no_such_flag=1"],
                                "doesn't have a parameter named 'no_such_flag'"),
      "unknown task": ([*SMOKE, run, "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentimnt_v100'"],
                       "did you mean 'spot_synthetic_sentiment_v100'"),
      "missing checkpoint": ([*SMOKE, run, f"--gin.INITIAL_CHECKPOINT_PATH='{tmp / 'nope'}'"],
                             "does not exist"),
      "checkpoint/config mismatch": ([*SMOKE, run, f"--gin.INITIAL_CHECKPOINT_PATH='{mismatched}'"],
                                     "decoder/decoder_norm/scale: expected shape [64], found [32]"),
      "feature length shorter than prompt": (
          [*SMOKE, run, "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 12}"],
          "shorter than the prompt"),
      "unwritable MODEL_DIR": ([*SMOKE, f"--gin.MODEL_DIR='{blocker / 'run'}'"],
                               "is a file, not a directory"),
      "missing MODEL_DIR": (SMOKE, "MODEL_DIR"),
      "missing gin file": (["--gin_file=gin/runs/no_such_run.gin"], "not found"),
  }


@pytest.mark.parametrize("case", ["unknown gin parameter", "unknown task", "missing checkpoint",
                                  "checkpoint/config mismatch",
                                  "feature length shorter than prompt",
                                  "unwritable MODEL_DIR", "missing MODEL_DIR", "missing gin file"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, mismatched_checkpoint, case):
  args, fragment = _bad_cases(tmp_path, mismatched_checkpoint)[case]
  proc = _run(args, timeout=300)
  _assert_one_line_error(proc, fragment)
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_sigkill_then_restart_resumes_exactly(tmp_path):
  common = [*SMOKE, *NO_EVAL, "--gin.TRAIN_STEPS=300", "--gin.CHECKPOINT_PERIOD=20"]
  reference = _run([*common, f"--gin.MODEL_DIR='{tmp_path / 'ref'}'"])
  assert reference.returncode == 0, reference.stderr[-3000:]

  run_dir = tmp_path / "killed"
  args = _cmd(*common, f"--gin.MODEL_DIR='{run_dir}'")
  proc = subprocess.Popen(args, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  kill_at_checkpoint(proc, run_dir, 20, 300)

  resumed = _run([*common, f"--gin.MODEL_DIR='{run_dir}'"])
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stdout
  first_step = int(re.search(r"^step (\d+)/300", resumed.stdout, re.M).group(1))
  assert first_step > 20  # it did not start over
  want = np.load(tmp_path / "ref" / "prompts" / "prompt_step_300.npy")
  got = np.load(run_dir / "prompts" / "prompt_step_300.npy")
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("run_file, task", [
    ("gin/runs/model_tune.gin", "spot_synthetic_sentiment_v100"),
    ("gin/runs/multitask_model_tune.gin", "spot_synthetic_mix_v100"),
])
def test_model_tuning_baselines_through_the_cli(tmp_path, run_file, task):
  proc = _run(["--gin_file=gin/models/t5_1_1_byte_tiny.gin", f"--gin_file={run_file}", *NO_EVAL,
               f"--gin.MODEL_DIR='{tmp_path}'", f"--gin.MIXTURE_OR_TASK_NAME='{task}'",
               "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
               "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.TRAIN_STEPS=40",
               "--gin.BATCH_SIZE=16", "--gin.LEARNING_RATE=0.01", "--gin.train.train.log_period=5"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  losses = _losses(proc.stdout)
  assert len(losses) == 8, proc.stdout
  assert np.mean(losses[-2:]) < losses[0] - 0.5, losses
  assert not (tmp_path / "prompts").exists()  # no prompt in model tuning


def test_cpu_devices_splits_the_batch_and_keeps_the_run(tmp_path):
  """--cpu_devices=2: one batch shard per CPU device, the same losses and prompt as one device."""
  runs = {}
  for devices in (1, 2):
    model_dir = tmp_path / f"d{devices}"
    proc = _run([*SMOKE, *NO_EVAL, f"--cpu_devices={devices}", f"--gin.MODEL_DIR='{model_dir}'",
                 "--gin.TRAIN_STEPS=6", "--gin.SAVE_PROMPT_STEPS=[]",
                 "--gin.train.train.log_period=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    prompt = np.load(next((model_dir / "prompts").rglob("*6*.npy")))
    runs[devices] = (_losses(proc.stdout), prompt, proc.stdout + proc.stderr)
  assert "mesh: data=2 x model=1 over 2 cpu device(s)" in runs[2][2], runs[2][2][-2000:]
  np.testing.assert_allclose(runs[2][0], runs[1][0], rtol=1e-5)
  np.testing.assert_allclose(runs[2][1], runs[1][1], atol=1e-5)
  bad = _run([*SMOKE, "--cpu_devices=0", f"--gin.MODEL_DIR='{tmp_path / 'bad'}'"])
  _assert_one_line_error(bad, "--cpu_devices=0 must be a positive integer")


def test_dropout_rng_is_wired_and_deterministic(tmp_path):
  """DROPOUT_RNG='unsafe_rbg' reaches the step: other masks than threefry's, the same on a rerun."""
  losses = {}
  for name, impl in (("a", "unsafe_rbg"), ("b", "unsafe_rbg"), ("c", "threefry")):
    proc = _run([*SMOKE, *NO_EVAL, f"--gin.MODEL_DIR='{tmp_path / name}'", "--gin.TRAIN_STEPS=4",
                 "--gin.SAVE_PROMPT_STEPS=[]",
                 "--gin.DROPOUT_RATE=0.1", f"--gin.DROPOUT_RNG='{impl}'",
                 "--gin.train.train.log_period=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses[name] = _losses(proc.stdout)
  assert len(losses["a"]) == 4 and losses["a"] == losses["b"]
  assert losses["a"] != losses["c"]
  bad = _run([*SMOKE, f"--gin.MODEL_DIR='{tmp_path / 'bad'}'", "--gin.DROPOUT_RNG='philox'"])
  _assert_one_line_error(bad, "DROPOUT_RNG='philox' is unknown; valid: threefry, rbg, unsafe_rbg")


def test_a_spot_transfer_records_its_source_and_keeps_every_config_it_ran_with(tmp_path):
  source, target, job = tmp_path / "source", tmp_path / "target", tmp_path / "job"
  few = [*NO_EVAL, "--gin.CHECKPOINT_PERIOD=4"]
  proc = _run([*SMOKE, *few, f"--gin.MODEL_DIR='{source}'", "--gin.TRAIN_STEPS=4"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  source_record = json.loads((source / "run.json").read_text())
  assert source_record["init"] == "sampled_vocab(num_most_frequent=256)"
  assert "prompts.sampled_vocab.num_most_frequent = 256" in (source / "config.gin").read_text()

  transfer = ["--gin_file=gin/models/t5_1_1_byte_tiny.gin",
              "--gin_file=gin/prompts/spot_transfer.gin", "--gin_file=gin/runs/prompt_tune.gin",
              "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
              "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'",
              "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.BATCH_SIZE=8",
              "--gin.PROMPT_LENGTH=10", f"--gin.SOURCE_MODEL_DIR='{source}'", *few,
              f"--gin.MODEL_DIR='{target}'"]
  proc = _run([*transfer, "--gin.TRAIN_STEPS=4"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  named = f"run {source}, step 4 (prompts/prompt_step_4.npy)"
  assert json.loads((target / "run.json").read_text())["init"] == named
  first = (target / "config.gin").read_text()
  assert "PROMPT/prompts.from_checkpoint.model_dir = %SOURCE_MODEL_DIR" in first
  assert f"'{source}'" in first and "TRAIN_STEPS = 4" in first  # gin wraps long values
  # A resume with another configuration: the record keeps its start, config.gin the new one,
  # and the one that ran steps 1-4 is kept beside it.
  proc = _run([*transfer, "--gin.TRAIN_STEPS=8"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "resumed from" in proc.stdout
  assert json.loads((target / "run.json").read_text())["init"] == named
  assert "TRAIN_STEPS = 8" in (target / "config.gin").read_text()
  assert (target / "config.until_step_4.gin").read_text() == first

  # K runs in one job: each run directory holds its config.gin and its own record
  proc = _run([*SMOKE, *few, f"--gin.MODEL_DIR='{job}'", "--gin.TRAIN_STEPS=4",
               "--gin.SEEDS=[0, 1]"])
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ("seed_0", "seed_1"):
    assert "SEEDS = [0, 1]" in (job / name / "config.gin").read_text()
    assert json.loads((job / name / "run.json").read_text())["init"] == (
        "sampled_vocab(num_most_frequent=256)")
