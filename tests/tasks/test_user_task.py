"""A user's own task from a file (tasks.register_file_task), task modules from the working
directory or a .py path, and paths that resolve from any working directory (gin files, the
embedded checkpoint). The last test is docs/tasks.md's worked example, run as a user would."""
from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import seqio

import tasks
from spot_jax import backbone, data, embedded
from spot_jax.cli import gin_flags
from spot_jax.errors import ConfigError
from tasks import metrics as metrics_lib
from tests.helpers import REPO

LABELS = ("yes", "no")


def _tsv(path: pathlib.Path, rows, header=("text", "label")) -> pathlib.Path:
  path.write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n", encoding="utf-8")
  return path


def _examples(name: str, split: str) -> list[dict]:
  task = seqio.get_mixture_or_task(name)
  ds = task.get_dataset({"inputs": 32, "targets": 8}, split=split, shuffle=False)
  return list(ds.as_numpy_iterator())


def test_a_classification_task_from_tsv(tmp_path):
  train = _tsv(tmp_path / "train.tsv",
               [("the soup was good", "yes"), ("the film was 'dull\"", "no")])
  valid = _tsv(tmp_path / "valid.tsv", [("the hotel was awful", "no")])
  name = tasks.register_file_task("test_user_cls_v1", train=train, validation=valid, inputs="text",
                                  targets="label", labels=LABELS, vocabulary="embedded")
  assert name == "test_user_cls_v1"
  vocab = seqio.SentencePieceVocabulary(embedded.VOCAB_PATH, extra_ids=100)
  got = _examples(name, "train")
  assert ([e["inputs_pretokenized"].decode() for e in got] == ["the soup was good",
                                                               "the film was 'dull\""])
  for ex in got:  # the toy model's vocabulary, EOS appended
    assert list(ex["inputs"]) == vocab.encode(ex["inputs_pretokenized"].decode()) + [1]
    assert list(ex["targets"]) == vocab.encode(ex["targets_pretokenized"].decode()) + [1]
  assert seqio.get_mixture_or_task(name).splits == ("train", "validation")
  task = seqio.get_mixture_or_task(name)
  # Label words -> class ids (-1: not a label, counted wrong); accuracy over them.
  assert ([task.postprocess_fn(t, example=None, is_target=True) for t in (b"yes", b"no", b"maybe")]
          == [0, 1, -1])
  (metric,) = task.metric_fns
  assert metric([0, 1, 1], [0, 1, -1]) == pytest.approx({"accuracy": 100 * 2 / 3})


def test_a_text_to_text_task_from_jsonl_with_t5_vocabulary_and_a_given_metric(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in [
      {"inputs": "add 2 3", "targets": 5},
       {"inputs": "add 1 1", "targets": " 2 "}]) + "\n\n")

  def my_metric(targets, predictions):
    return {"n": float(len(targets))}

  name = tasks.register_file_task("test_user_t2t_v1", train=path, vocabulary="t5", metric=my_metric)
  task = seqio.get_mixture_or_task(name)
  assert task.output_features == tasks.vocab.output_features()  # T5's (deferred) vocabulary
  assert task.metric_fns == [my_metric] and task.splits == ("train",)
  assert task.source.num_input_examples("train") == 2
  rows = task.source.get_dataset("train", shuffle=False)
  assert [(r["inputs"].decode(), r["targets"].decode()) for r in rows.as_numpy_iterator()] == [
      ("add 2 3", "5"), ("add 1 1", "2")]  # numbers as written, targets stripped
  assert task.postprocess_fn(b" 5 ", example=None, is_target=False) == "5"


def test_metric_names(tmp_path):
  train = _tsv(tmp_path / "t.tsv", [("a", "yes"), ("b", "no")])
  expect = {"accuracy": metrics_lib.accuracy, "f1": metrics_lib.f1_score_with_invalid,
            "matthews_corrcoef": metrics_lib.matthews_corrcoef}
  for i, (metric, fn) in enumerate(expect.items()):
    name = tasks.register_file_task(f"test_user_metric{i}_v1", train=train, inputs="text",
                                    targets="label", labels=LABELS, vocabulary="embedded",
                                    metric=metric)
    assert seqio.get_mixture_or_task(name).metric_fns == [fn]
  name = tasks.register_file_task("test_user_metric_mean_v1", train=train, inputs="text",
                                  targets="label", labels=LABELS, vocabulary="embedded",
                                  metric="mean_f1")
  (fn,) = seqio.get_mixture_or_task(name).metric_fns
  assert (fn([0, 1, 1, 0], [0, 1, 0, 0])
          == metrics_lib.mean_multiclass_f1(2)([0, 1, 1, 0], [0, 1, 0, 0]))


