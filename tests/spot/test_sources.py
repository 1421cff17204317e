"""Library prompts as method constants: by reference, from a retrieval report, best per task."""
from __future__ import annotations

import json

import numpy as np
import pytest

from spot_jax.errors import ConfigError
from spot_jax.spot import library as prompt_library
from spot_jax.spot.sources import library_prompts

FP, OTHER = {"id": "model-a"}, {"id": "model-b"}


@pytest.fixture()
def lib(tmp_path):
  library = prompt_library.Library(tmp_path / "lib")
  rs = np.random.RandomState(0)
  for entry_id, task, score in (("mnli.p0", "mnli", 80.0), ("mnli.p1", "mnli", 82.0),
                                ("qnli.p0", "qnli", 90.0), ("sst2.p0", "sst2", None)):
    prompt = rs.normal(0, 1, (3, 8)).astype(np.float32)
    library.add(entry_id=entry_id, task=task, run_id=entry_id, seed=0, fingerprint=FP,
                prompt=prompt, embedding=prompt[:1], score=score, metric="accuracy")
  report = {"ranking": [{"id": "qnli.p0"}, {"id": "mnli.p1"}, {"id": "sst2.p0"}],
            "results": [{"strategy": "best_of_top_k", "chosen": ["mnli.p1"]},
                        {"strategy": "weighted_average", "chosen": ["qnli.p0", "mnli.p1"]}]}
  (tmp_path / "retrieval.json").write_text(json.dumps(report))
  return library, tmp_path


def _prompts(library, *ids):
  return np.stack([library.get(i).prompt for i in ids])


def test_by_reference_retrieval_and_task(lib):
  library, tmp = lib
  root = str(tmp / "lib")
  got = library_prompts(references=[f"{root}#sst2.p0", f"{root}#mnli.p0"])
  assert got.dtype == np.float32 and got.shape == (2, 3, 8)
  np.testing.assert_array_equal(got, _prompts(library, "sst2.p0", "mnli.p0"))
  report = str(tmp / "retrieval.json")
  np.testing.assert_array_equal(library_prompts(root, retrieval=report,
                                                strategy="weighted_average"),
                                _prompts(library, "qnli.p0", "mnli.p1"))
  np.testing.assert_array_equal(library_prompts(root, retrieval=report, k=2),
                                _prompts(library, "qnli.p0", "mnli.p1"))  # the ranking's top 2
  # The best-scoring entry of each task, in the order given (a scored entry beats an unscored).
  np.testing.assert_array_equal(library_prompts(root, tasks=["qnli", "mnli", "sst2"]),
                                _prompts(library, "qnli.p0", "mnli.p1", "sst2.p0"))


def test_bad_choices_are_one_line_errors(lib):
  library, tmp = lib
  root, report = str(tmp / "lib"), str(tmp / "retrieval.json")
  wider = np.zeros((5, 8), np.float32)
  library.add(entry_id="long.p0", task="long", run_id="r", seed=0, fingerprint=FP, prompt=wider,
              embedding=wider, score=1.0, metric="accuracy")
  foreign = prompt_library.Library(tmp / "other")
  foreign.add(entry_id="x.p0", task="x", run_id="r", seed=0, fingerprint=OTHER,
              prompt=np.zeros((3, 8), np.float32), embedding=np.zeros((1, 8), np.float32),
              score=1.0, metric="accuracy")
  (tmp / "bad.json").write_text("{not json")
  cases = [
      (dict(), "give exactly one of references"),
      (dict(references=[f"{root}#mnli.p0"], tasks=["mnli"], library=root), "give exactly one of"),
      (dict(tasks=["mnli"]), "need the library directory"),
      (dict(references=f"{root}#mnli.p0"), "references and tasks are lists"),
      (dict(references=["no-separator"]), "is malformed; give LIBRARY_DIR#ENTRY_ID"),
      (dict(references=[f"{root}#nope"]), "no entry 'nope'"),
      (dict(library=root, tasks=["rte"]),
       "has no entry of task 'rte'; its tasks: long, mnli, qnli, sst2"),
      (dict(library=root, retrieval=report, strategy="mixture"), "has no strategy 'mixture'"),
      (dict(library=root, retrieval=report, k=0), "give a positive number of entries"),
      (dict(library=root, retrieval=str(tmp / "bad.json")), "is not a readable retrieval report"),
      (dict(references=[f"{root}#mnli.p0", f"{root}#long.p0"]),
       "the stacked prompts must share [L, E]"),
      (dict(references=[f"{root}#mnli.p0", f"{tmp / 'other'}#x.p0"]), "different frozen models"),
  ]
  for kwargs, message in cases:
    with pytest.raises(ConfigError) as e:
      library_prompts(**kwargs)
    assert message in str(e.value) and "\n" not in str(e.value), (kwargs, str(e.value))
