"""Bad input at every command line: exit 2, one `<prog>: error: ...` line, no traceback,
nothing lost.

One table across all entry points, tests/e2e/cli_errors.jsonl (read into `ROWS`). Each row is
  (id, module, args, fragment of the error line, own process?)
with placeholders in args and fragments: {run} a trained smoke MODEL_DIR (checkpoints 10 and 20),
{damaged} a copy of it whose every state is truncated, {tmp} an empty scratch directory, {file} a
regular file, {gin_dir} a folder of broken gin files (syntax.gin: a syntax error on line 2;
includes.gin: line 1 includes unclosed.gin, whose bracket on line 2 never closes; unknown.gin: line
3 binds a parameter train.train does not have), {foreign} folders that are not a study's
(`FOREIGN`), {fp0} / {fp1} / {fp_test} the fingerprint ids of the random t5_1_1_byte_tiny backbones
of seeds 0 (the run's) and 1 and of t5_1_1_test's of seed 0, {ckpt} a t5_1_1_byte_tiny checkpoint
(other weights than the run's) and {fp_ckpt} its description. For every row the test asserts: exit
status 2; exactly one stderr line, `<prog>: error: ...`, containing the fragment (nothing else:
the libraries' start-up lines are off, spot_jax/quiet_logs.py; rows in TRAINS may show their run's
warnings first); no "Traceback"; and the files of {run} / {damaged} / {foreign} byte-identical
afterwards.

Rows run together in one process (tests/helpers/cli_error_runner.py: each as `python -m` would, with
its own stdout/stderr) unless marked to run alone; rows that read orbax checkpoints run alone,
so the teardown of a real process is checked too. To add an entry point's cases, add lines to
the table.
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
from spot_jax.backbones.t5 import checkpoints, config_by_name
from tests.helpers import REPO
from tests.helpers.cli_error_runner import run_cases, tree_hash
from tests.helpers.cli_errors import _env
from tests.helpers.prompt_train import frozen_backbone

SMOKE = ["--gin_file=gin/test/smoke.gin"]
RUN = [*SMOKE, "--gin.MODEL_DIR='{run}'", "--gin.train.train.eval_cfg=None", "--gin.TRAIN_STEPS=30",
       "--gin.CHECKPOINT_PERIOD=10"]
FRESH = [*SMOKE, "--gin.MODEL_DIR='{tmp}/fresh'", "--gin.train.train.eval_cfg=None"]
EVAL = ["--gin_file=gin/models/t5_1_1_byte_tiny.gin", "--gin_file=gin/test/smoke_prompt.gin",
        "--gin_file=gin/runs/eval.gin",
        "--gin.MIXTURE_OR_TASK_NAME='spot_synthetic_sentiment_v100'",
        "--gin.MIXTURE_OR_TASK_MODULE='tasks.synthetic'",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 12}", "--gin.EVAL_NUM_EXAMPLES=16"]
TRAIN, EVALUATE, CONVERT, BENCH, TASKS = ("spot_jax.train", "spot_jax.eval", "spot_jax.convert",
                                          "benchmarks", "tasks")
INFER, LENGTHS, LIBRARY, STUDY = ("spot_jax.infer", "benchmarks.lengths", "spot_jax.library",
                                  "spot_jax.study")
RETRIEVE, REPORT, SERVE_BENCH = "spot_jax.retrieve", "spot_jax.report", "benchmarks.serve"

TABLE = REPO / "tests" / "e2e" / "cli_errors.jsonl"
ARG_LISTS = {"SMOKE": SMOKE, "RUN": RUN, "FRESH": FRESH, "EVAL": EVAL}


def load_rows(path: pathlib.Path) -> list[tuple]:
  """The table's rows as (id, module, args, fragment, alone). A row is one JSON object a line
  ({"id", "program", "args", "error", optional "alone": true}); "$NAME" in its args stands for
  the list NAME of ARG_LISTS; blank lines and lines starting with "#" are comments."""
  rows = []
  for number, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip() or line.startswith("#"):
      continue
    row = json.loads(line)
    unexpected = set(row) - {"id", "program", "args", "error", "alone"}
    assert (not unexpected
            and row.get("alone", True) is True), f"{path.name}, line {number}: {unexpected or row}"
    args = [a for arg in row["args"]
            for a in (ARG_LISTS[arg[1:]] if arg.startswith("$") else [arg])]
    rows.append((row["id"], row["program"], args, row["error"], row.get("alone", False)))
  return rows


ROWS = load_rows(TABLE)

# Rows that train before they fail: the run's own Python warnings (seqio's advice on uncached
# datasets, as `WARNING:absl:...`) may precede the error line; every other row prints that line
# alone.
TRAINS = {"train diverges"}
RUN_WARNING = re.compile(r"^WARNING:absl:")


# {foreign}/<name>: an empty folder, and results.json files that are not a study's (the demo's
# summary, a list, text that is not JSON).
FOREIGN = {"empty": None,
           "demo": json.dumps({"chance": {"t": 50.0}, "methods": ["pt"], "targets": ["t"],
                               "settings": {"seed": 0, "target_steps": 10},
                               "runs": [{"task": "t", "method": "pt", "role": "target",
                                         "accuracy": 50.0, "seconds": 1.0}]}),
           "list": "[]", "not_json": "{rows: 1"}


def _prog(module: str) -> str:
  return module


@pytest.fixture(scope="module")
def places(tmp_path_factory):
  """{run}, {damaged}, {tmp}, {file}: a trained smoke run (checkpoints 10, 20)
  and its damaged copy."""
  root = tmp_path_factory.mktemp("cli_errors")
  run = root / "run"
  proc = subprocess.run([sys.executable, "-m", TRAIN, *SMOKE, f"--gin.MODEL_DIR='{run}'",
                         "--gin.train.train.eval_cfg=None", "--gin.TRAIN_STEPS=20",
                         "--gin.CHECKPOINT_PERIOD=10"],
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
  (gin_dir / "unknown.gin").write_text("from __gin__ import dynamic_registration\n"
                                       "from spot_jax import train\n"
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
  weights = jax.tree_util.tree_map(np.asarray,
                                   frozen_backbone(config_by_name("t5_1_1_byte_tiny"), 1))
  checkpoints.save_checkpoint(weights, str(ckpt), format="t5x")
  fps.update(ckpt=str(ckpt), fp_ckpt=backbone_lib.describe(
      backbone_lib.fingerprint(config_by_name("t5_1_1_byte_tiny"), str(ckpt), 0)))
  foreign = root / "foreign"  # folders that are not a study's, for spot_jax.report
  for name, text in FOREIGN.items():
    (foreign / name).mkdir(parents=True)
    if text is not None:
      (foreign / name / "results.json").write_text(text)
  decoder = _decoder_inputs(root / "decoder")
  return {"run": str(run), "damaged": str(damaged), "tmp": str(tmp), "file": str(blocker),
          "gin_dir": str(gin_dir),
          "foreign": str(foreign), "decoder": str(decoder), **fps,
          "hashes": {str(run): tree_hash(run), str(damaged): tree_hash(damaged),
                     str(foreign): tree_hash(foreign), str(decoder): tree_hash(decoder)}}


def _decoder_inputs(root: pathlib.Path) -> pathlib.Path:
  """{decoder}: Hugging Face config.json files the decoder network does not support (relu2,
  yarn), a 32-wide prompt for decoder_tiny_gemma3 and a SentencePiece model of 500 ids, more
  than its 384-row table."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  llama = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=384,
               hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, hidden_act="silu", rms_norm_eps=1e-6,
               rope_theta=10000.0, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)
  for name, change in (("relu2", dict(hidden_act="relu2")),
                       ("yarn", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}))):
    (root / name).mkdir(parents=True)
    (root / name / "config.json").write_text(json.dumps({**llama, **change}))
  np.save(root / "prompt.npy", np.zeros((4, 32), np.float32))
  rng = np.random.RandomState(0)
  words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.randint(2, 9)))
           for _ in range(3000)]
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(" ".join(rng.choice(words, 12)) for _ in range(4000)),
      model_prefix=str(root / "big"), vocab_size=500, model_type="bpe", pad_id=0, eos_id=1,
      unk_id=2, bos_id=-1, minloglevel=2)
  return root