def test_registration_is_idempotent_and_follows_an_edited_file(tmp_path):
  train = _tsv(tmp_path / "train.tsv", [("a", "yes")])
  args = dict(train=train, inputs="text", targets="label", labels=LABELS, vocabulary="embedded")
  tasks.register_file_task("test_user_again_v1", **args)
  first = seqio.get_mixture_or_task("test_user_again_v1")
  tasks.register_file_task("test_user_again_v1", **args)  # a module imported twice
  assert seqio.get_mixture_or_task("test_user_again_v1") is first
  _tsv(train, [("a", "yes"), ("b", "no")])
  os.utime(train, (1, 1))  # a different modification time: an edited file
  tasks.register_file_task("test_user_again_v1", **args)
  assert seqio.get_mixture_or_task("test_user_again_v1").source.num_input_examples("train") == 2
  with pytest.raises(ConfigError, match="already registered by another module"):
    tasks.register_file_task("spot_glue_rte_v200", **args)


def _bad(tmp_path, name: str, text: str) -> pathlib.Path:
  path = tmp_path / name
  path.write_text(text, encoding="utf-8")
  return path


@pytest.mark.parametrize("case, kwargs, message", [
    ("missing file", {"train": "nowhere.tsv"},
     r"train file .*nowhere\.tsv does not exist; .*working directory"),
    ("file type", {"train": "train.txt"}, r"is not a \.tsv, \.jsonl or \.csv file"),
    ("empty", {"train": ("empty.tsv", "text\tlabel\n")}, r"empty\.tsv has no examples"),
    ("column", {"train": ("col.tsv", "sentence\tlabel\nx\tyes\n")},
     r"col\.tsv line 2 has no column 'text' \(its columns: sentence, label\); name the columns "
     r"with inputs=/targets="),
    ("label", {"train": ("lab.tsv", "text\tlabel\nx\tyes\ny\tmaybe\n")},
     r"lab\.tsv line 3: target 'maybe' is not one of the label words \('yes', 'no'\)"),
    ("fields", {"train": ("f.tsv", "text\tlabel\nx\tyes\tno\n")},
     r"f\.tsv line 2 has 3 fields but the header has 2"),
    ("json", {"train": ("j.jsonl", '{"text": "x", "label": "yes"}\n{"text": \n')},
     r"j\.jsonl line 2 is not JSON"),
    ("json list", {"train": ("l.jsonl", '["x", "yes"]\n')},
     r"l\.jsonl line 1 is a JSON list, not an object"),
    ("empty target", {"train": ("t.tsv", "text\tlabel\nx\t \n")},
     r"t\.tsv line 2: the target \('label'\) is empty"),
    ("name", {"name": "my task"}, r"task name 'my task' must be a word ending with a version"),
    ("no version", {"name": "my_task"},
     r"must be a word ending with a version, e\.g\. 'my_task_v1'"),
    ("vocabulary", {"vocabulary": None}, r"needs vocabulary=: 'embedded' .*'t5'"),
    ("vocabulary name", {"vocabulary": "toy"}, r"vocabulary='toy'; give the model's"),
    ("labels", {"labels": "yes"}, r"labels='yes'; give the label words as a list"),
    ("one label", {"labels": ("yes",)}, r"give at least 2 distinct label words"),
    ("metric", {"metric": "bleu"}, r"metric='bleu'; valid for classification"),
    ("f1 of 3", {"labels": ("yes", "no", "maybe"), "metric": "f1"},
     r"metric='f1' is binary and needs 2 labels"),
])
def test_problems_are_one_line_config_errors(tmp_path, monkeypatch, case, kwargs, message):
  del case
  monkeypatch.chdir(tmp_path)
  _tsv(tmp_path / "good.tsv", [("x", "yes")])
  args = {"name": "test_user_bad_v1", "train": "good.tsv", "inputs": "text", "targets": "label",
          "labels": LABELS, "vocabulary": "embedded"}
  for key, value in kwargs.items():
    args[key] = _bad(tmp_path, *value) if key == "train" and isinstance(value, tuple) else value
  with pytest.raises(ConfigError, match=message) as error:
    tasks.register_file_task(args.pop("name"), **args)
  assert "\n" not in str(error.value)
  assert "test_user_bad_v1" not in seqio.TaskRegistry.names()


# ------------------------------------------------------------------ MIXTURE_OR_TASK_MODULE


