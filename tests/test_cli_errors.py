"""Bad input at every command line: exit 2, one `<prog>: error: ...` line, no traceback, nothing lost.

One table, `ROWS`, across all entry points. Each row is
  (id, module, args, fragment of the error line, own process?)
with placeholders in args: {run} a trained smoke MODEL_DIR (checkpoints 10 and 20), {damaged} a
copy of it whose every state is truncated, {tmp} an empty scratch directory, {file} a regular
file. For every row the test asserts: exit status 2; after the start-up notes that libraries
print while loading (absl's C++ log lines, Python absl warnings), exactly one non-empty stderr
line, `<prog>: error: ...`, containing the fragment; no "Traceback" anywhere; and the files of
{run} / {damaged} byte-identical afterwards.

Rows run together in one process (tests/cli_error_runner.py: each as `python -m` would, with
its own stdout/stderr) unless marked to run alone; rows that read orbax checkpoints run alone,
so the teardown of a real process is checked too. To add an entry point's cases, append rows.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from tests.cli_error_runner import tree_hash

REPO = pathlib.Path(__file__).resolve().parents[1]
SMOKE = ["--gin_file=gin/test/smoke.gin"]
RUN = [*SMOKE, "--gin.MODEL_DIR='{run}'", "--gin.train.train.eval_cfg=None", "--gin.TRAIN_STEPS=30",
       "--gin.CHECKPOINT_PERIOD=10"]
FRESH = [*SMOKE, "--gin.MODEL_DIR='{tmp}/fresh'", "--gin.train.train.eval_cfg=None"]
EVAL = ["--gin_file=gin/models/t5_1_1_byte_tiny.gin", "--gin_file=gin/test/smoke_prompt.gin",
        "--gin_file=gin/runs/eval.gin", "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'",
        "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'", "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}",
        "--gin.EVAL_NUM_EXAMPLES=16"]
TRAIN, EVALUATE, CONVERT, BENCH, TASKS = "spot_jax.train", "spot_jax.eval", "spot_jax.convert", "spot_jax.bench", "tasks"
ALONE = True

ROWS = [
    # --- spot_jax.train: flags and gin ---------------------------------------------------------
    ("train unknown flag", TRAIN, [*RUN, "--no_such_flag"], "unrecognised argument '--no_such_flag'", False),
    ("train no gin file", TRAIN, [], "at least one --gin_file is required", False),
    ("train missing gin file", TRAIN, ["--gin_file=gin/runs/no_such_run.gin"], "not found", False),
    ("train unknown gin parameter", TRAIN, [*RUN, "--gin.train.train.no_such_flag=1"],
     "--gin.train.train.no_such_flag=1: Configurable 'train.train' doesn't have a parameter named", False),
    ("train gin syntax error", TRAIN, [*RUN, "--gin.LEARNING_RATE=float('nan')"],
     "--gin.LEARNING_RATE=float('nan'): gin cannot parse it", False),
    ("train unused macro", TRAIN, [*RUN, "--gin.PROMPT_LENGTH=7"],
     "--gin.PROMPT_LENGTH=7 (nothing in this configuration uses the macro PROMPT_LENGTH; did you mean PROMPT or "
     "prompts.PromptTuning.length?)", False),
    ("train unused scoped binding", TRAIN, [*RUN, "--gin.eval/data.DatasetConfig.batch_size=8"],
     "uses data.DatasetConfig in scope 'eval'; did you mean train/data.DatasetConfig.batch_size", False),
    ("train unused once eval is off", TRAIN, [*RUN, "--gin.EVAL_BATCH_SIZE=8", "--gin.TRAIN_STPES=40"],
     "these 2 gin overrides change nothing", False),
    ("train missing MODEL_DIR", TRAIN, SMOKE, "MODEL_DIR", False),
    # --- spot_jax.train: values --------------------------------------------------------------
    ("train unknown task", TRAIN, [*RUN, "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentimnt_v100'"],
     "did you mean 'spot_synthetic_sentiment_v100'", False),
    ("train negative steps", TRAIN, [*RUN, "--gin.TRAIN_STEPS=-5"], "TRAIN_STEPS must be a positive integer", False),
    ("train batch size 0", TRAIN, [*RUN, "--gin.BATCH_SIZE=0"], "BATCH_SIZE must be a positive integer", False),
    ("train prompt length 0", TRAIN, [*RUN, "--gin.prompts.PromptTuning.length=0"], "length", False),
    ("train keep 0", TRAIN, [*RUN, "--gin.CHECKPOINTS_TO_KEEP=0"], "CheckpointConfig.keep=0", False),
    ("train inputs shorter than prompt", TRAIN, [*RUN, "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 12}"],
     "shorter than the prompt", False),
    ("train missing initial checkpoint", TRAIN, [*RUN, "--gin.INITIAL_CHECKPOINT_PATH='{tmp}/nope'"],
     "does not exist", False),
    ("train MODEL_DIR under a file", TRAIN, [*SMOKE, "--gin.MODEL_DIR='{file}/run'"], "is not writable", False),
    # --- spot_jax.train: existing runs (orbax; each in its own process) --------------------------
    ("train restart with another config", TRAIN, [*RUN, "--gin.prompts.PromptTuning.length=7"],
     "does not match this run's configuration (params/prompt/prompt is float32[10, 64] in the checkpoint, "
     "float32[7, 64] in this run)", ALONE),
    ("train every state damaged", TRAIN, [*SMOKE, "--gin.MODEL_DIR='{damaged}'", "--gin.train.train.eval_cfg=None",
                                          "--gin.TRAIN_STEPS=30", "--gin.CHECKPOINT_PERIOD=10"],
     "no readable training state in", ALONE),
    ("train diverges", TRAIN, [*FRESH, "--gin.LEARNING_RATE=1e400", "--gin.TRAIN_STEPS=5"],
     "at step 1; nothing from step 1 on was saved and no checkpoint had been written", ALONE),
    # --- spot_jax.eval -----------------------------------------------------------------------
    ("eval no checkpoint or prompt", EVALUATE, EVAL, "give exactly one of CHECKPOINT_DIR", False),
    ("eval checkpoint dir missing", EVALUATE, [*EVAL, "--gin.CHECKPOINT_DIR='{tmp}/absent'"], "is not a directory", False),
    ("eval prompt file missing", EVALUATE, [*EVAL, "--gin.PROMPT_FILE='{tmp}/p.npy'"], "does not exist", False),
    ("eval unused override", EVALUATE, [*EVAL, "--gin.CHECKPOINT_DIR='{run}'", "--gin.TRAIN_STEPS=5"],
     "uses the macro TRAIN_STEPS", False),
    ("eval step not saved", EVALUATE, [*EVAL, "--gin.CHECKPOINT_DIR='{run}'", "--gin.CHECKPOINT_STEP=999"],
     "looked for checkpoints/999", False),
    # --- spot_jax.convert ----------------------------------------------------------------------
    ("convert no flags", CONVERT, [], "give exactly one of --hf_dir (HF -> T5X) or --checkpoint (T5X/orbax -> HF)", False),
    ("convert hf_dir missing", CONVERT, ["--hf_dir={tmp}/absent", "--output_dir={tmp}/out"], "is not a directory", False),
    ("convert not a HF dir", CONVERT, ["--hf_dir={tmp}", "--output_dir={tmp}/out"], "config.json not found", False),
    ("convert output under a file", CONVERT, ["--hf_dir={tmp}", "--output_dir={file}/out"],
     "a_file' is a file, not a directory; give a directory", False),
    ("convert export under a file", CONVERT, ["--checkpoint={run}", "--model=t5_1_1_byte_tiny",
                                              "--output_dir={file}/sub/hf"], "--output_dir's folder", False),
    ("convert bad format", CONVERT, ["--hf_dir={tmp}", "--output_dir={tmp}/out", "--format=npz"], "invalid choice", False),
    # --- spot_jax.bench ----------------------------------------------------------------------
    ("bench unknown method", BENCH, ["--methods=lora"], "--methods='lora': entry 0 ('lora') is unknown", False),
    ("bench zero steps", BENCH, ["--steps=0"], "must be positive", False),
    ("bench unknown config", BENCH, ["--model=t5_1_1_smal"], "t5_1_1_small", False),
    ("bench not a number", BENCH, ["--batch_size=eight"], "invalid int value", False),
    ("bench no method", BENCH, ["--methods=,"], "--methods=',': entry 0 is empty", False),
    ("bench json in a missing folder", BENCH, ["--json={tmp}/absent/bench.json"], "absent' does not exist", False),
    ("bench markdown is a folder", BENCH, ["--markdown={tmp}"], "is a directory; give a file path", False),
    # --- python -m tasks -----------------------------------------------------------------------
    ("tasks unknown command", TASKS, ["lst"], "invalid choice: 'lst'", False),
    ("tasks unknown flag", TASKS, ["--verbose"], "unrecognized arguments: --verbose", False),
]

# Library notes printed while loading, before the program's own output.
STARTUP_NOTE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
                          r"|[IWE]\d{4} [\d:. ]+\d+ [\w.]+:\d+\] .*"
                          r"|WARNING:absl:.*)$")


def _prog(module: str) -> str:
  return module


@pytest.fixture(scope="module")
def places(tmp_path_factory):
  """{run}, {damaged}, {tmp}, {file}: a trained smoke run (checkpoints 10, 20) and its damaged copy."""
  root = tmp_path_factory.mktemp("cli_errors")
  run = root / "run"
  proc = subprocess.run([sys.executable, "-m", TRAIN, *SMOKE, f"--gin.MODEL_DIR='{run}'",
                         "--gin.train.train.eval_cfg=None", "--gin.TRAIN_STEPS=20", "--gin.CHECKPOINT_PERIOD=10"],
                        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["10", "20"]
  damaged = root / "damaged"
  shutil.copytree(run, damaged)
  for f in (damaged / "checkpoints").glob("*/default/ocdbt.process_0/d/*"):
    os.truncate(f, 10)
  tmp = root / "scratch"
  tmp.mkdir()
  blocker = root / "a_file"
  blocker.write_text("not a directory")
  return {"run": str(run), "damaged": str(damaged), "tmp": str(tmp), "file": str(blocker),
          "hashes": {str(run): tree_hash(run), str(damaged): tree_hash(damaged)}}


def _env() -> dict:
  return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))


def _fill(arg: str, places: dict) -> str:
  for key in ("run", "damaged", "tmp", "file"):
    arg = arg.replace("{" + key + "}", places[key])
  return arg


def _case(row, places) -> dict:
  _, module, args, _, _ = row
  args = [_fill(a, places) for a in args]
  watched = [places[k] for k in ("run", "damaged") if any(places[k] in a for a in args)]
  return {"module": module, "args": args, "model_dir": watched[0] if watched else None}


@pytest.fixture(scope="module")
def shared_results(places, tmp_path_factory):
  """Results of every row that shares one process, by id."""
  rows = [r for r in ROWS if not r[4]]
  folder = tmp_path_factory.mktemp("runner")
  (folder / "cases.json").write_text(json.dumps([_case(r, places) for r in rows]))
  proc = subprocess.run([sys.executable, str(REPO / "tests" / "cli_error_runner.py"), str(folder / "cases.json"),
                         str(folder / "results.json")], cwd=REPO, env=_env(), capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return dict(zip((r[0] for r in rows), json.loads((folder / "results.json").read_text())))


def test_at_least_twenty_distinct_bad_inputs_over_every_entry_point():
  assert len({r[0] for r in ROWS}) == len(ROWS) >= 20
  assert {r[1] for r in ROWS} >= {TRAIN, EVALUATE, CONVERT, BENCH, TASKS}


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_exit_2_and_nothing_lost(row, places, request):
  name, module, _, fragment, alone = row
  case = _case(row, places)
  if alone:
    proc = subprocess.run([sys.executable, "-m", module, *case["args"]], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=600)
    code, stderr = proc.returncode, proc.stderr
    after = tree_hash(case["model_dir"]) if case["model_dir"] else ""
  else:
    result = request.getfixturevalue("shared_results")[name]
    code, stderr, after = result["code"], result["stderr"], result["hash"]
  assert code == 2, (code, stderr[-3000:])
  assert "Traceback" not in stderr, stderr[-3000:]
  lines = [l for l in stderr.splitlines() if l.strip() and not STARTUP_NOTE.match(l)]
  assert len(lines) == 1, stderr[-3000:]
  assert lines[0].startswith(f"{_prog(module)}: error: "), lines[0]
  assert fragment in lines[0], lines[0]
  assert stderr.rstrip().splitlines()[-1] == lines[0]  # nothing after the error line
  if case["model_dir"]:
    assert after == places["hashes"][case["model_dir"]], f"{case['model_dir']} changed"
