"""Trainer invariants on a tiny frozen T5 and a local seqio task (in-process)."""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from spot_jax import data, models, prompts
from spot_jax.train import evaluator as evaluator_lib
from spot_jax.train import optimizers
from spot_jax import train as train_lib
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import Transformer, config_by_name, save_checkpoint
from tests.helpers import local_tasks

LENGTHS = {"inputs": 32, "targets": 4}


@pytest.fixture(scope="module")
def task_name(tmp_path_factory) -> str:
  paths = local_tasks.write_tsv_task_files(tmp_path_factory.mktemp("tsv"))
  return local_tasks.register_tsv_task("test_local_polarity", paths)


@pytest.fixture(scope="module")
def backbone_checkpoint(tmp_path_factory):
  """A saved tiny random backbone, so 'frozen = what was loaded' is checked against a file."""
  config = config_by_name("t5_1_1_byte_tiny")
  model = models.EncoderDecoderModel(Transformer(config))
  params = models.unbox(model.init_backbone(jax.random.PRNGKey(7), model.dummy_batch(8, 4)))
  path = tmp_path_factory.mktemp("ckpt") / "checkpoint_0"
  save_checkpoint(jax.device_get(params), str(path), format="t5x")
  return str(path), jax.device_get(params)


def _model(prompt_length: int = 6) -> models.EncoderDecoderModel:
  prompt = prompts.PromptTuning(length=prompt_length,
                                prompt_init=prompts.sampled_vocab(num_most_frequent=256))
  return models.EncoderDecoderModel(Transformer(config_by_name("t5_1_1_byte_tiny"), prompt=prompt))


@pytest.fixture(scope="module")
def run50(tmp_path_factory, task_name, backbone_checkpoint):
  ckpt_path, _ = backbone_checkpoint
  cfg = data.DatasetConfig(task_name, LENGTHS, batch_size=16)
  return train_lib.train(model=_model(), train_dataset_cfg=cfg, total_steps=50,
                       model_dir=str(tmp_path_factory.mktemp("run50")),
                       optimizer=optimizers.adafactor(), initial_checkpoint_path=ckpt_path,
                       eval_period=1000, log_period=10, verbose=False)


def test_loss_falls(run50):
  losses = [h["loss"] for h in run50.history]
  assert len(losses) == 50
  assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.3, losses


def test_frozen_params_bit_identical_to_checkpoint(run50, backbone_checkpoint):
  _, saved = backbone_checkpoint
  got = jax.device_get(run50.frozen_params)
  flat_saved = jax.tree_util.tree_flatten_with_path(saved)[0]
  flat_got = dict(jax.tree_util.tree_flatten_with_path(got)[0])
  assert len(flat_saved) == len(flat_got)
  for path, value in flat_saved:
    np.testing.assert_array_equal(np.asarray(flat_got[path]), np.asarray(value), err_msg=str(path))


def test_state_holds_prompt_only(run50):
  assert set(run50.state.params) == {"prompt"}
  prompt_sizes = {np.size(x) for x in jax.tree.leaves(run50.state.params)}
  for path, leaf in jax.tree_util.tree_flatten_with_path(run50.state.opt_state)[0]:
    if np.size(leaf) <= 1:
      continue  # step counts, hyper-parameters, Adafactor's unused factored placeholders
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    assert "prompt" in names, (names, np.shape(leaf))
    assert np.size(leaf) in prompt_sizes, (names, np.shape(leaf))


def test_train_step_compiles_once(run50):
  assert run50.compilations == 1


def test_prompt_changed_and_exported(run50, tmp_path):
  prompt = np.asarray(jax.device_get(run50.state.params["prompt"]["prompt"]))
  assert prompt.shape == (6, 64)
  assert np.isfinite(prompt).all()


