"""Prompt initialisers: shape, dtype, provenance, and errors that name the problem."""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import prompt_train as util
from spot_jax import prompts
from spot_jax.prompts import initializers
from spot_jax.errors import ConfigError
from spot_jax.backbones.t5 import Transformer, config_by_name

RNG = jax.random.PRNGKey(0)


@pytest.fixture(scope="module")
def tiny_table(t5_fixtures: pathlib.Path) -> np.ndarray:
  path = t5_fixtures / "tiny_embeddings_32128x4.npy"
  if not path.exists():
    pytest.skip(f"{path} not found (real T5 fixtures live in ../shared)")
  return np.load(path).astype(np.float32)


@pytest.fixture(scope="module")
def vocab(t5_vocab_path: str):
  """The real T5 SentencePiece model; its `.encode(str) -> list[int]` gives the same ids as
  seqio's SentencePieceVocabulary (checked in test_prompts_gin) without importing TensorFlow."""
  sentencepiece = pytest.importorskip("sentencepiece")
  return sentencepiece.SentencePieceProcessor(model_file=t5_vocab_path)


def _row_ids(rows: np.ndarray, table: np.ndarray) -> np.ndarray:
  """The table index of each row (every row must be an exact table row)."""
  matches = np.all(rows[:, None, :] == table[None, :, :], axis=-1)  # [R, V]
  assert np.all(matches.any(axis=1)), "some rows are not rows of the embedding table"
  return matches.argmax(axis=1)


def test_uniform_range_shape_dtype():
  for length in (1, 150):
    value = np.asarray(prompts.uniform(0.5)(RNG, (length, 32), None))
    assert value.shape == (length, 32) and value.dtype == np.float32
    assert value.min() >= -0.5 and value.max() <= 0.5
  big = np.asarray(prompts.uniform(0.2)(RNG, (150, 32), None))
  assert big.min() < -0.19 and big.max() > 0.19  # fills the range, not a narrower one
  assert np.unique(big).size > 0.99 * big.size


def test_uniform_rejects_negative_scale():
  with pytest.raises(ValueError, match="scale must be a non-negative"):
    prompts.uniform(-0.1)


def test_sampled_vocab_rows_from_most_frequent_without_replacement(tiny_table):
  assert np.unique(tiny_table[:5000], axis=0).shape[0] == 5000  # rows identify their ids
  for length in (1, 7, 150):
    value = np.asarray(prompts.sampled_vocab()(RNG, (length, 4), tiny_table))
    assert value.shape == (length, 4) and value.dtype == np.float32
    ids = _row_ids(value, tiny_table[:5000])
    assert len(set(ids.tolist())) == length  # without replacement
  other = np.asarray(prompts.sampled_vocab()(jax.random.PRNGKey(1), (150, 4), tiny_table))
  assert not np.array_equal(other, value)


def test_sampled_vocab_with_replacement_only_when_longer_than_candidates(tiny_table):
  value = np.asarray(prompts.sampled_vocab(num_most_frequent=10)(RNG, (25, 4), tiny_table))
  ids = _row_ids(value, tiny_table[:10])
  assert ids.max() < 10 and len(set(ids.tolist())) < 25
  exact = np.asarray(prompts.sampled_vocab(num_most_frequent=10)(RNG, (10, 4), tiny_table))
  assert sorted(_row_ids(exact, tiny_table[:10]).tolist()) == list(range(10))


def test_sampled_vocab_fills_smop_shape_and_small_tables():
  table = np.random.RandomState(0).randn(128, 8).astype(np.float32)
  value = np.asarray(prompts.sampled_vocab()(RNG, (4, 5, 8), table))
  assert value.shape == (4, 5, 8)
  assert len(set(_row_ids(value.reshape(20, 8), table).tolist())) == 20


def test_sampled_vocab_errors():
  with pytest.raises(ValueError,
                     match="sampled_vocab.num_most_frequent=0 must be a positive integer"):
    prompts.sampled_vocab(0)
  with pytest.raises(ValueError, match="differs from the embedding table width"):
    prompts.sampled_vocab()(RNG, (3, 5), np.zeros((10, 4), np.float32))


def test_class_labels_from_strings_real_vocab(tiny_table, vocab):
  labels = ["entailment", "not_entailment", "positive"]
  init = prompts.class_labels_from_strings(labels, vocab)
  value = np.asarray(init(RNG, (10, 4), tiny_table))
  assert value.shape == (10, 4) and value.dtype == np.float32
  for i, label in enumerate(labels):
    ids = vocab.encode(label)
    np.testing.assert_allclose(value[i], tiny_table[ids].mean(axis=0), rtol=0, atol=1e-7)
  assert len(vocab.encode("not_entailment")) > 1  # the multi-token case is exercised
  ids = _row_ids(value[3:], tiny_table[:5000])
  assert len(set(ids.tolist())) == 7


