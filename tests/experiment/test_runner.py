"""The experiment runner on the embedded toy T5: K runs of one recipe in one trainer call, each in
its own run directory, read back from run.json; finished jobs are reused; a run alone is a plain
run directory; a request's initial prompt is the one its run starts from."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import optax
import pytest

from spot_jax import embedded
from spot_jax import experiment
from spot_jax import models
from spot_jax import prompts
from spot_jax.backbones import t5
from spot_jax.run_dir import RunDir
from tasks import embedded as suite

needs_model = pytest.mark.skipif(not os.path.isdir(embedded.CHECKPOINT_PATH),
                                 reason="no toy model; run python -m spot_jax.embedded.pretrain")
LENGTH = 4


def _recipe(optimizer) -> experiment.Recipe:
  config = t5.config_by_name(embedded.CONFIG_NAME, dropout_rate=0.0)
  prompt = prompts.PromptTuning(length=LENGTH,
                                prompt_init=prompts.sampled_vocab(num_most_frequent=100))
  return experiment.Recipe(
      name="pt", model=models.EncoderDecoderModel(module=t5.Transformer(config, prompt=prompt)),
      optimizer=optimizer, steps=2, lengths={"inputs": 37, "targets": 6}, batch_size=4,
      task_module="tasks.embedded", initial_checkpoint_path=embedded.CHECKPOINT_PATH,
      eval_batch_size=8, eval_num_examples=8, embedding_step=1)


@needs_model
def test_k_runs_in_one_job_then_reused_and_a_run_alone(tmp_path):
  task = suite.task_name("sum", taskless=True)
  start = np.random.RandomState(0).normal(size=(LENGTH, t5.config_by_name(
      embedded.CONFIG_NAME).emb_dim)).astype(np.float32)
  # A learning rate of 0 keeps every prompt where it started: the run from `start` must end there.
  frozen = _recipe(optax.sgd(0.0))
  requests = [experiment.RunRequest(task, 3, label="sum"),
              experiment.RunRequest(task, 3, label="sum", name="sum.from_start", init=start,
                                    init_note="a test prompt")]
  result = experiment.run(frozen, tmp_path / "job", requests)
  assert result.seconds is not None
  job = json.loads((tmp_path / "job" / "job.json").read_text())
  assert [r["name"] for r in job["runs"]] == ["sum.seed_3", "sum.from_start"]
  plain, started = result.outcomes
  for outcome, request in zip(result.outcomes, requests):
    record = RunDir(outcome.run_dir).read_record()
    assert outcome.run_dir == str(tmp_path / "job" / request.run_name)
    assert (outcome.label, outcome.method, outcome.task, outcome.seed) == ("sum", "pt", task, 3)
    assert record.finished and outcome.score == record.score is not None
  assert (plain.init, started.init) == ("sampled vocabulary", "a test prompt")
  np.testing.assert_array_equal(started.prompt(), start)
  assert not np.array_equal(plain.prompt(), start)
  # Every run finished: the same call trains nothing and reads the same outcomes.
  again = experiment.run(frozen, tmp_path / "job", requests)
  assert again.seconds is None and again.outcomes == result.outcomes
  # A longer budget: the runs are not taken as finished; the job resumes them to the new end.
  longer = experiment.run(dataclasses.replace(frozen, steps=3), tmp_path / "job", requests)
  assert longer.seconds is not None and [o.train_steps for o in longer.outcomes] == [3, 3]
  np.testing.assert_array_equal(longer.outcomes[1].prompt(), start)
  # Alone: a plain run directory (no job record) whose prompt starts from the request's.
  alone = experiment.run(frozen, tmp_path / "alone", requests[1:], alone=True)
  assert not (tmp_path / "alone" / "job.json").exists()
  np.testing.assert_array_equal(alone.outcomes[0].prompt(), start)
  assert alone.outcomes[0].init == "a test prompt"