def test_task_module_from_the_working_directory_or_a_py_path(tmp_path, monkeypatch):
  _tsv(tmp_path / "train.tsv", [("x", "yes")])
  (tmp_path / "test_cwd_tasks.py").write_text(
      "import tasks\n"
      "tasks.register_file_task('test_user_cwd_v1', train='train.tsv', inputs='text',\n"
      "                         targets='label', labels=('yes', 'no'), vocabulary='embedded')\n")
  (tmp_path / "test_file_tasks.py").write_text(  # run from elsewhere: an absolute data path
      "import tasks\n"
      f"tasks.register_file_task('test_user_file_v1', train={str(tmp_path / 'train.tsv')!r},\n"
      "                         inputs='text', targets='label', labels=('yes', 'no'), "
      "vocabulary='embedded')\n")
  monkeypatch.chdir(tmp_path)
  # As under a console script or `python path/to/x.py`: the working directory is not on sys.path.
  monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
  data.import_modules("test_cwd_tasks")
  assert "test_user_cwd_v1" in seqio.TaskRegistry.names()
  monkeypatch.chdir(REPO)
  data.import_modules(str(tmp_path / "test_file_tasks.py"))
  module = sys.modules["test_file_tasks"]
  assert "test_user_file_v1" in seqio.TaskRegistry.names()
  data.import_modules(str(tmp_path / "test_file_tasks.py"))  # imported once
  assert sys.modules["test_file_tasks"] is module


def test_task_module_errors_say_what_to_do(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ConfigError, match=r"MIXTURE_OR_TASK_MODULE 'my_taks' cannot be imported \(No "
                                        r"module named 'my_taks'\); give a module .*importable "
                                        r"from the working directory "
                                        rf"\({re.escape(str(tmp_path))}\) or PYTHONPATH .*or the "
                                        r"path of a \.py file"):
    data.import_modules("my_taks")
  with pytest.raises(ConfigError, match=r"MIXTURE_OR_TASK_MODULE 'gone\.py' does not exist"):
    data.import_modules("gone.py")
  (tmp_path / "test_needs_more.py").write_text("import no_such_dependency_here\n")
  with pytest.raises(ConfigError, match=r"'test_needs_more' failed to import: No module named "
                                        r"'no_such_dependency_here'; install the module it needs"):
    data.import_modules("test_needs_more")


# ------------------------------------------------------------------ paths from any directory


def test_gin_files_and_includes_resolve_from_any_directory_quietly(tmp_path, monkeypatch, caplog):
  monkeypatch.chdir(tmp_path)
  args = gin_flags.parse_args(["--gin_file=gin/test/smoke.gin",
                               f"--gin.MODEL_DIR='{tmp_path}'"], "t", "")
  import gin  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  with caplog.at_level(logging.INFO):
    gin_flags.parse_gin(args, ("spot_jax.train.train",))
  # includes read
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "spot_synthetic_sentiment_v100"
  assert not [r for r in caplog.records if "Path not found" in r.getMessage()]
  gin.clear_config()
  # A file found nowhere is still one error naming where it was looked for.
  args = gin_flags.parse_args(["--gin_file=gin/test/nothing.gin"], "t", "")
  with pytest.raises(ConfigError,
                     match=rf"--gin_file=gin/test/nothing.gin: not found in \['{tmp_path}'"):
    gin_flags.parse_gin(args)


def test_a_relative_checkpoint_path_resolves_here_then_in_the_repository(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  rel = "spot_jax/embedded/toy_t5/checkpoint"
  assert backbone.resolve_checkpoint_path(rel) == str(REPO / rel)
  backbone.check_initial_checkpoint(rel)
  (tmp_path / rel).mkdir(parents=True)  # a folder of that name here wins, made absolute
  assert backbone.resolve_checkpoint_path(rel) == str(tmp_path / rel)
  assert backbone.resolve_checkpoint_path("/abs/ckpt") == "/abs/ckpt"
  assert backbone.resolve_checkpoint_path("gs://b/ckpt") == "gs://b/ckpt"
  with pytest.raises(ConfigError, match=r"INITIAL_CHECKPOINT_PATH 'ckpts/none' does not exist "
                                        rf"\(looked in {re.escape(str(tmp_path))} and "
                                        rf"{re.escape(str(REPO))}\)"):
    backbone.check_initial_checkpoint("ckpts/none")
  assert (backbone.checkpoint_identity(rel, 0)
          == backbone.checkpoint_identity(str(tmp_path / rel), 0))


def test_run_records_keep_the_checkpoint_the_run_loaded(tmp_path, monkeypatch):
  """A relative INITIAL_CHECKPOINT_PATH found in the checkout is recorded as that checkout's
  files (the shipped model: its portable name), never joined to the working directory."""
  from spot_jax.backbones import t5  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  config = t5.config_by_name(embedded.CONFIG_NAME)
  rel = "spot_jax/embedded/toy_t5/checkpoint"
  recorded = backbone.record(config, rel, 0)
  assert recorded["checkpoint"] == "embedded:toy_t5/checkpoint"
  assert embedded.resolve(recorded["checkpoint"]) == str(REPO / rel)
  assert recorded == backbone.record(config, str(REPO / rel), 0)
  own = tmp_path / "ckpt"  # a relative path found here is recorded absolute
  own.mkdir()
  (own / "weights").write_bytes(b"x")
  assert backbone.record(config, "ckpt", 0)["checkpoint"] == str(own)


# ------------------------------------------------------------------ docs/tasks.md's worked example

MY_TASKS = """\
import tasks
tasks.register_file_task("my_rating_v1", train="train.tsv", validation="validation.tsv",
                         inputs="review", targets="rating", labels=("positive", "negative"),
                         vocabulary="embedded")
"""
TOY = ["--gin_file=gin/models/t5_1_1_toy.gin",
       "--gin_file=gin/prompts/prompt_tuning_sampled_vocab.gin"]
TASK_FLAGS = ["--gin.MIXTURE_OR_TASK_MODULE='my_tasks'",
              "--gin.MIXTURE_OR_TASK_NAME='my_rating_v1'",
              "--gin.INITIAL_CHECKPOINT_PATH='spot_jax/embedded/toy_t5/checkpoint'",
              "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}", "--gin.PROMPT_LENGTH=10"]
# Lines on stderr that are not the programs' own. START-UP NOISE: TensorFlow's C++ start-up log
# (glog-formatted lines and absl's "before InitializeLog" notice) is still printed until the
# start-up code silences it at its root; then delete STARTUP_NOISE and this allowance.
STARTUP_NOISE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\) is called "
                           r"are written to STDERR|[IWE]\d{4} [\d:.]+ +\d+ [a-z_]+\.cc:\d+\] .*)$")