def test_class_labels_exactly_as_many_rows_as_labels(tiny_table):
  value = np.asarray(prompts.class_labels([[5], [6, 7]])(RNG, (2, 4), tiny_table))
  np.testing.assert_array_equal(value[0], tiny_table[5])
  np.testing.assert_allclose(value[1], (tiny_table[6] + tiny_table[7]) / 2, atol=1e-7)


def test_class_labels_errors(vocab):
  with pytest.raises(ConfigError, match=r"labels entry 1 \(' '\) tokenizes to no tokens"):
    prompts.class_labels_from_strings(["yes", " "], vocab)
  with pytest.raises(ConfigError, match=r"labels entry 2 \('yes'\) repeats an earlier label"):
    prompts.class_labels_from_strings(["yes", "no", "yes"], vocab)
  with pytest.raises(ValueError, match="label 1 has no token ids"):
    prompts.class_labels([[4], []])
  table = np.zeros((100, 4), np.float32)
  with pytest.raises(ValueError, match="3 labels do not fit a prompt of 2 rows"):
    prompts.class_labels([[1], [2], [3]])(RNG, (2, 4), table)
  with pytest.raises(ValueError, match="token id 100 outside the embedding table of 100 rows"):
    prompts.class_labels([[100]])(RNG, (2, 4), table)
  with pytest.raises(ConfigError, match="encode"):
    prompts.class_labels_from_strings(["yes"], object())


def test_from_text_exact_repeat_truncate(tiny_table, vocab):
  text = "Is the second sentence implied by the first?"
  ids = vocab.encode(text)
  n = len(ids)
  exact = np.asarray(prompts.from_text(text, vocab)(RNG, (n, 4), tiny_table))
  np.testing.assert_array_equal(exact, tiny_table[ids])
  repeat = np.asarray(prompts.from_text(text, vocab, fit="repeat")(RNG, (n + 3, 4), tiny_table))
  np.testing.assert_array_equal(repeat, tiny_table[ids + ids[:3]])
  trunc = np.asarray(prompts.from_text(text, vocab, fit="truncate")(RNG, (2, 4), tiny_table))
  np.testing.assert_array_equal(trunc, tiny_table[ids[:2]])
  with pytest.raises(ValueError, match=f"the text has {n} tokens but the prompt has {n + 1} rows"):
    prompts.from_text(text, vocab)(RNG, (n + 1, 4), tiny_table)
  with pytest.raises(ValueError, match="fit must be one of"):
    prompts.from_text(text, vocab, fit="pad")
  with pytest.raises(ValueError, match="tokenizes to no tokens"):
    prompts.from_text("", vocab)


def test_from_file_equals_source(tmp_path):
  source = np.random.RandomState(0).randn(12, 32).astype(np.float32)
  path = tmp_path / "p.npy"
  np.save(path, source)
  value = prompts.from_file(path)(RNG, (12, 32), None)
  assert value.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(value), source)
  with pytest.raises(ValueError,
                     match=r"p\.npy.*expected a prompt of shape \(10, 32\), found \(12, 32\)"):
    prompts.from_file(path)(RNG, (10, 32), None)
  with pytest.raises(ConfigError, match="no prompt file at"):
    prompts.from_file(tmp_path / "missing.npy")


def test_from_file_real_fixture(t5_fixtures):
  path = t5_fixtures / "prompt_5x256.npy"
  if not path.exists():
    pytest.skip(f"{path} not found")
  source = np.load(path)
  np.testing.assert_array_equal(np.asarray(prompts.from_file(path)(RNG, (5, 256), None)),
                                source.astype(np.float32))
  with pytest.raises(ValueError, match=r"prompt_5x256\.npy.*expected .*\(5, 4\), found \(5, 256\)"):
    prompts.from_file(path)(RNG, (5, 4), None)


def _export(model_dir: pathlib.Path, name: str, value: np.ndarray) -> None:
  (model_dir / "prompts").mkdir(parents=True, exist_ok=True)
  np.save(model_dir / "prompts" / name, value)


def test_from_checkpoint_picks_latest_step_numerically(tmp_path):
  rs = np.random.RandomState(1)
  values = {name: rs.randn(6, 8).astype(np.float32)
            for name in ("prompt_step_300.npy", "prompt_step_2000.npy", "prompt_best.npy")}
  for name, value in values.items():
    _export(tmp_path, name, value)
  latest = prompts.from_checkpoint(tmp_path)(RNG, (6, 8), None)
  np.testing.assert_array_equal(np.asarray(latest), values["prompt_step_2000.npy"])
  step = prompts.from_checkpoint(str(tmp_path), step=300)(RNG, (6, 8), None)
  np.testing.assert_array_equal(np.asarray(step), values["prompt_step_300.npy"])
  best = prompts.from_checkpoint(tmp_path, step="best")(RNG, (6, 8), None)
  np.testing.assert_array_equal(np.asarray(best), values["prompt_best.npy"])
  with pytest.raises(ValueError, match=r"expected a prompt of shape \(5, 8\), found \(6, 8\)"):
    prompts.from_checkpoint(tmp_path)(RNG, (5, 8), None)


