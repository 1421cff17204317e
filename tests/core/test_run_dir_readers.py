"""One run directory with every kind of content; every reader reads it and they all agree.

The run is a real smoke run (`spot_jax.train`, t5_1_1_byte_tiny, the random backbone of seed 0,
the byte vocabulary): checkpoints/10 and 20, best/<s>/ with best/metric.json, the exported
prompts (every checkpoint, the embedding step, best) and run.json. Beside them, what a long life
leaves in a run directory:
  checkpoints/30.corrupt/                       a damaged state the trainer moved aside
  checkpoints/40.orbax-checkpoint-tmp-<n>/      a state half-written when the job died (no
                                                orbax marker inside)
  prompts/.prompt_step_40.npy.<x>.tmp           a prompt export cut off mid-write
Every reader (RunDir, spot_jax.eval, spot_jax.infer with neither --model nor --vocab and a
relative path, library add --run_dir, spot_jax.experiment, the prompt initialisers, the serving
layer's prompt sources) must name the same state step and read the same prompt array, and none
may change a byte of the run directory.

A second run, on the embedded toy T5 with an SMoP prompt (its router is read from the training
state), is served from a relative path holding a `.corrupt` folder without --model and without
--vocab: the run recorded its backbone ("embedded:" checkpoint) and SentencePiece vocabulary.
Its predictions must equal the trainer's own evaluation of the same state.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import gin
import numpy as np
import pytest

from spot_jax import cli, embedded
from spot_jax import infer as infer_cli
from spot_jax import library as library_cli
from spot_jax.train import __main__ as train_main
from spot_jax.prompts import initializers
from spot_jax.run_dir import RunDir
from spot_jax.serve.catalog import prompt_loaders
from spot_jax import experiment
from spot_jax.spot import library as prompt_library
from tests.helpers import REPO
from tests.helpers.cli_error_runner import tree_hash

TASK = "spot_synthetic_sentiment_v100"
TOY_TASK = "spot_toy_sentiment_travel_taskless_v100"
EVAL_GIN = ["--gin_file=gin/models/t5_1_1_byte_tiny.gin", "--gin_file=gin/test/smoke_prompt.gin",
            "--gin_file=gin/runs/eval.gin", f"--gin.MIXTURE_OR_TASK_NAME='{TASK}'",
            "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}",
            "--gin.EVAL_NUM_EXAMPLES=32"]


def _env() -> dict:
  return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))


def _train(args: list[str]) -> None:
  proc = subprocess.run([sys.executable, "-m", "spot_jax.train", *args], cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]


def _leave_debris(run: pathlib.Path, state: int, aside: int, half: int) -> None:
  """checkpoints/<aside>.corrupt (a damaged copy of <state>), checkpoints/<half>.orbax-checkpoint-
  tmp-<n> (a copy without orbax's marker) and a cut-off prompt export."""
  source = run / "checkpoints" / str(state)
  corrupt = run / "checkpoints" / f"{aside}.corrupt"
  shutil.copytree(source, corrupt)
  for f in corrupt.glob("default/ocdbt.process_0/d/*"):
    os.truncate(f, 10)
  temporary = run / "checkpoints" / f"{half}.orbax-checkpoint-tmp-1732406400123456"
  shutil.copytree(source, temporary)
  (temporary / "_CHECKPOINT_METADATA").unlink()
  data = (run / "prompts" / f"prompt_step_{state}.npy").read_bytes()
  (run / "prompts" / f".prompt_step_{half}.npy.k2j3h4.tmp").write_bytes(data[:len(data) // 2])


def _eval_outputs(run: pathlib.Path, task: str, step: int) -> list[dict]:
  lines = (run / "eval" / f"{task}-{step:06d}.jsonl").read_text().splitlines()
  return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("readers")
  run = root / "smoke_run"
  _train(["--gin_file=gin/test/smoke.gin", f"--gin.MODEL_DIR='{run}'", "--gin.TRAIN_STEPS=20",
          "--gin.CHECKPOINT_PERIOD=10", "--gin.EVAL_PERIOD=10", "--gin.EVAL_NUM_EXAMPLES=32"])
  _leave_debris(run, state=20, aside=30, half=40)
  return run


def _arrays_equal(a, b) -> None:
  np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_every_reader_names_the_same_state_and_prompt(run, tmp_path, monkeypatch, capsys):
  before = tree_hash(run)
  rd = RunDir(run)
  record, best = rd.read_record(), rd.best_metric()
  assert record is not None and record.finished and record.embedding_step == 6
  assert sorted(p.name for p in (run / "checkpoints").iterdir())[-2:] == [
      "30.corrupt", "40.orbax-checkpoint-tmp-1732406400123456"]
  # RunDir: the finished states only; the exported prompts, not the temporary
  assert rd.state_steps() == [10, 20] and rd.latest_state_step() == 20
  assert rd.best_steps() == [best.step] and best.step in (10, 20)
  assert rd.prompt_steps() == [6, 10, 20]
  assert rd.exported_prompt() == (run / "prompts" / "prompt_best.npy", None)
  best_prompt = np.load(run / "prompts" / "prompt_best.npy")
  latest_prompt = np.load(run / "prompts" / "prompt_step_20.npy")
  embedding = np.load(run / "prompts" / "prompt_step_6.npy")
  # the states hold what was exported: best/<s> the best prompt, checkpoints/20 the latest
  params, source = rd.restore_params()
  assert source == run / "best" / str(best.step)
  _arrays_equal(params["prompt"]["prompt"], best_prompt)
  params, source = rd.restore_params("latest")
  assert source == run / "checkpoints" / "20"
  _arrays_equal(params["prompt"]["prompt"], latest_prompt)
  _arrays_equal(best_prompt, np.load(run / "prompts" / f"prompt_step_{best.step}.npy"))

  # the prompt initialisers (SPoT transfer): the latest export is step 20, best is best
  assert initializers.exported_prompt_path(run) == str(run / "prompts" / "prompt_step_20.npy")
  best_path = initializers.exported_prompt_path(run, "best")
  init = initializers.from_checkpoint(run, "best")
  _arrays_equal(init(None, best_prompt.shape, None), best_prompt)
  assert best_path == str(run / "prompts" / "prompt_best.npy")

  # the SPoT layer's record of a finished run
  outcome = experiment.read_outcome(run)
  assert (outcome.task, outcome.score) == (TASK, best.value)
  _arrays_equal(outcome.prompt(), best_prompt)
  _arrays_equal(outcome.embedding(), embedding)

  # the serving layer's prompt source
  entry = prompt_loaders.load("smoke", str(run))
  assert entry.num_prompts == 1
  _arrays_equal(entry.prompts[0], best_prompt)

  # library add --run_dir: nothing but the run directory
  code = cli.run(library_cli.main, ["add", f"--library={tmp_path / 'lib'}", f"--run_dir={run}"],
                 library_cli.PROG)
  assert code == 0, capsys.readouterr().err
  (added,), problems = prompt_library.Library(tmp_path / "lib").load()
  assert problems == [] and added.fingerprint == record.fingerprint
  assert (added.task, added.embedding_step, added.score) == (TASK, 6, best.value)
  _arrays_equal(added.prompt, best_prompt)
  _arrays_equal(added.embedding, embedding)

  # infer, from the run's parent folder with a relative path, neither --model nor --vocab
  monkeypatch.chdir(run.parent)
  exported = tmp_path / "served.npy"
  code = cli.run(infer_cli.main, [f"--prompt={run.name}", f"--export_npy={exported}"],
                 infer_cli.PROG)
  assert code == 0, capsys.readouterr().err
  _arrays_equal(np.load(exported), best_prompt)
  # an export reads the config only: the run's --model without its backbone's seed is fine
  code = cli.run(infer_cli.main, [f"--prompt={run.name}", "--model=t5_1_1_byte_tiny", "--seed=1",
                                  f"--export_npy={tmp_path / 'again.npy'}"], infer_cli.PROG)
  assert code == 0, capsys.readouterr().err
  _arrays_equal(np.load(tmp_path / "again.npy"), best_prompt)
  assert tree_hash(run) == before


def test_infer_predicts_what_the_trainer_evaluated_from_the_record_alone(run, tmp_path,
                                                                         monkeypatch, capsys):
  """No --model, no --checkpoint, no --vocab: the record's random backbone (seed 0) and byte
  vocabulary serve the best prompt; greedy predictions equal the trainer's evaluation of it."""
  before = tree_hash(run)
  step = RunDir(run).best_metric().step
  evaluated = _eval_outputs(run, TASK, step)
  (tmp_path / "in.txt").write_text("".join(r["input"]["inputs_pretokenized"] + "\n"
                                           for r in evaluated))
  monkeypatch.chdir(run.parent)
  out = tmp_path / "out.jsonl"
  code = cli.run(infer_cli.main, [f"--prompt={run.name}", f"--input={tmp_path / 'in.txt'}",
                                  f"--output={out}", "--input_length=48", "--target_length=12"],
                 infer_cli.PROG)
  assert code == 0, capsys.readouterr().err
  served = [json.loads(line)["prediction"] for line in out.read_text().splitlines()]
  assert served == [r["output"] for r in evaluated]
  assert tree_hash(run) == before


def test_eval_reads_the_state_every_other_reader_names(run, tmp_path):
  """spot_jax.eval on the run: best/<s> (not the .corrupt or half-written folders), with the
  metric the trainer recorded for it; nothing written into the run directory."""
  before = tree_hash(run)
  best = RunDir(run).best_metric()
  proc = subprocess.run([sys.executable, "-m", "spot_jax.eval", *EVAL_GIN,
                         f"--gin.MODEL_DIR='{run}'",
                         f"--gin.OUTPUT_DIR='{tmp_path}'"], cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "warning" not in proc.stdout + proc.stderr
  result = json.loads((tmp_path / "metrics.json").read_text())
  assert result["source"] == str(run / "best" / str(best.step))
  assert result["metrics"][TASK]["accuracy"] == best.value
  assert tree_hash(run) == before


@pytest.mark.skipif(not os.path.isdir(embedded.CHECKPOINT_PATH), reason="no embedded toy model")
def test_toy_smop_run_served_from_a_relative_path_with_a_corrupt_folder(tmp_path, monkeypatch,
                                                                        capsys):
  """The newcomer's findings on one run: `.corrupt` folder, relative path, no --vocab."""
  run = tmp_path / "toy_smop"
  # Trained in this process (the serving is under test, not the trainer's command line): a
  # second Python would spend seconds importing what this one has loaded.
  gin.clear_config(clear_constants=True)
  try:
    code = train_main.PROGRAM([
        "--gin_file=gin/models/t5_1_1_toy.gin", "--gin_file=gin/prompts/smop.gin",
        "--gin_file=gin/runs/prompt_tune.gin", f"--gin.MODEL_DIR='{run}'",
        f"--gin.MIXTURE_OR_TASK_NAME='{TOY_TASK}'",
        "--gin.MIXTURE_OR_TASK_MODULE='tasks.embedded'",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 8}",
        "--gin.INITIAL_CHECKPOINT_PATH='spot_jax/embedded/toy_t5/checkpoint'",
        "--gin.TRAIN_STEPS=4", "--gin.EVAL_PERIOD=4", "--gin.BATCH_SIZE=8",
        "--gin.EVAL_NUM_EXAMPLES=16", "--gin.SAVE_PROMPT_STEPS=[]"])
  finally:
    gin.clear_config(clear_constants=True)
  assert code == 0, capsys.readouterr().err[-3000:]
  capsys.readouterr()  # the trainer's progress lines
  backbone = RunDir(run).read_record().backbone
  assert backbone["checkpoint"] == "embedded:toy_t5/checkpoint"
  assert backbone["vocabulary"] == {"kind": "sentencepiece", "path": "embedded:toy_t5/spm.model",
                                    "extra_ids": 100}
  assert backbone["config"]["emb_dim"] == 128  # t5_1_1_toy, not the flags' default
  _leave_debris(run, state=4, aside=12, half=16)
  before = tree_hash(run)
  evaluated = _eval_outputs(run, TOY_TASK, 4)
  (tmp_path / "in.txt").write_text("".join(r["input"]["inputs_pretokenized"] + "\n"
                                           for r in evaluated))
  monkeypatch.chdir(tmp_path)
  code = cli.run(infer_cli.main, ["--prompt=toy_smop", "--input=in.txt", "--output=out.jsonl",
                                  "--input_length=48", "--target_length=8"], infer_cli.PROG)
  err = capsys.readouterr().err
  assert code == 0, err
  assert err == ""  # no random-backbone note, no network, no warning
  served = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert [r["prediction"] for r in served] == [r["output"] for r in evaluated]
  assert tree_hash(run) == before