def _fill(arg: str, places: dict) -> str:
  for key in ("run", "damaged", "tmp", "file", "gin_dir", "foreign", "decoder", "fp0", "fp1",
              "fp_test",
              "ckpt", "fp_ckpt"):
    arg = arg.replace("{" + key + "}", places[key])
  return arg


def _case(row, places) -> dict:
  _, module, args, _, _ = row
  args = [_fill(a, places) for a in args]
  watched = [places[k] for k in ("run", "damaged", "foreign", "decoder")
             if any(places[k] in a for a in args)]
  return {"module": module, "args": args, "model_dir": watched[0] if watched else None}


@pytest.fixture(scope="module")
def shared_results(places):
  """Results of every row that shares one process, by id."""
  rows = [r for r in ROWS if not r[4]]
  results = run_cases([_case(r, places) for r in rows], _env(), timeout=900)
  return dict(zip((r[0] for r in rows), results))


def test_at_least_twenty_distinct_bad_inputs_over_every_entry_point():
  assert len({r[0] for r in ROWS}) == len(ROWS) >= 20
  assert {r[1] for r in ROWS} >= {TRAIN, EVALUATE, CONVERT, BENCH, TASKS, INFER, LENGTHS, LIBRARY,
                                  STUDY, RETRIEVE, REPORT, SERVE_BENCH}


def test_every_renamed_flag_has_a_row():
  from spot_jax.cli import renamed  # pylint: disable=g-import-not-at-top
  refused = {a.split("=")[0] for r in ROWS if "was renamed" in r[3] for a in r[2]
             if a.split("=")[0] in renamed.RENAMED}
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