def test_model_tuning_trains_every_parameter(tmp_path, task_name):
  cfg = data.DatasetConfig(task_name, LENGTHS, batch_size=16)
  model = models.EncoderDecoderModel(Transformer(config_by_name("t5_1_1_byte_tiny")))
  result = train_lib.train(model=model, train_dataset_cfg=cfg, total_steps=30,
                         model_dir=str(tmp_path),
                         optimizer=optimizers.adafactor(learning_rate=1e-2, factored=True),
                         trainable="all", eval_period=1000, verbose=False)
  assert result.frozen_params == {}
  assert "encoder" in result.state.params and "decoder" in result.state.params
  losses = [h["loss"] for h in result.history]
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.3, losses


def test_eval_and_best_prompt_export(tmp_path, task_name):
  cfg = data.DatasetConfig(task_name, LENGTHS, batch_size=16)
  ecfg = evaluator_lib.EvalConfig(task_name, LENGTHS, batch_size=16)
  result = train_lib.train(model=_model(), train_dataset_cfg=cfg, total_steps=20,
                           model_dir=str(tmp_path),
                         eval_cfg=ecfg, eval_period=10,
                         checkpoint_cfg=train_lib.CheckpointConfig(best_metric="accuracy",
                                                                   save_prompt_steps=(3,)),
                         verbose=False)
  assert [s for s, _ in result.eval_history] == [10, 20]
  for _, metrics in result.eval_history:
    assert 0.0 <= metrics[task_name]["accuracy"] <= 100.0
  for name in ("prompt_step_3", "prompt_step_10", "prompt_step_20", "prompt_best"):
    assert (tmp_path / "prompts" / f"{name}.npy").is_file(), name
  final = np.load(tmp_path / "prompts" / "prompt_step_20.npy")
  np.testing.assert_array_equal(final, np.asarray(result.state.params["prompt"]["prompt"]))
  assert (tmp_path / "best" / "metric.json").is_file()


@pytest.mark.parametrize("change, message", [
    (dict(lengths={"inputs": 4, "targets": 4}), "shorter than the prompt"),
    (dict(pack=True), "packed examples are not supported"),
    (dict(task="test_local_polarty"), "did you mean 'test_local_polarity'"),
    (dict(trainable="everything"), "valid: 'prompt'"),
])
def test_bad_configuration_is_one_clear_error(tmp_path, task_name, change, message):
  cfg = data.DatasetConfig(change.get("task", task_name), change.get("lengths", LENGTHS),
                           batch_size=8, pack=change.get("pack", False))
  with pytest.raises(ConfigError, match=message) as info:
    train_lib.train(model=_model(), train_dataset_cfg=cfg, total_steps=5,
                  model_dir=str(tmp_path / "run"), trainable=change.get("trainable", "prompt"),
                  verbose=False)
  assert "\n" not in str(info.value)
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_truncation_is_counted_and_warned(tmp_path, task_name, capsys):
  cfg = data.DatasetConfig(task_name, {"inputs": 32, "targets": 2}, batch_size=8)
  train_lib.train(model=_model(), train_dataset_cfg=cfg, total_steps=4, model_dir=str(tmp_path),
                log_period=2, verbose=True)
  out = capsys.readouterr().out
  assert "warning: 16 of 16 training examples so far had targets longer than" in out
  assert re.search(r"truncated in this run: \d+ inputs and 32 targets of 32 examples", out)


def test_relative_model_dir(tmp_path, task_name, monkeypatch):
  """A relative MODEL_DIR (orbax itself refuses relative paths) trains, checkpoints and resumes."""
  monkeypatch.chdir(tmp_path)
  cfg = data.DatasetConfig(task_name, {"inputs": 32, "targets": 8}, batch_size=8)
  train_lib.train(model=_model(), train_dataset_cfg=cfg, total_steps=2, model_dir="runs/rel",
                  verbose=False)
  assert (tmp_path / "runs" / "rel" / "checkpoints" / "2").is_dir()
  result = train_lib.train(model=_model(), train_dataset_cfg=cfg, total_steps=3,
                         model_dir="runs/rel", verbose=False)
  assert int(result.state.step) == 3 and len(result.history) == 1