def _rating_rows(n: int, seed: int) -> list[tuple[str, str]]:
  """docs/tasks.md's data: "text: the <thing> was <adjective>" -> positive | negative."""
  rng = np.random.RandomState(seed)
  good, bad = ("good", "great", "lovely", "superb"), ("bad", "awful", "dull", "poor")
  things = ("soup", "hotel", "film", "match", "coffee", "beach")
  rows = []
  for _ in range(n):
    word = str(rng.choice(good + bad))
    rows.append((f"text: the {rng.choice(things)} was {word}",
                 "positive" if word in good else "negative"))
  return rows


def _run_from(folder: pathlib.Path, *argv: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))  # spot_jax as installed
  for name in ("TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS"):  # as a user's shell has them
    env.pop(name, None)
  return subprocess.run([sys.executable, "-m", *argv], cwd=folder, env=env, capture_output=True,
                        text=True, timeout=600)


def _noise(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.strip() and not STARTUP_NOISE.match(line)]


def test_worked_example_trains_and_evaluates_a_tsv_task_from_outside_the_repository(tmp_path):
  folder = tmp_path / "my_task"
  folder.mkdir()
  assert REPO not in folder.parents
  _tsv(folder / "train.tsv", _rating_rows(200, 0), header=("review", "rating"))
  _tsv(folder / "validation.tsv", _rating_rows(32, 1), header=("review", "rating"))
  (folder / "my_tasks.py").write_text(MY_TASKS)
  assert len(MY_TASKS.splitlines()) <= 5

  train = _run_from(folder, "spot_jax.train", *TOY, "--gin_file=gin/runs/prompt_tune.gin",
                    *TASK_FLAGS, "--gin.MODEL_DIR='run'", "--gin.TRAIN_STEPS=20",
                    "--gin.EVAL_PERIOD=20", "--gin.BATCH_SIZE=8", "--gin.EVAL_BATCH_SIZE=32")
  assert train.returncode == 0, train.stderr[-3000:]
  assert _noise(train.stderr) == [], train.stderr
  assert "step 20/20" in train.stdout and "eval step 20: my_rating_v1/accuracy" in train.stdout
  assert (folder / "run" / "checkpoints" / "20").is_dir()  # MODEL_DIR relative to the folder

  evaluate = _run_from(folder, "spot_jax.eval", *TOY, "--gin_file=gin/runs/eval.gin", *TASK_FLAGS,
                       "--gin.MODEL_DIR='run'")
  assert evaluate.returncode == 0, evaluate.stderr[-3000:]
  assert _noise(evaluate.stderr) == [], evaluate.stderr
  metrics = json.loads((folder / "run" / "eval_validation" / "metrics.json").read_text())
  accuracy = metrics["metrics"]["my_rating_v1"]["accuracy"]
  # eval reproduces the trainer's own evaluation (its record, exact; the progress line, to 4 digits)
  trained = json.loads(
      (folder / "run" / "eval" / "my_rating_v1-metrics.jsonl").read_text().splitlines()[-1])
  assert trained["step"] == 20 and trained["accuracy"] == accuracy, (trained, accuracy)
  assert f"eval step 20: my_rating_v1/accuracy {accuracy:.4g}" in train.stdout
