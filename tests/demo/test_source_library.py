"""The demo's source screen: a source not 10 points above its task's chance is left out of
retrieval, with one line, and recorded in results.json; retrieval ranks the rest (all of them
when every source is left out). Fabricated outcomes and library entries, no training."""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from spot_jax.demo import results
from spot_jax.demo import source_library
from spot_jax.experiment import RunOutcome
from spot_jax.spot import library as prompt_library

CHANCE = {"topic": 26.1, "nli": 34.0, "reverse": 0.1, "addition": 10.4, "length": 13.5}


def _source(task: str, score) -> RunOutcome:
  return RunOutcome(run_dir=f"/runs/{task}.seed_5", task=f"spot_toy_{task}_taskless_v100", seed=5,
                    score=score, metric="accuracy", fingerprint={}, init="", train_steps=80,
                    label=task, method="source")


def _entry(task: str, direction) -> prompt_library.Entry:
  embedding = np.tile(np.asarray(direction, np.float32), (2, 1))
  return prompt_library.Entry(id=task, task=f"spot_toy_{task}_taskless_v100", run_id=task, seed=5,
                              fingerprint={}, score=None, metric="accuracy", embedding_step=10,
                              prompt=embedding, embedding=embedding)


@dataclasses.dataclass
class _TargetRun:
  """What `choose` reads of a target's Prompt Tuning run."""
  label: str
  seed: int
  task: str
  direction: tuple

  def embedding(self) -> np.ndarray:
    return np.tile(np.asarray(self.direction, np.float32), (2, 1))


def test_a_source_not_10_points_above_chance_is_left_out_with_one_line():
  sources = [_source("topic", 99.0), _source("nli", 43.99), _source("reverse", 5.0),
             _source("addition", 20.4), _source("length", None)]
  left = source_library.screen(sources, CHANCE)
  # addition is exactly 10 points above chance (kept); nli 9.99 above, reverse 4.9: left out
  assert [(x.task, x.accuracy, x.chance) for x in left] == [
      ("nli", 43.99, 34.0), ("reverse", 5.0, 0.1), ("length", None, 13.5)]
  assert left[0].line() == ("source nli left out of retrieval: accuracy 44.0%, not 10 points "
                            "above chance (34.0%)")
  assert left[2].line().startswith("source length left out of retrieval: accuracy none,")
  assert left[1].to_json() == {"task": "reverse", "accuracy": 5.0, "chance": 0.1}


def test_retrieval_ranks_only_the_sources_kept():
  entries = [_entry("topic", (1.0, 0.2)), _entry("nli", (0.0, 1.0)),
             _entry("addition", (1.0, 0.0))]
  target = _TargetRun("category", 0, "spot_toy_category_taskless_v100", (0.1, 1.0))
  related = {"category": ["topic"]}
  assert source_library.choose(entries, [target], related)[("category", 0)].source == "nli"
  nli = source_library.LeftOut("nli", 40.0, 34.0)
  choice = source_library.choose(entries, [target], related, [nli])[("category", 0)]
  assert choice.source == "topic" and choice.related
  assert [s for s, _ in choice.ranking] == ["topic", "addition"]
  # every related source left out: retrieval still ranks the rest
  topic = source_library.LeftOut("topic", 30.0, 26.1)
  choice = source_library.choose(entries, [target], related, [nli, topic])[("category", 0)]
  assert choice.source == "addition" and not choice.related
  # every source left out: all of them are ranked (the demo prints EVERY_SOURCE_LEFT_OUT)
  every = [source_library.LeftOut(e.id, 0.0, 50.0) for e in entries]
  assert source_library.choose(entries, [target], related, every)[("category", 0)].source == "nli"


def test_left_out_sources_are_in_results_json_and_results_md(tmp_path):
  left = [source_library.LeftOut("reverse", 5.0, 0.1).to_json()]
  summary = results.Summary(["sum"], ["pt"], [0, 1], {"sum": 10.2},
                            {("sum", "pt"): [20.0, 30.0]}, [("reverse", 5.0), ("topic", 99.0)],
                            {}, {}, left_out=left)
  saved = json.loads(json.dumps(summary.to_json()))
  assert saved["left_out"] == [{"task": "reverse", "accuracy": 5.0, "chance": 0.1}]
  assert results.Summary.from_json(saved).left_out == saved["left_out"]
  results.write(tmp_path, summary, {"target_steps": 2})
  text = (tmp_path / "results.md").read_text()
  assert ("Left out of retrieval (accuracy not 10 points above the task's chance): reverse 5.0 "
          "(chance 0.1).") in text