def test_from_checkpoint_errors(tmp_path):
  with pytest.raises(ConfigError, match=r"no prompts/prompt_step_<N>\.npy in"):
    prompts.from_checkpoint(tmp_path / "nowhere")
  (tmp_path / "prompts").mkdir()
  with pytest.raises(ConfigError, match=r"no prompts/prompt_step_<N>\.npy in"):
    prompts.from_checkpoint(tmp_path)
  with pytest.raises(ConfigError, match="prompt_step_7.npy"):
    prompts.from_checkpoint(tmp_path, step=7)
  with pytest.raises(ConfigError, match="step must be a non-negative integer, 'best' or None"):
    prompts.from_checkpoint(tmp_path, step="last")


def test_invalid_module_settings_name_the_problem():
  with pytest.raises(ValueError, match="PromptTuning.length=0 must be a positive integer"):
    prompts.PromptTuning(0)
  with pytest.raises(ValueError, match="PromptTuning.placement='middle' is unknown"):
    prompts.PromptTuning(3, placement="middle")
  with pytest.raises(ValueError, match="SMoP.length=0 must be a positive integer"):
    prompts.SMoP(length=0)
  with pytest.raises(ValueError, match="ResidualPrompt.bottleneck=0 must be a positive integer"):
    prompts.ResidualPrompt(4, bottleneck=0)


def _tiny_model_with_table(table: np.ndarray, prompt) -> tuple[Transformer, dict]:
  """t5_1_1_tiny (vocab 32128, embed 4) whose frozen embedding is the real fixture table."""
  config = config_by_name("t5_1_1_tiny").replace(dropout_rate=0.0)
  frozen = dict(util.frozen_backbone(config))
  frozen["token_embedder"] = {"embedding": jnp.asarray(table)}
  return Transformer(config, prompt=prompt), frozen


def test_initialisers_see_the_loaded_table_through_the_hook(tiny_table, vocab, tmp_path):
  """The trainer's recipe (apply with the frozen params, mutable params) uses the real table."""
  model, frozen = _tiny_model_with_table(
      tiny_table, prompts.PromptTuning(20, prompt_init=prompts.sampled_vocab()))
  prompt = np.asarray(util.create_prompt_params(model, frozen, full_model=True)["prompt"])
  assert prompt.shape == (20, 4) and prompt.dtype == np.float32
  _row_ids(prompt, tiny_table[:5000])

  labels = prompts.class_labels_from_strings(["entailment", "not_entailment"], vocab)
  model, frozen = _tiny_model_with_table(tiny_table, prompts.PromptTuning(5, prompt_init=labels))
  prompt = np.asarray(util.create_prompt_params(model, frozen)["prompt"])
  np.testing.assert_allclose(prompt[1], tiny_table[vocab.encode("not_entailment")].mean(0),
                             atol=1e-7)

  smop = prompts.SMoP(num_prompts=3, length=4)
  model, frozen = _tiny_model_with_table(tiny_table, smop)
  params = util.create_prompt_params(model, frozen)
  assert np.asarray(params["prompts"]).shape == (3, 4, 4)
  _row_ids(np.asarray(params["prompts"]).reshape(12, 4), tiny_table[:5000])

  source = np.random.RandomState(3).randn(6, 4).astype(np.float32)
  _export(tmp_path, "prompt_step_10.npy", source)
  spot = prompts.PromptTuning(6, prompt_init=prompts.from_checkpoint(tmp_path))
  model, frozen = _tiny_model_with_table(tiny_table, spot)
  np.testing.assert_array_equal(np.asarray(util.create_prompt_params(model, frozen)["prompt"]),
                                source)


def test_every_initialiser_states_its_origin_for_the_run_record(tmp_path):
  from spot_jax.run_dir import BestMetric, RunDir  # pylint: disable=g-import-not-at-top
  assert initializers.origin(initializers.uniform(0.5)) == "uniform(scale=0.5)"
  assert initializers.origin(initializers.sampled_vocab(7)) == "sampled_vocab(num_most_frequent=7)"
  assert initializers.origin(initializers.from_array(np.ones((2, 4)), "library entry rte")) == (
      "library entry rte")
  run = RunDir(tmp_path / "source")
  run.prompts.mkdir(parents=True)
  np.save(run.prompt_path(12), np.ones((2, 4), np.float32))
  np.save(run.prompt_path("best"), np.ones((2, 4), np.float32))
  assert initializers.origin(initializers.from_checkpoint(run.path)) == (
      f"run {run.path}, step 12 (prompts/prompt_step_12.npy)")
  run.write_best_metric(BestMetric(8, "accuracy", 90.0))
  assert initializers.origin(initializers.from_checkpoint(run.path, "best")) == (
      f"run {run.path}, best, step 8 (prompts/prompt_best.npy)")
  assert initializers.origin(initializers.from_file(run.prompt_path(12))) == (
      f"file {run.prompt_path(12)}")
  assert initializers.origin(jax.nn.initializers.normal(1.0)) == "normal"
