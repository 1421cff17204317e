"""Data sources, missing-data errors (bounded in time), vocabulary deferral,
registration and the CLI."""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys

import pytest
import seqio

import tasks
from tasks import names, prepare, scoring, sources, vocab
from tests.helpers import REPO

SHARED_VOCAB = REPO.parent / "shared" / "fixtures" / "t5" / "t5_vocab"
SEQ = {"inputs": 128, "targets": 16}
# Seconds a missing-data error may take once Python and TensorFlow are imported. A
# download attempt retries for minutes, so this bound separates the two without
# measuring speed; the subprocess timeout below also covers interpreter start-up.
ERROR_BOUND_S = 30


@pytest.fixture
def real_vocab(monkeypatch):
  if not SHARED_VOCAB.exists():
    pytest.skip(f"real T5 vocabulary not found at {SHARED_VOCAB} (../shared/fixtures is "
                "beside the repo)")
  monkeypatch.setenv("SPOT_JAX_VOCAB", str(SHARED_VOCAB))
  return tasks.get_vocabulary()


FRESH_SCRIPT = """
import os, signal, sys
import seqio
try:
  import spot_jax
  print("SPOT_JAX_TASKS", len([n for n in seqio.TaskRegistry.names() if n.startswith("spot_")]))
except Exception as e:  # another part of the project; reported, not fatal here
  print("SPOT_JAX_IMPORT_FAILED", repr(e).replace("\\n", " "))
import tasks
import tasks  # a second import is a no-op
os.environ["SPOT_JAX_VOCAB"] = sys.argv[1]  # set after `import tasks`: the vocabulary is deferred
signal.alarm(%d)  # SIGALRM kills the process if a missing-data call hangs
for call in (
    lambda: seqio.get_mixture_or_task("spot_glue_cola_v200").get_dataset({"inputs": 8, "targets": \
4}, split="validation"),
    lambda: seqio.get_mixture_or_task("spot_glue_v200").get_dataset({"inputs": 8, "targets": 4}, \
split="train"),
    lambda: seqio.get_mixture_or_task("spot_super_glue_boolq_v200").num_input_examples("train"),
):
  try:
    call()
    print("NO ERROR")
  except tasks.DataNotFoundError as e:
    print("ERROR:", e)
signal.alarm(0)
ds = seqio.get_mixture_or_task("spot_glue_sst2_v200").get_dataset({"inputs": 16, "targets": 4}, \
split="validation", shuffle=False)
print("TOKENS", next(ds.as_numpy_iterator())["inputs"].tolist())
from tasks.__main__ import main
main(["list"])
""" % ERROR_BOUND_S


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory):
  """One new Python process, as a user's: spot_jax, then tasks, missing data, tokens,
  the list command."""
  if not SHARED_VOCAB.exists():
    pytest.skip(f"real T5 vocabulary not found at {SHARED_VOCAB} (../shared/fixtures is "
                "beside the repo)")
  data_dir = tmp_path_factory.mktemp("fresh_tfds")
  prepare.write_tfds_dataset("glue/sst2:2.0.0", str(data_dir),
                             {"validation": [{"sentence": "fine .", "label": 1, "idx": 0}]})
  prepare.write_tfds_dataset("glue/rte:2.0.0", str(data_dir), {"validation": [
      {"sentence1": "a", "sentence2": "b", "label": 0, "idx": 0}]})
  env = {**os.environ, "PYTHONPATH": str(REPO), "TFDS_DATA_DIR": str(data_dir),
         "SPOT_JAX_VOCAB": ""}
  result = subprocess.run([sys.executable, "-c", FRESH_SCRIPT, str(SHARED_VOCAB)], cwd=str(REPO),
                          env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return data_dir, result.stdout.splitlines()


def test_missing_tfds_data_is_a_clear_error_in_bounded_time(fresh_process):
  """Asking for absent data (task, mixture, size) errors at once, under a SIGALRM bound."""
  data_dir, lines = fresh_process
  errors = [line for line in lines if line.startswith(("ERROR:", "NO ERROR"))]
  assert len(errors) == 3 and all(e.startswith("ERROR:") for e in errors), lines
  cola = errors[0]
  assert str(data_dir / "glue" / "cola" / "2.0.0" / "dataset_info.json") in cola
  assert "tfds build glue --config=cola" in cola and f"--data_dir={data_dir}" in cola
  assert "super_glue/boolq:1.0.2" in errors[2]


def test_fresh_process_import_order_and_spot_jax_does_not_register(fresh_process):
  """`import spot_jax` registers nothing; `import tasks` before setting
  the vocab env still tokenizes."""
  _, lines = fresh_process
  expected = (seqio.SentencePieceVocabulary(str(SHARED_VOCAB),
                                            extra_ids=100).encode("sst2 sentence: fine .") + [1])
  assert f"TOKENS {expected}" in lines
  failed = [line for line in lines if line.startswith("SPOT_JAX_IMPORT_FAILED")]
  if failed:
    pytest.skip("spot_jax does not import here, so its registrations cannot be checked: "
                f"{failed[0]}")
  assert "SPOT_JAX_TASKS 0" in lines


def test_list_command_reports_sources_and_presence(fresh_process):
  _, out = fresh_process
  lines = {line.split()[1]: line for line in out if line.startswith(("task ", "mixture "))}
  assert ("tfds:glue/rte:2.0.0" in lines["spot_glue_rte_v200"]
          and lines["spot_glue_rte_v200"].endswith("present=yes"))
  assert lines["spot_glue_cola_v200"].endswith("present=no")
  assert "files:" in lines["spot_cr_v200"] and lines["spot_cr_v200"].endswith("present=no")
  assert (lines["spot_sources_v200"].startswith("mixture")
          and lines["spot_sources_v200"].endswith("present=no"))
  ours = ({n for n in tasks.SPECS if not n.endswith(("_files_v200", "_hf_v200"))}
          | set(names.MIXTURES.values()))
  assert ours <= set(lines)


def test_missing_data_in_process_with_alarm(tmp_path):
  tasks.set_tfds_data_dir(str(tmp_path))
  old = signal.signal(signal.SIGALRM,
                      lambda *_: (_ for _ in ()).throw(TimeoutError("missing-data check hung")))
  signal.alarm(ERROR_BOUND_S)
  try:
    task = seqio.get_mixture_or_task(names.OTHER["c4_prefix_lm"])
    assert not task.source.is_present()
    with pytest.raises(tasks.DataNotFoundError, match=r"c4/en:3\.1\.0 is not prepared"):
      task.get_dataset(SEQ, split="train")
    with pytest.raises(tasks.DataNotFoundError) as info:
      task.source.list_shards("train")
    assert "\n" not in str(info.value)
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
    tasks.set_tfds_data_dir(None)


def test_tfds_data_dir_env_and_setter(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "env"))
  assert tasks.tfds_data_dir() == str(tmp_path / "env")
  tasks.set_tfds_data_dir(str(tmp_path / "explicit"))
  try:
    assert tasks.tfds_data_dir() == str(tmp_path / "explicit")
    source = seqio.get_mixture_or_task(names.GLUE["glue_rte"]).source
    assert source.data_dir == str(tmp_path / "explicit")
  finally:
    tasks.set_tfds_data_dir(None)
  assert tasks.tfds_data_dir() == str(tmp_path / "env")


