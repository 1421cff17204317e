"""`python -m spot_jax.train` as a user runs it: errors, kill/resume, model-tuning baselines."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
import zipfile

import jax
import numpy as np
import pytest
from tests.helpers import REPO  # noqa: E402
from tests.helpers.kill import kill_at_checkpoint  # noqa: E402
from tests.helpers.train_cli import _cmd, _env, _losses, _run, run_in_one_process

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
  from spot_jax.backbones.t5 import Transformer, config_by_name, save_checkpoint  # pylint: disable=g-import-not-at-top
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


BAD_CASES = ["unknown gin parameter", "unknown task", "missing checkpoint",
             "checkpoint/config mismatch", "feature length shorter than prompt",
             "unwritable MODEL_DIR", "missing MODEL_DIR", "missing gin file"]
STEPS = 100  # of the SIGKILL test: killed at checkpoint 10, 90 steps before the end
KILLED = [*SMOKE, *NO_EVAL, f"--gin.TRAIN_STEPS={STEPS}", "--gin.CHECKPOINT_PERIOD=10"]
ONE_STEP_LOGS = ["--gin.SAVE_PROMPT_STEPS=[]", "--gin.train.train.log_period=1"]
DEVICES = [*SMOKE, *NO_EVAL, "--gin.TRAIN_STEPS=6", *ONE_STEP_LOGS]
DROPOUT = [*SMOKE, *NO_EVAL, "--gin.TRAIN_STEPS=4", *ONE_STEP_LOGS, "--gin.DROPOUT_RATE=0.1"]
FEW = [*NO_EVAL, "--gin.CHECKPOINT_PERIOD=4"]
MODEL_TUNING = {"model_tune": "spot_synthetic_sentiment_v100",
                "multitask_model_tune": "spot_synthetic_mix_v100"}


def _model_tuning_args(run: str, model_dir: pathlib.Path) -> list[str]:
  return ["--gin_file=gin/models/t5_1_1_byte_tiny.gin", f"--gin_file=gin/runs/{run}.gin", *NO_EVAL,
          f"--gin.MODEL_DIR='{model_dir}'", f"--gin.MIXTURE_OR_TASK_NAME='{MODEL_TUNING[run]}'",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.TRAIN_STEPS=40",
          "--gin.BATCH_SIZE=16", "--gin.LEARNING_RATE=0.01", "--gin.train.train.log_period=5"]


def _transfer_args(source: pathlib.Path, target: pathlib.Path) -> list[str]:
  return ["--gin_file=gin/models/t5_1_1_byte_tiny.gin",
          "--gin_file=gin/prompts/spot_transfer.gin", "--gin_file=gin/runs/prompt_tune.gin",
          "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
          "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.BATCH_SIZE=8",
          "--gin.PROMPT_LENGTH=10", f"--gin.SOURCE_MODEL_DIR='{source}'", *FEW,
          f"--gin.MODEL_DIR='{target}'"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, mismatched_checkpoint) -> tuple[pathlib.Path, dict]:
  """Every run of the tests below, under one folder: -> (root, {case: result}).

  A run SIGKILLed once checkpoint 10 exists ("killed"), and the runs that need no process of
  their own, in one process, each as `python -m` would (train_cli.run_in_one_process): the bad
  inputs ("bad <case>", each with its own folder under bad/), the killed run restarted and its
  uninterrupted reference ("resumed", "reference"), the one-device run of the --cpu_devices
  test ("d1"), the dropout runs "a" (unsafe_rbg) and "c" (threefry), both model-tuning runs,
  and the SPoT transfer's source, target (its config.gin and run.json then zipped, "first run"),
  resumed target and K-run job. The runs that need a process of their own run in their tests:
  two CPU devices, and the rerun of "a"."""
  root = tmp_path_factory.mktemp("train")
  proc = subprocess.Popen(_cmd(*KILLED, f"--gin.MODEL_DIR='{root / 'killed'}'"), cwd=REPO,
                          env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  kill_at_checkpoint(proc, root / "killed", 10, STEPS)

  cases = {}
  for i, case in enumerate(BAD_CASES):
    (root / "bad" / str(i)).mkdir(parents=True)
    cases[f"bad {case}"] = _bad_cases(root / "bad" / str(i), mismatched_checkpoint)[case][0]
  cases["bad cpu_devices"] = [*SMOKE, "--cpu_devices=0", f"--gin.MODEL_DIR='{root / 'bad_d'}'"]
  cases["bad dropout"] = [*SMOKE, f"--gin.MODEL_DIR='{root / 'bad_rng'}'",
                          "--gin.DROPOUT_RNG='philox'"]
  cases["reference"] = [*KILLED, f"--gin.MODEL_DIR='{root / 'reference'}'"]
  cases["resumed"] = [*KILLED, f"--gin.MODEL_DIR='{root / 'killed'}'"]
  cases["d1"] = [*DEVICES, "--cpu_devices=1", f"--gin.MODEL_DIR='{root / 'd1'}'"]
  for name, impl in (("a", "unsafe_rbg"), ("c", "threefry")):
    cases[name] = [*DROPOUT, f"--gin.DROPOUT_RNG='{impl}'", f"--gin.MODEL_DIR='{root / name}'"]
  for run in MODEL_TUNING:
    cases[run] = _model_tuning_args(run, root / run)
  source, target = root / "source", root / "target"
  cases["source"] = [*SMOKE, *FEW, f"--gin.MODEL_DIR='{source}'", "--gin.TRAIN_STEPS=4"]
  cases["target"] = [*_transfer_args(source, target), "--gin.TRAIN_STEPS=4"]
  # what the first run wrote, to compare after the resume (zipfile: a `python -m` that copies)
  cases["first run"] = ("zipfile", ["-c", str(root / "first_run.zip"),
                                    str(target / "config.gin"), str(target / "run.json")])
  cases["resumed target"] = [*_transfer_args(source, target), "--gin.TRAIN_STEPS=8"]
  cases["job"] = [*SMOKE, *FEW, f"--gin.MODEL_DIR='{root / 'job'}'", "--gin.TRAIN_STEPS=4",
                  "--gin.SEEDS=[0, 1]"]
  results = run_in_one_process([args if isinstance(args, tuple) else ("spot_jax.train", args)
                                for args in cases.values()])
  return root, dict(zip(cases, results))


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_line_and_exit_2(runs, mismatched_checkpoint, case):
  root, results = runs
  tmp = root / "bad" / str(BAD_CASES.index(case))
  _, fragment = _bad_cases(tmp, mismatched_checkpoint)[case]
  _assert_one_line_error(results[f"bad {case}"], fragment)
  assert not (tmp / "run" / "checkpoints").exists()


def test_sigkill_then_restart_resumes_exactly(runs):
  root, results = runs
  reference, resumed = results["reference"], results["resumed"]
  assert reference.returncode == 0, reference.stderr[-3000:]
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from" in resumed.stdout
  first_step = int(re.search(rf"^step (\d+)/{STEPS}", resumed.stdout, re.M).group(1))
  assert first_step > 10  # it did not start over
  want = np.load(root / "reference" / "prompts" / f"prompt_step_{STEPS}.npy")
  got = np.load(root / "killed" / "prompts" / f"prompt_step_{STEPS}.npy")
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("run", sorted(MODEL_TUNING))
def test_model_tuning_baselines_through_the_cli(runs, run):
  root, results = runs
  proc = results[run]
  assert proc.returncode == 0, proc.stderr[-3000:]
  losses = _losses(proc.stdout)
  assert len(losses) == 8, proc.stdout
  assert np.mean(losses[-2:]) < losses[0] - 0.5, losses
  assert not (root / run / "prompts").exists()  # no prompt in model tuning


def test_cpu_devices_splits_the_batch_and_keeps_the_run(runs, tmp_path):
  """--cpu_devices=2: one batch shard per CPU device, the same losses and prompt as one device."""
  root, results = runs
  two = _run([*DEVICES, "--cpu_devices=2", f"--gin.MODEL_DIR='{tmp_path / 'd2'}'"])
  outs = {}
  for devices, proc, model_dir in ((1, results["d1"], root / "d1"), (2, two, tmp_path / "d2")):
    assert proc.returncode == 0, proc.stderr[-3000:]
    prompt = np.load(next((model_dir / "prompts").rglob("*6*.npy")))
    outs[devices] = (_losses(proc.stdout), prompt, proc.stdout + proc.stderr)
  assert "mesh: data=2 x model=1 over 2 cpu device(s)" in outs[2][2], outs[2][2][-2000:]
  np.testing.assert_allclose(outs[2][0], outs[1][0], rtol=1e-5)
  np.testing.assert_allclose(outs[2][1], outs[1][1], atol=1e-5)
  _assert_one_line_error(results["bad cpu_devices"], "--cpu_devices=0 must be a positive integer")


def test_dropout_rng_is_wired_and_deterministic(runs, tmp_path):
  """DROPOUT_RNG='unsafe_rbg' reaches the step: other masks than threefry's, the same on a rerun
  (b: "a" again, in a process of its own)."""
  _, results = runs
  b = _run([*DROPOUT, "--gin.DROPOUT_RNG='unsafe_rbg'", f"--gin.MODEL_DIR='{tmp_path / 'b'}'"])
  losses = {}
  for name, proc in (("a", results["a"]), ("b", b), ("c", results["c"])):
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses[name] = _losses(proc.stdout)
  assert len(losses["a"]) == 4 and losses["a"] == losses["b"]
  assert losses["a"] != losses["c"]
  _assert_one_line_error(results["bad dropout"],
                         "DROPOUT_RNG='philox' is unknown; valid: threefry, rbg, unsafe_rbg")


def test_a_spot_transfer_records_its_source_and_keeps_every_config_it_ran_with(runs):
  root, results = runs
  source, target, job = root / "source", root / "target", root / "job"
  for name in ("source", "target", "resumed target", "job"):
    assert results[name].returncode == 0, (name, results[name].stderr[-3000:])
  source_record = json.loads((source / "run.json").read_text())
  assert source_record["init"] == "sampled_vocab(num_most_frequent=256)"
  assert "prompts.sampled_vocab.num_most_frequent = 256" in (source / "config.gin").read_text()

  named = f"run {source}, step 4 (prompts/prompt_step_4.npy)"
  assert results["first run"].returncode == 0, results["first run"].stderr[-3000:]
  with zipfile.ZipFile(root / "first_run.zip") as saved:  # as the first run left them
    assert json.loads(saved.read("run.json"))["init"] == named
    first = saved.read("config.gin").decode()
  assert "PROMPT/prompts.from_checkpoint.model_dir = %SOURCE_MODEL_DIR" in first
  assert f"'{source}'" in first and "TRAIN_STEPS = 4" in first  # gin wraps long values
  # A resume with another configuration: the record keeps its start, config.gin the new one,
  # and the one that ran steps 1-4 is kept beside it.
  assert "resumed from" in results["resumed target"].stdout
  assert json.loads((target / "run.json").read_text())["init"] == named
  assert "TRAIN_STEPS = 8" in (target / "config.gin").read_text()
  assert (target / "config.until_step_4.gin").read_text() == first

  # K runs in one job: each run directory holds its config.gin and its own record
  for name in ("seed_0", "seed_1"):
    assert "SEEDS = [0, 1]" in (job / name / "config.gin").read_text()
    assert json.loads((job / name / "run.json").read_text())["init"] == (
        "sampled_vocab(num_most_frequent=256)")
