"""Rank classification of trained toy runs: where greedy decoding answers a class label, the
likeliest label is that label (at least 99% of such examples on every classification target); the
accuracy is saved in the run directory, carried by the outcome and reused on a rerun; a run
without prompt parameters is refused."""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from spot_jax import embedded
from spot_jax import experiment
from spot_jax import models
from spot_jax import prompts
from spot_jax.backbones import t5
from spot_jax.demo import methods
from spot_jax.errors import ConfigError
from spot_jax.experiment import rank
from spot_jax.run_dir import RunDir
from spot_jax.train import optimizers
from tasks import embedded as suite

needs_model = pytest.mark.skipif(not os.path.isdir(embedded.CHECKPOINT_PATH),
                                 reason="no toy model; run python -m spot_jax.embedded.pretrain")
TARGETS = ("sentiment_travel", "sentiment_sports", "category")
EXAMPLES = 500


def _recipe() -> experiment.Recipe:
  config = t5.config_by_name(embedded.CONFIG_NAME, dropout_rate=0.0)
  prompt = prompts.PromptTuning(length=10,
                                prompt_init=prompts.sampled_vocab(num_most_frequent=200))
  return experiment.Recipe(
      name="pt", model=models.EncoderDecoderModel(module=t5.Transformer(config, prompt=prompt)),
      optimizer=optimizers.adafactor(learning_rate=methods.learning_rate_schedule(
          methods.Settings(), 40)), steps=40,
      lengths={"inputs": 37, "targets": 6}, batch_size=8, task_module="tasks.embedded",
      initial_checkpoint_path=embedded.CHECKPOINT_PATH, metric=None, embedding_step=10,
      class_labels={t: suite.TASKS[t].classes for t in TARGETS}, rank_examples=EXAMPLES,
      rank_batch_size=100)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  recipe = _recipe()
  requests = [experiment.RunRequest(suite.task_name(t, taskless=True), 0, label=t)
              for t in TARGETS]
  job_dir = tmp_path_factory.mktemp("rank") / "job"
  return recipe, requests, job_dir, experiment.run(recipe, job_dir, requests)


def _greedy_labels(recipe, outcome, data: rank.Examples, labels) -> np.ndarray:
  """Each example's greedy answer as a label index (-1: not a label)."""
  scorer = rank._Scorer(recipe)  # pylint: disable=protected-access
  params = models.merge_params(scorer.backbone(0), {
      "prompt": RunDir(outcome.run_dir).prompt_params()})
  decoded = np.asarray(jax.jit(lambda p, x: recipe.model.predict_batch(p, x, 6))(
      params, data.tokens))
  vocab = suite.get_vocabulary()
  texts = [vocab.decode([int(t) for t in row if t > 1]).strip() for row in decoded]
  return np.array([labels.index(x) if x in labels else -1 for x in texts])


@needs_model
def test_rank_classification_agrees_with_greedy_labels(trained):
  """The demo's recipe on the suite's classification targets: their labels start with distinct
  tokens, so greedy's first step nearly decides, and the two agree on >= 99% of the examples where
  greedy answers a label (>= 98% on each target: one run of 500 examples each)."""
  recipe, _, _, result = trained
  same, answered = 0, 0
  for outcome in result.outcomes:
    labels = suite.TASKS[outcome.label].classes
    data = rank.examples(outcome.task, labels, EXAMPLES, 37, "tasks.embedded")
    greedy = _greedy_labels(recipe, outcome, data, labels)
    scorer = rank._Scorer(recipe)  # pylint: disable=protected-access
    params = models.merge_params(scorer.backbone(0), {
        "prompt": RunDir(outcome.run_dir).prompt_params()})
    picks = rank.classify(scorer.predict, params, data, 100)
    labelled = greedy >= 0
    assert labelled.sum() >= EXAMPLES // 2, outcome.label
    agree = float(np.mean(picks[labelled] == greedy[labelled]))
    print(f"{outcome.label}: greedy answers a label on {labelled.sum()}/{EXAMPLES}, rank "
          f"classification agrees on {agree:.3f}")
    assert agree >= 0.98, (outcome.label, agree)
    same, answered = same + int(np.sum(picks[labelled] == greedy[labelled])), answered + int(
        labelled.sum())
    assert outcome.rank_accuracy == round(100 * float(np.mean(picks == data.gold)), 2)
  assert same / answered >= 0.99, (same, answered)


@needs_model
def test_accuracy_is_saved_and_reused(trained):
  recipe, requests, job_dir, result = trained
  assert result.rank_seconds is not None
  for outcome in result.outcomes:
    saved = json.loads(RunDir(outcome.run_dir).rank_path.read_text())
    assert saved["accuracy"] == outcome.rank_accuracy and saved["examples"] == EXAMPLES
    assert saved["prompt"] == RunDir(outcome.run_dir).exported_prompt()[0].name
  again = experiment.run(recipe, job_dir, requests)
  assert again.seconds is None and again.rank_seconds is None
  assert again.outcomes == result.outcomes
  # Fewer examples: another key, so computed again (and saved for that key).
  fewer = experiment.run(dataclasses.replace(recipe, rank_examples=50), job_dir, requests[:1])
  assert fewer.rank_seconds is not None and fewer.outcomes[0].rank_accuracy is not None


@needs_model
def test_a_run_without_prompt_parameters_is_refused_naming_the_method(trained, tmp_path):
  recipe, requests, _, result = trained
  run = RunDir(result.outcomes[0].run_dir)
  scorer = rank._Scorer(dataclasses.replace(recipe, name="model_tuning"))  # pylint: disable=protected-access
  empty = RunDir(tmp_path / "empty")
  empty.path.mkdir()
  (empty.path / "prompts").mkdir()
  prompt = run.prompt_path(recipe.steps).read_bytes()
  (empty.path / "prompts" / "prompt_best.npy").write_bytes(prompt)
  with pytest.raises(ConfigError, match="method 'model_tuning' cannot be scored"):
    scorer.accuracy(empty, requests[0].task, suite.TASKS[TARGETS[0]].classes, 0)


@needs_model
def test_finished_runs_are_scored_in_a_process_that_did_not_train_them(trained, tmp_path):
  """A rerun reuses the trained runs and only scores them: the backbone's abstract parameters are
  then first computed under the scorer's mesh, which must not constrain their shardings."""
  recipe, requests, job_dir, result = trained
  from spot_jax.backbones.t5.checkpoints import common  # pylint: disable=g-import-not-at-top
  common._abstract_params.cache_clear()  # pylint: disable=protected-access  # as a new process
  again = experiment.run(dataclasses.replace(recipe, rank_examples=40), job_dir, requests[:1])
  assert again.seconds is None and again.rank_seconds is not None
  assert 0 <= again.outcomes[0].rank_accuracy <= 100
