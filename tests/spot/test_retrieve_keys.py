"""Nothing a rerun overwrites is lost: retrievals are kept per settings, the same settings reuse.

A real library (its entries' prompts are random arrays of the tiny model's width: retrieval only
reads them) and real tiny training runs on tests/helpers/spot_tasks.py, through
`spot_jax.retrieve`'s command line in-process. Two retrievals with other settings (k, similarity)
into one --output_dir keep both reports and both sets of runs, and share the runs they have in
common; the first settings again train nothing and write the same report, byte for byte.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import numpy as np
import pytest

from spot_jax import cli
from spot_jax import retrieve as retrieve_cli
from spot_jax.cli import model_flag
from spot_jax.spot import keys
from spot_jax.spot import library as prompt_library
from spot_jax import experiment
from spot_jax.spot import settings as settings_lib
from tests.helpers.cli_error_runner import tree_hash

SOURCES = ["spot_test_sentiment_v1", "spot_test_parity_v1", "spot_test_length_v1"]
TARGET = "spot_test_review_v1"
RUN_FLAGS = ["--model=t5_1_1_byte_tiny", "--task_module=tests.helpers.spot_tasks",
             "--input_length=24",
             "--target_length=6", "--batch_size=8", "--train_steps=2", "--embedding_step=1",
             "--eval_period=2", "--eval_batch_size=16", "--eval_num_examples=16",
             "--prompt_length=4", "--metric=char_match"]


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("lib") / "library"
  model, _ = model_flag.load_model("t5_1_1_byte_tiny")
  fingerprint = settings_lib.model_fingerprint(model, None, 0)
  lib = prompt_library.Library(root)
  rs = np.random.RandomState(0)
  for task in SOURCES:
    prompt = rs.normal(0, 0.5, (4, model.config.emb_dim)).astype(np.float32)
    lib.add(entry_id=f"{task}.p0", task=task, run_id=task, seed=0, fingerprint=fingerprint,
            prompt=prompt, embedding=prompt + rs.normal(0, 0.1, prompt.shape), score=50.0,
            metric="char_match", embedding_step=1, embed_dim=model.config.emb_dim)
  return root


def _retrieve(library: pathlib.Path, out: pathlib.Path, capsys,
              *extra: str) -> tuple[pathlib.Path, str]:
  code = cli.run(retrieve_cli.main, [f"--library={library}", f"--target_task={TARGET}",
                                     "--strategy=weighted_average,baseline", f"--output_dir={out}",
                                     *RUN_FLAGS, *extra], retrieve_cli.PROG)
  captured = capsys.readouterr()
  assert code == 0, captured.err[-3000:]
  written = re.findall(r"^wrote (.+)$", captured.out, re.M)
  assert len(written) == 1, captured.out[-2000:]
  return pathlib.Path(written[0]), captured.out


def _runs(out: pathlib.Path) -> dict[str, str]:
  """{run directory: hash of its files} of every run under `out` (wherever it lives)."""
  return {str(p.parent): tree_hash(p.parent) for p in out.rglob("run.json")}


def test_other_settings_keep_both_results_and_the_same_settings_train_nothing(library,
                                                                              tmp_path, capsys):
  out = tmp_path / "retrieve"
  first_path, _ = _retrieve(library, out, capsys, "--k=1", "--similarity=average")
  first_bytes = first_path.read_bytes()
  first = json.loads(first_bytes)
  runs_after_first = _runs(out)

  second_path, _ = _retrieve(library, out, capsys, "--k=2", "--similarity=per_token")
  second = json.loads(second_path.read_text())
  # both reports kept, each under the key of its own settings
  assert second_path != first_path and first_path.read_bytes() == first_bytes
  for path, report in ((first_path, first), (second_path, second)):
    assert path.name == f"retrieval-{report['key']}.json" and path.parent == out
    assert report["key"] == keys.digest(report["settings"])
  assert ((first["k"], first["similarity"], second["k"],
           second["similarity"]) == (1, "average", 2, "per_token"))
  # the runs of the first retrieval are all still there, untouched
  after_second = _runs(out)
  assert {n: after_second[n] for n in runs_after_first} == runs_after_first
  w1, w2 = ({r["strategy"]: r for r in rep["results"]}["weighted_average"]
            for rep in (first, second))
  # other k: another starting prompt, hence another run, each recording its own sources
  assert w1["run_dir"] != w2["run_dir"]
  assert (experiment.read_outcome(w1["run_dir"]).init
          == "weighted average of " + ", ".join(w1["chosen"]))
  assert (experiment.read_outcome(w2["run_dir"]).init
          == "weighted average of " + ", ".join(w2["chosen"]))
  assert len(w1["chosen"]) == 1 and len(w2["chosen"]) == 2
  # what does not depend on k or the similarity is shared: the target's embedding and the baseline
  b1, b2 = ({r["strategy"]: r for r in rep["results"]}["baseline"] for rep in (first, second))
  assert (b1["run_dir"] == b2["run_dir"]
          and first["embedding_run_dir"] == second["embedding_run_dir"])
  assert (sorted(after_second)
          == sorted({first["embedding_run_dir"], w1["run_dir"], w2["run_dir"], b1["run_dir"]}))
  for report in (first, second):  # the report says where each result lives
    for res in report["results"]:
      rec = experiment.read_outcome(res["run_dir"])
      assert rec is not None and rec.task == TARGET and rec.score == res["score"]
    emb = np.load(report["embedding_file"])
    assert (emb.shape == (4, 64)
            and pathlib.Path(report["embedding_file"]).is_relative_to(report["embedding_run_dir"]))

  before = tree_hash(out)
  again_path, again_out = _retrieve(library, out, capsys, "--k=1", "--similarity=average")
  assert again_path == first_path and again_path.read_bytes() == first_bytes
  assert tree_hash(out) == before  # not one file written or changed: nothing trained again
  assert "resumed from" not in again_out


def test_run_keys_follow_what_determines_the_run():
  model, name = model_flag.load_model("t5_1_1_byte_tiny")
  base = settings_lib.RunSettings(model=model, model_name=name, initial_checkpoint_path=None,
                                  task_module="tests.helpers.spot_tasks",
                                  lengths={"inputs": 24, "targets": 6},
                                  train_steps=4, embedding_step=2, eval_period=4, prompt_length=4)
  init = np.arange(8, dtype=np.float32).reshape(2, 4)
  key = keys.run_key(base, TARGET, 0, init=init)
  assert key == keys.run_key(base, TARGET, 0, init=init.astype(np.float64))  # values, not dtype
  assert key == keys.run_key(dataclasses.replace(base, checkpoint_period=1), TARGET, 0, init=init)
  others = [keys.run_key(base, TARGET, 1, init=init), keys.run_key(base, SOURCES[0], 0, init=init),
            keys.run_key(base, TARGET, 0), keys.run_key(base, TARGET, 0, init=init + 1e-6),
            keys.run_key(base, TARGET, 0, init=init, evaluate=False),
            keys.run_key(base, TARGET, 0, init=init, smop={"num_prompts": 2, "length": 2})]
  for change in (dict(train_steps=8), dict(learning_rate=0.1),
                 dict(lengths={"inputs": 32, "targets": 6}), dict(metric="char_match"),
                 dict(eval_num_examples=8), dict(batch_size=4)):
    others.append(keys.run_key(dataclasses.replace(base, **change), TARGET, 0, init=init))
  assert len({key, *others}) == len(others) + 1