def _write(path: pathlib.Path, text: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


def test_local_files_jsonl_csv_tsv_and_nested(tmp_path, real_vocab):
  """Any task can read local files; csv/tsv/jsonl give the same examples; nested ids work."""
  _write(tmp_path / "glue_rte" / "train.csv",
         'sentence1,sentence2,label\n"A man, tall.",A man.,0\n')
  _write(tmp_path / "glue_rte" / "validation.tsv",
         "sentence1\tsentence2\tlabel\tidx\nA man, tall.\tA man.\t0\t7\n")
  name = tasks.register_file_variant(names.GLUE["glue_rte"], data_dir=str(tmp_path))
  assert name == "spot_glue_rte_files_v200"
  for split in ("train", "validation"):
    [example] = scoring.dataset_examples(name, split, SEQ)
    assert example["inputs_pretokenized"] == b"rte sentence1: A man, tall. sentence2: A man."
    assert example["targets_pretokenized"] == b"entailment"
  assert int(scoring.dataset_examples(name, "validation", SEQ)[0]["idx"]) == 7

  rows = [{"paragraph": "P<br>", "question": "Q?", "answer": "A", "label": 1,
           "idx": {"paragraph": 3, "question": 4, "answer": 0}}]
  _write(tmp_path / "super_glue_multirc" / "validation.jsonl",
         "".join(json.dumps(r) + "\n" for r in rows))
  multirc = tasks.register_file_variant(names.taskless_name(names.SUPER_GLUE["super_glue_multirc"]),
                                        data_dir=str(tmp_path), splits=("validation",))
  assert multirc == "spot_super_glue_multirc_taskless_files_v200"
  [example] = scoring.dataset_examples(multirc, "validation", SEQ)
  assert example["inputs_pretokenized"] == b"question: Q? answer: A paragraph: P "
  assert (int(example["idx/paragraph"]), int(example["idx/question"])) == (3, 4)
  assert scoring.score(multirc, [example], ["True"]) == {"f1": 100.0, "exact_match": 100.0}


def test_local_file_errors_name_the_path(tmp_path, monkeypatch):
  monkeypatch.delenv("SPOT_JAX_DATA_DIR", raising=False)
  source = sources.FileSource("cr", {"sentence": "str", "label": "int"}, splits=("train",))
  with pytest.raises(tasks.DataNotFoundError, match="SPOT_JAX_DATA_DIR"):
    source.get_dataset("train")
  tasks.set_files_dir(str(tmp_path))
  try:
    with pytest.raises(tasks.DataNotFoundError, match=str(tmp_path / "cr" / "train.jsonl")):
      source.num_input_examples("train")
    assert not source.is_present()
    _write(tmp_path / "cr" / "train.jsonl", '{"sentence": "ok", "label": "x"}\n')
    with pytest.raises(ValueError, match="column 'label' value 'x' is not a valid int"):
      source.get_dataset("train")
    _write(tmp_path / "cr" / "train.jsonl", '{"text": "ok", "label": 1}\n')
    with pytest.raises(ValueError, match="has no column 'sentence'"):
      source.get_dataset("train")
  finally:
    tasks.set_files_dir(None)


def test_hugging_face_source_needs_datasets():
  name = tasks.register_hf_variant(names.SUPER_GLUE["super_glue_boolq"])
  assert name == "spot_super_glue_boolq_hf_v200"
  source = seqio.get_mixture_or_task(name).source
  assert (source.path, source.name) == ("super_glue", "boolq")
  try:
    import datasets  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    with pytest.raises(ImportError, match="optional `datasets` package"):
      source.get_dataset("validation", shuffle=False)
    assert not source.is_present()
  else:
    pytest.skip("`datasets` is installed; the missing-package error cannot be exercised")


def test_deferred_vocabulary(monkeypatch, tmp_path):
  monkeypatch.setenv("SPOT_JAX_VOCAB", str(tmp_path / "a.model"))
  deferred = vocab.DeferredVocabulary()
  assert deferred == seqio.SentencePieceVocabulary(str(tmp_path / "a.model"), extra_ids=100)
  assert deferred == tasks.get_vocabulary()
  monkeypatch.setenv("SPOT_JAX_VOCAB", str(tmp_path / "b.model"))
  assert deferred.sentencepiece_model_file == str(tmp_path / "b.model")
  assert deferred != seqio.SentencePieceVocabulary(str(tmp_path / "a.model"), extra_ids=100)
  assert pickle.loads(pickle.dumps(deferred)) == deferred
  monkeypatch.delenv("SPOT_JAX_VOCAB")
  assert tasks.get_vocabulary().sentencepiece_model_file == vocab.DEFAULT_VOCAB_PATH


def test_deferred_vocabulary_loads_the_env_path(real_vocab):
  deferred = vocab.DeferredVocabulary()
  assert deferred.vocab_size == 32100
  assert deferred.encode("Hello world") == real_vocab.encode("Hello world")
  assert deferred.sentencepiece_model_file == str(SHARED_VOCAB)


def test_import_is_idempotent():
  before_tasks = sorted(seqio.TaskRegistry.names())
  before_mixtures = sorted(seqio.MixtureRegistry.names())
  for module in ("tasks.glue", "tasks.mixtures", "tasks"):
    importlib.reload(importlib.import_module(module))
  assert sorted(seqio.TaskRegistry.names()) == before_tasks
  assert sorted(seqio.MixtureRegistry.names()) == before_mixtures
  ours = [n for n in tasks.SPECS if not n.endswith(("_files_v200", "_hf_v200"))]
  assert len(ours) == 82 and set(ours) <= set(before_tasks)


def test_docs_table_lists_every_task():
  """docs/tasks.md holds the registry's own table (`python -m tasks table`), so it cannot drift."""
  from tasks import __main__ as cli  # pylint: disable=import-outside-toplevel
  doc = (REPO / "docs" / "tasks.md").read_text()
  missing = [line for line in cli.table_lines() if line not in doc.splitlines()]
  assert not missing, ("regenerate the table in docs/tasks.md with `python -m tasks table`: "
                       + missing[0])
  for name in tasks.SPECS:
    if not name.endswith(("_files_v200", "_hf_v200")):
      assert f"`{name.replace('_taskless', '')}`" in doc, name
  for name in names.MIXTURES.values():
    assert f"`{name}`" in doc, name
