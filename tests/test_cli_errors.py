"""Bad input at every command line: exit 2, one `<prog>: error: ...` line, no traceback, nothing lost.

One table, `ROWS`, across all entry points. Each row is
  (id, module, args, fragment of the error line, own process?)
with placeholders in args: {run} a trained smoke MODEL_DIR (checkpoints 10 and 20), {damaged} a
copy of it whose every state is truncated, {tmp} an empty scratch directory, {file} a regular
file, {gin_dir} a folder of broken gin files (syntax.gin: a syntax error on line 2; includes.gin:
line 1 includes unclosed.gin, whose bracket on line 2 never closes; unknown.gin: line 3 binds a
parameter train.train does not have), {foreign} folders that are not a study's (`FOREIGN`),
{fp0} / {fp1} / {fp_test} the fingerprint ids of the random t5_1_1_byte_tiny backbones of seeds 0
(the run's) and 1 and of t5_1_1_test's of seed 0, {ckpt} a t5_1_1_byte_tiny checkpoint (other
weights than the run's) and {fp_ckpt} its description. For every row the test asserts: exit
status 2; exactly one stderr line, `<prog>: error: ...`, containing the fragment (nothing else:
the libraries' start-up lines are off, spot_jax/startup.py; rows in TRAINS may show their run's
warnings first); no "Traceback"; and the files of {run} / {damaged} / {foreign} byte-identical
afterwards.

Rows run together in one process (tests/cli_error_runner.py: each as `python -m` would, with
its own stdout/stderr) unless marked to run alone; rows that read orbax checkpoints run alone,
so the teardown of a real process is checked too. To add an entry point's cases, append rows.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from spot_jax import backbone as backbone_lib
from spot_jax.run_dir import RunDir
from spot_jax.t5 import checkpoints, config_by_name
from tests.prompt_train_util import frozen_backbone
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
INFER, LENGTHS, LIBRARY, STUDY = "spot_jax.infer", "spot_jax.bench.lengths", "spot_jax.library", "spot_jax.study"
RETRIEVE, REPORT, SERVE_BENCH = "spot_jax.retrieve", "spot_jax.report", "spot_jax.bench.serve"
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
    ("train missing MODEL_DIR", TRAIN, SMOKE, "MODEL_DIR is required: give --gin.MODEL_DIR=", False),
    ("train macro never set", TRAIN, ["--gin_file=gin/runs/prompt_tune.gin", "--gin.MODEL_DIR='{run}'"],
     "the macro MODEL is used but never set; give --gin.MODEL=... or a gin file that sets it", False),
    # --- spot_jax.train: values --------------------------------------------------------------
    ("train unknown task", TRAIN, [*RUN, "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentimnt_v100'"],
     "did you mean 'spot_synthetic_sentiment_v100'", False),
    ("train negative steps", TRAIN, [*RUN, "--gin.TRAIN_STEPS=-5"], "TRAIN_STEPS must be a positive integer", False),
    ("train batch size 0", TRAIN, [*RUN, "--gin.BATCH_SIZE=0"], "BATCH_SIZE must be a positive integer", False),
    ("train prompt length 0", TRAIN, [*RUN, "--gin.prompts.PromptTuning.length=0"], "length", False),
    ("train keep 0", TRAIN, [*RUN, "--gin.CHECKPOINTS_TO_KEEP=0"], "CHECKPOINTS_TO_KEEP must be a positive integer, got 0",
     False),
    ("train inputs shorter than prompt", TRAIN, [*RUN, "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 12}"],
     "shorter than the prompt", False),
    ("train missing initial checkpoint", TRAIN, [*RUN, "--gin.INITIAL_CHECKPOINT_PATH='{tmp}/nope'"],
     "does not exist", False),
    ("train MODEL_DIR under a file", TRAIN, [*SMOKE, "--gin.MODEL_DIR='{file}/run'"],
     "MODEL_DIR '{file}/run': '{file}' is a file, not a directory", False),
    # --- spot_jax.train: gin text, types and lists ---------------------------------------------
    ("train gin syntax error in a file", TRAIN, [*RUN, "--gin_file={gin_dir}/syntax.gin"],
     "--gin_file={gin_dir}/syntax.gin, line 2 (BATCH_SIZE = 8 16): Expected newline", False),
    ("train gin syntax error in an included file", TRAIN, [*RUN, "--gin_file={gin_dir}/includes.gin"],
     "unclosed.gin, line 3 (included from {gin_dir}/includes.gin, line 1): the file ends inside an unclosed "
     "bracket or string", False),
    ("train unknown parameter in a gin file", TRAIN, [*RUN, "--gin_file={gin_dir}/unknown.gin"],
     "unknown.gin, line 3 (train.train.no_such_parameter = 1): Configurable 'train.train' doesn't have a "
     "parameter named 'no_such_parameter'", False),
    ("train gin syntax error in a binding", TRAIN, [*RUN, "--gin.TRAIN_STEPS=(30"],
     "--gin.TRAIN_STEPS=(30: gin cannot parse it (EOF in multi-line statement)", False),
    ("train string for a number", TRAIN, [*RUN, "--gin.LEARNING_RATE='0.3'"],
     "LEARNING_RATE='0.3' (optimizers.adafactor.learning_rate): must be a number or a callable, got '0.3'", False),
    ("train string for an integer", TRAIN, [*RUN, "--gin.BATCH_SIZE='16'"],
     "BATCH_SIZE='16' (train/data.DatasetConfig.batch_size): must be an integer, got '16'", False),
    ("train value refused names its binding", TRAIN, [*RUN, "--gin.LEARNING_RATE=-0.3"],
     "LEARNING_RATE=-0.3 (optimizers.adafactor.learning_rate): learning_rate must be a positive number", False),
    ("train list entry of another type", TRAIN, [*RUN, "--gin.SAVE_PROMPT_STEPS=[10, 'x']"],
     "SAVE_PROMPT_STEPS=[10, 'x'] (train.CheckpointConfig.save_prompt_steps): entry 1 ('x') must be an integer",
     False),
    ("train list entry out of range", TRAIN, [*RUN, "--gin.SAVE_PROMPT_STEPS=[10, -3]"],
     "SAVE_PROMPT_STEPS=[10, -3]: entry 1 (-3) must be a positive step <= TRAIN_STEPS=30", False),
    ("train list entry past the end", TRAIN, [*RUN, "--gin.SAVE_PROMPT_STEPS=[10, 31]"],
     "entry 1 (31) must be a positive step <= TRAIN_STEPS=30", False),
    ("train bucket entry out of range", TRAIN, [*RUN, "--gin.LENGTH_BUCKETS=(16, 96)"],
     "LENGTH_BUCKETS=(16, 96): entry 1 (96) goes beyond TASK_FEATURE_LENGTHS['inputs']=48", False),
    ("train dict entry of another type", TRAIN, [*RUN, "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': '12'}"],
     "entry ['targets'] ('12') must be an integer", False),
    ("train unknown eval split", TRAIN, [*SMOKE, "--gin.MODEL_DIR='{run}'", "--gin.TRAIN_STEPS=30",
                                        "--gin.CHECKPOINT_PERIOD=10", "--gin.EVAL_SPLIT='valid'"],
     "EVAL_SPLIT='valid': task 'spot_synthetic_sentiment_v100' has no such split; valid: ", False),
    # --- spot_jax.train: existing runs (orbax; each in its own process) --------------------------
    ("train restart with another config", TRAIN, [*RUN, "--gin.prompts.PromptTuning.length=7"],
     "does not match this run's configuration (params/prompt/prompt is float32[10, 64] in the checkpoint, "
     "float32[7, 64] in this run)", ALONE),
    ("train every state damaged", TRAIN, [*SMOKE, "--gin.MODEL_DIR='{damaged}'", "--gin.train.train.eval_cfg=None",
                                          "--gin.TRAIN_STEPS=30", "--gin.CHECKPOINT_PERIOD=10"],
     "no readable training state in", ALONE),
    ("train restart on another backbone", TRAIN, [*RUN, "--gin.INITIAL_CHECKPOINT_PATH='{ckpt}'"],
     "{run} was trained against frozen model {fp0} (random:0), not {fp_ckpt} given now; give the backbone "
     "it was trained with (config and checkpoint), or --gin.ALLOW_BACKBONE_CHANGE=True to move the prompt on "
     "purpose", ALONE),
    ("train diverges", TRAIN, [*FRESH, "--gin.LEARNING_RATE=1e400", "--gin.TRAIN_STEPS=5", "--gin.SAVE_PROMPT_STEPS=[]"],
     "at step 1; nothing from step 1 on was saved and no checkpoint had been written", ALONE),
    # --- spot_jax.eval -----------------------------------------------------------------------
    ("eval no checkpoint or prompt", EVALUATE, EVAL, "give exactly one of MODEL_DIR", False),
    ("eval checkpoint dir missing", EVALUATE, [*EVAL, "--gin.MODEL_DIR='{tmp}/absent'"], "is not a directory", False),
    ("eval prompt file missing", EVALUATE, [*EVAL, "--gin.PROMPT_FILE='{tmp}/p.npy'"], "does not exist", False),
    ("eval unused override", EVALUATE, [*EVAL, "--gin.MODEL_DIR='{run}'", "--gin.TRAIN_STEPS=5"],
     "uses the macro TRAIN_STEPS", False),
    ("eval step not saved", EVALUATE, [*EVAL, "--gin.MODEL_DIR='{run}'", "--gin.CHECKPOINT_STEP=999"],
     "looked for checkpoints/999", False),
    ("eval renamed macro", EVALUATE, [*EVAL, "--gin.CHECKPOINT_DIR='{run}'"],
     "--gin.CHECKPOINT_DIR was renamed MODEL_DIR; use --gin.MODEL_DIR='{run}'", False),
    ("eval string for an integer", EVALUATE, [*EVAL, "--gin.MODEL_DIR='{run}'", "--gin.EVAL_BATCH_SIZE='8'"],
     "EVAL_BATCH_SIZE='8' (evaluator.EvalConfig.batch_size): must be an integer, got '8'", False),
    ("eval another backbone", EVALUATE, [*EVAL, "--gin.MODEL_DIR='{run}'", "--gin.RANDOM_SEED=1"],
     "{run} was trained against frozen model {fp0} (random:0), not {fp1} (random:1) given now; give the backbone "
     "it was trained with (config and checkpoint), or --gin.ALLOW_BACKBONE_CHANGE=True", False),
    ("eval gin syntax error in a file", EVALUATE, [*EVAL, "--gin_file={gin_dir}/syntax.gin"],
     "--gin_file={gin_dir}/syntax.gin, line 2", False),
    # --- spot_jax.infer and library add: another backbone than the run recorded ------------------
    ("infer another backbone", INFER, ["--prompt={run}", "--model=t5_1_1_test", "--input={file}", "--output={tmp}/o.jsonl"],
     "--prompt {run} was trained against frozen model {fp0} (random:0), not {fp_test} (random:0) given now; give "
     "the backbone it was trained with (config and checkpoint), or --allow_backbone_change", False),
    ("infer another random backbone", INFER, ["--prompt={run}", "--model=t5_1_1_byte_tiny", "--seed=1",
                                              "--input={file}", "--output={tmp}/o.jsonl"],
     "--prompt {run} was trained against frozen model {fp0} (random:0), not {fp1} (random:1)", False),
    ("infer another checkpoint", INFER, ["--prompt={run}", "--checkpoint={ckpt}", "--input={file}",
                                         "--output={tmp}/o.jsonl"],
     "--prompt {run} was trained against frozen model {fp0} (random:0), not {fp_ckpt} given now", False),
    ("infer export on another config", INFER, ["--prompt={run}", "--model=t5_1_1_test", "--export_npy={tmp}/p.npy"],
     "--prompt {run} was trained against frozen model {fp0} (random:0), whose config differs from --model's; give "
     "the --model it was trained with, or --allow_backbone_change", False),
    ("infer runs of two backbones", INFER, ["--prompt=a={run}", "--prompt=b={tmp}/other_run", "--input={file}",
                                            "--output={tmp}/o.jsonl"],
     "--prompt {run} was trained against frozen model {fp0} (random:0) and --prompt {tmp}/other_run against "
     "{fp1} (random:1); serve them in separate calls", False),
    ("library add another backbone", LIBRARY, ["add", "--library={tmp}/lib", "--run_dir={run}", "--model=t5_1_1_test"],
     "--run_dir '{run}' was trained against frozen model {fp0} (random:0), not {fp_test} (random:0) given now; "
     "give the backbone it was trained with (config and checkpoint), or --allow_backbone_change", False),
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
    ("bench unknown method", BENCH, ["--methods=lora"], "--methods='lora': entry 0 ('lora') is unknown; valid: pt100",
     False),
    ("bench zero steps", BENCH, ["--steps=0"], "must be positive", False),
    ("bench unknown config", BENCH, ["--model=t5_1_1_smal"], "t5_1_1_small", False),
    ("bench not a number", BENCH, ["--batch_size=eight"], "invalid int value", False),
    ("bench no method", BENCH, ["--methods=,"], "--methods=',': entry 0 is empty", False),
    ("bench json in a missing folder", BENCH, ["--json={tmp}/absent/bench.json"], "absent' does not exist", False),
    ("bench markdown is a folder", BENCH, ["--markdown={tmp}"], "is a directory; give a file path", False),
    ("bench dropout out of range", BENCH, ["--dropout_rate=1.5"], "dropout_rate must be in [0, 1)", False),
    # --- spot_jax.bench.serve ----------------------------------------------------------------
    ("bench.serve workload not PxN", SERVE_BENCH, ["--workloads=64"], "workload '64' is not PxN", False),
    ("bench.serve workload of 0 prompts", SERVE_BENCH, ["--workloads=0x3"], "workload '0x3' is not PxN", False),
    ("bench.serve unknown method", SERVE_BENCH, ["--methods=residual100"], "unknown method 'residual100'", False),
    ("bench.serve unknown task", SERVE_BENCH, ["--tasks=sample"], "unknown task 'sample'", False),
    ("bench.serve zero repeats", SERVE_BENCH, ["--repeats=0"], "--repeats=0: sizes must be positive", False),
    # --- every renamed flag: refused, naming the new one ---------------------------------------
    ("infer --config_name", INFER, ["--config_name=t5_1_1_byte_tiny", "--prompt={tmp}/p.npy"],
     "--config_name was renamed --model; use --model=t5_1_1_byte_tiny (see --help)", False),
    ("infer --max_decode_length", INFER, ["--model=t5_1_1_byte_tiny", "--max_decode_length", "8"],
     "--max_decode_length was renamed --target_length; use --target_length=8", False),
    ("convert --config_name", CONVERT, ["--checkpoint={run}", "--config_name", "t5_1_1_byte_tiny",
                                        "--output_dir={tmp}/hf"], "--config_name was renamed --model", False),
    ("bench --config", BENCH, ["--config=t5_small"], "--config was renamed --model; use --model=t5_small", False),
    ("bench.lengths --config", LENGTHS, ["--config=t5_small"], "--config was renamed --model", False),
    ("library --initial_checkpoint_path", LIBRARY, ["add", "--library={tmp}/lib", "--initial_checkpoint_path={run}"],
     "--initial_checkpoint_path was renamed --checkpoint; use --checkpoint=", False),
    ("study --inputs_length", STUDY, ["--study_dir={tmp}/s", "--model=t5_1_1_byte_tiny", "--inputs_length=24"],
     "--inputs_length was renamed --input_length; use --input_length=24", False),
    ("study --targets_length", STUDY, ["--study_dir={tmp}/s", "--model=t5_1_1_byte_tiny", "--targets_length=6"],
     "--targets_length was renamed --target_length; use --target_length=6", False),
    ("retrieve --initial_checkpoint_path", RETRIEVE, ["--library={tmp}", "--target_task=x", "--output_dir={tmp}/w",
                                                      "--model=t5_1_1_byte_tiny", "--initial_checkpoint_path={run}"],
     "--initial_checkpoint_path was renamed --checkpoint", False),
    ("retrieve --work_dir", RETRIEVE, ["--library={tmp}", "--target_task=x", "--work_dir={tmp}/w",
                                       "--model=t5_1_1_byte_tiny"], "--work_dir was renamed --output_dir", False),
    ("report --out_dir", REPORT, ["--study_dir={tmp}", "--out_dir={tmp}/r"],
     "--out_dir was renamed --output_dir; use --output_dir=", False),
    # --- spot_jax.report on a folder that is not a study's ------------------------------------
    ("report missing folder", REPORT, ["--study_dir={tmp}/no_such_study"],
     "--study_dir '{tmp}/no_such_study' does not exist; give the folder of a `python -m spot_jax.study` run, "
     "where it wrote results.json", False),
    ("report on a file", REPORT, ["--study_dir={file}"], "--study_dir '{file}' is a file, not a folder; give the "
     "folder of a `python -m spot_jax.study` run", False),
    ("report empty folder", REPORT, ["--study_dir={foreign}/empty"],
     "--study_dir '{foreign}/empty' is empty; give the folder of a `python -m spot_jax.study` run", False),
    ("report on a run directory", REPORT, ["--study_dir={run}"],
     "--study_dir '{run}' has no results.json (it holds ", False),
    ("report on the demo's results.json", REPORT, ["--study_dir={foreign}/demo"],
     "'{foreign}/demo/results.json' is not the results.json of a `python -m spot_jax.study` run", False),
    ("report on a results.json list", REPORT, ["--study_dir={foreign}/list"],
     "'{foreign}/list/results.json' is not the results.json of a `python -m spot_jax.study` run", False),
    ("report on a results.json not JSON", REPORT, ["--study_dir={foreign}/not_json"],
     "results.json '{foreign}/not_json/results.json' is not valid JSON", False),
    # --- list-valued command-line settings, entry by entry --------------------------------------
    ("study seed out of range", STUDY, ["--study_dir={tmp}/s", "--model=t5_1_1_byte_tiny", "--seeds=0,-1"],
     "--seeds='0,-1': entry 1 (-1) must be >= 0", False),
    ("study empty source entry", STUDY, ["--study_dir={tmp}/s", "--model=t5_1_1_byte_tiny", "--sources=a,,b",
                                         "--targets=c"], "--sources='a,,b': entry 1 is empty", False),
    ("study input shorter than the prompt", STUDY, ["--study_dir={tmp}/s", "--model=t5_1_1_byte_tiny",
                                                     "--input_length=8", "--prompt_length=10"],
     "--input_length=8 is shorter than --prompt_length=10", False),
    ("retrieve task metric malformed", RETRIEVE, ["--library={tmp}", "--target_task=x", "--output_dir={tmp}/w",
                                                  "--model=t5_1_1_byte_tiny", "--task_metric=a=b", "--task_metric=c"],
     "--task_metric entry 1 ('c') is malformed", False),
    # --- python -m tasks -----------------------------------------------------------------------
    ("tasks unknown command", TASKS, ["lst"], "invalid choice: 'lst'", False),
    ("tasks unknown flag", TASKS, ["--verbose"], "unrecognized arguments: --verbose", False),
]

# Rows that train before they fail: the run's own Python warnings (seqio's advice on uncached
# datasets, as `WARNING:absl:...`) may precede the error line; every other row prints that line alone.
TRAINS = {"train diverges"}
RUN_WARNING = re.compile(r"^WARNING:absl:")

# Library notes printed while loading, before a program's own output, in the past (spot_jax/startup.py
# now keeps them off; other tests still filter with this).
STARTUP_NOTE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
                          r"|[IWE]\d{4} [\d:. ]+\d+ [\w.]+:\d+\] .*"
                          r"|WARNING:absl:.*)$")


# {foreign}/<name>: an empty folder, and results.json files that are not a study's (the demo's
# summary, a list, text that is not JSON).
FOREIGN = {"empty": None,
           "demo": json.dumps({"chance": {"t": 50.0}, "methods": ["pt"], "targets": ["t"],
                               "settings": {"seed": 0, "target_steps": 10},
                               "runs": [{"task": "t", "method": "pt", "role": "target", "accuracy": 50.0,
                                         "seconds": 1.0}]}),
           "list": "[]", "not_json": "{rows: 1"}


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
  gin_dir = root / "gin"
  gin_dir.mkdir()
  (gin_dir / "syntax.gin").write_text("TRAIN_STEPS = 30\nBATCH_SIZE = 8 16\n")
  (gin_dir / "unclosed.gin").write_text("TRAIN_STEPS = 30\nBATCH_SIZE = (8\n")
  (gin_dir / "includes.gin").write_text(f"include '{gin_dir / 'unclosed.gin'}'\n")
  (gin_dir / "unknown.gin").write_text("from __gin__ import dynamic_registration\nfrom spot_jax import train\n"
                                       "train.train.no_such_parameter = 1\n")
  other_run = RunDir(tmp / "other_run")  # the run's record on another random backbone (seed 1)
  record = RunDir(run).read_record()
  other_run.path.mkdir()
  shutil.copytree(run / "prompts", other_run.prompts)
  other_backbone = backbone_lib.record(config_by_name("t5_1_1_byte_tiny"), None, 1, None)
  other_run.write_record(dataclasses.replace(record, seed=1, backbone=other_backbone))
  fps = {name: backbone_lib.fingerprint(config_by_name(model), None, seed)["id"]
         for name, model, seed in (("fp0", "t5_1_1_byte_tiny", 0), ("fp1", "t5_1_1_byte_tiny", 1),
                                   ("fp_test", "t5_1_1_test", 0))}
  assert record.fingerprint["id"] == fps["fp0"]
  ckpt = root / "byte_tiny_checkpoint"  # the run's model with other weights
  weights = jax.tree_util.tree_map(np.asarray, frozen_backbone(config_by_name("t5_1_1_byte_tiny"), 1))
  checkpoints.save_checkpoint(weights, str(ckpt), format="t5x")
  fps.update(ckpt=str(ckpt), fp_ckpt=backbone_lib.describe(
      backbone_lib.fingerprint(config_by_name("t5_1_1_byte_tiny"), str(ckpt), 0)))
  foreign = root / "foreign"  # folders that are not a study's, for spot_jax.report
  for name, text in FOREIGN.items():
    (foreign / name).mkdir(parents=True)
    if text is not None:
      (foreign / name / "results.json").write_text(text)
  return {"run": str(run), "damaged": str(damaged), "tmp": str(tmp), "file": str(blocker), "gin_dir": str(gin_dir),
          "foreign": str(foreign), **fps, "hashes": {str(run): tree_hash(run), str(damaged): tree_hash(damaged),
                                                     str(foreign): tree_hash(foreign)}}


def _env() -> dict:
  return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))


def _fill(arg: str, places: dict) -> str:
  for key in ("run", "damaged", "tmp", "file", "gin_dir", "foreign", "fp0", "fp1", "fp_test", "ckpt",
              "fp_ckpt"):
    arg = arg.replace("{" + key + "}", places[key])
  return arg


def _case(row, places) -> dict:
  _, module, args, _, _ = row
  args = [_fill(a, places) for a in args]
  watched = [places[k] for k in ("run", "damaged", "foreign") if any(places[k] in a for a in args)]
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
  assert {r[1] for r in ROWS} >= {TRAIN, EVALUATE, CONVERT, BENCH, TASKS, INFER, LENGTHS, LIBRARY, STUDY, RETRIEVE,
                                  REPORT, SERVE_BENCH}


def test_every_renamed_flag_has_a_row():
  from spot_jax.cli import renamed  # pylint: disable=g-import-not-at-top
  refused = {a.split("=")[0] for r in ROWS if "was renamed" in r[3] for a in r[2] if a.split("=")[0] in renamed.RENAMED}
  assert refused == set(renamed.RENAMED), set(renamed.RENAMED) - refused


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
  lines = [l for l in stderr.splitlines() if not (name in TRAINS and RUN_WARNING.match(l))]
  assert len(lines) == 1, stderr[-3000:]
  assert lines[0].startswith(f"{_prog(module)}: error: "), lines[0]
  assert _fill(fragment, places) in lines[0], lines[0]
  if case["model_dir"]:
    assert after == places["hashes"][case["model_dir"]], f"{case['model_dir']} changed"
