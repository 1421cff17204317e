"""What evaluators share within a process: seqio's tokenised split and a job's jitted decoders."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from spot_jax import models, prompts
from spot_jax.backbones.t5 import Transformer, config_by_name
from spot_jax.train import evaluator as evaluator_lib
from tests.helpers import local_tasks

LENGTHS = {"inputs": 32, "targets": 4}


@pytest.fixture(scope="module")
def task_name(tmp_path_factory) -> str:
  paths = local_tasks.write_tsv_task_files(tmp_path_factory.mktemp("reuse"), n_train=16, n_val=12)
  return local_tasks.register_tsv_task("test_reuse_polarity", paths)


def _model() -> models.EncoderDecoderModel:
  return models.EncoderDecoderModel(Transformer(config_by_name("t5_1_1_byte_tiny"),
                                                prompt=prompts.PromptTuning(length=4)))


def _params(model):
  dummy = model.dummy_batch(LENGTHS["inputs"], LENGTHS["targets"])
  backbone = models.unbox(model.init_backbone(jax.random.PRNGKey(0), dummy))
  prompt = models.unbox(model.init_prompt(jax.random.PRNGKey(1), backbone, dummy))
  return models.merge_params(backbone, prompt)


def test_evaluators_of_one_split_share_seqio_and_score_the_same(task_name, tmp_path):
  cfg = evaluator_lib.EvalConfig(task_name, LENGTHS, batch_size=8)
  model = _model()
  params = _params(model)
  first = evaluator_lib.Evaluator(model, cfg, log_dir=str(tmp_path / "a"))
  second = evaluator_lib.Evaluator(_model(), cfg, log_dir=str(tmp_path / "b"))
  assert second._evaluator is first._evaluator  # pylint: disable=protected-access
  one, two = first.evaluate(params, step=1), second.evaluate(params, step=1)
  assert one == two and 0.0 <= one[task_name]["accuracy"] <= 100.0
  # Each keeps its own log folder.
  assert list((tmp_path / "a").iterdir()) and list((tmp_path / "b").iterdir())
  other = evaluator_lib.Evaluator(model,
                                  evaluator_lib.EvalConfig(task_name, LENGTHS, num_examples=5))
  assert other._evaluator is not first._evaluator  # pylint: disable=protected-access
  assert other.num_examples == 5


def test_a_task_registered_again_gets_its_own_evaluator(task_name, tmp_path):
  cfg = evaluator_lib.EvalConfig(task_name, LENGTHS, batch_size=8)
  before = evaluator_lib.Evaluator(_model(), cfg)
  local_tasks.register_tsv_task(task_name, local_tasks.write_tsv_task_files(tmp_path, n_val=7))
  after = evaluator_lib.Evaluator(_model(), cfg)
  assert after._evaluator is not before._evaluator  # pylint: disable=protected-access
  assert after.num_examples == 7


def test_a_jobs_evaluators_share_one_set_of_decoders(task_name):
  model = _model()
  outputs = evaluator_lib.ModelOutputs(model, LENGTHS["targets"])
  cfg = evaluator_lib.EvalConfig(task_name, LENGTHS, batch_size=8)
  a = evaluator_lib.Evaluator(model, cfg, outputs=outputs)
  b = evaluator_lib.Evaluator(model, cfg, outputs=outputs)
  assert a._outputs is b._outputs is outputs  # pylint: disable=protected-access
  params = _params(model)
  frozen = {k: v for k, v in params.items() if k != "prompt"}
  stacked = {"prompt": jax.tree.map(lambda x: np.stack([x, x + 0.5]), params["prompt"])}
  a.evaluate_stacked(frozen, stacked, step=1)
  b.evaluate_stacked(frozen, stacked, step=1)
  assert outputs.predict_stacked._cache_size() == 1  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="another model or decode length"):
    evaluator_lib.Evaluator(model,
                            evaluator_lib.EvalConfig(task_name, {"inputs": 32, "targets": 6}),
                            outputs=outputs)


def test_model_input_rows_are_read_once_per_split_and_are_read_only(task_name, tmp_path,
                                                                    monkeypatch):
  cfg = evaluator_lib.EvalConfig(task_name, LENGTHS, batch_size=8)
  model = _model()
  params = _params(model)
  first = evaluator_lib.Evaluator(model, cfg)
  before = first.evaluate(params, step=1)
  (ds, indices, features), = first._rows_cache.values()  # pylint: disable=protected-access
  assert indices == list(range(len(indices))) and len(indices) == first.num_examples
  assert all(not a.flags.writeable for a in features.values())
  # Another job's evaluator of the same split: its rows come from the cache, not the dataset.
  reads = []
  original = type(ds).as_numpy_iterator
  monkeypatch.setattr(type(ds), "as_numpy_iterator", lambda self: reads.append(1) or original(self))
  second = evaluator_lib.Evaluator(_model(), cfg)
  assert second.evaluate(params, step=2) == before and reads == []
  got_indices, got = second._rows(ds)  # pylint: disable=protected-access
  got_indices.append(-1)  # the caller's list is its own
  assert second._rows(ds)[0] == indices  # pylint: disable=protected-access
  np.testing.assert_array_equal(got["encoder_input_tokens"], features["encoder_input_tokens"])
