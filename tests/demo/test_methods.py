"""The demo's job recipes score a class-label target by rank classification and a composed answer
(a sum) by greedy decoding; --backbone picks the embedded toy T5 or toy decoder."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from spot_jax import embedded
from spot_jax.demo import methods
from spot_jax.errors import ConfigError
from tasks import embedded as suite


def test_class_labels_are_ranked_and_a_sum_is_decoded():
  settings = methods.Settings()
  recipe = methods.recipe("pt", settings, vocab_rows=100)
  category, total = (methods.request(t, 0, train_examples=32) for t in ("category", "sum"))
  both = methods.with_rank_classification(recipe, [category, total], settings)
  assert dict(both.class_labels) == {"category": suite.TASKS["category"].labels}
  assert both.rank_examples == settings.rank_examples and both.metric == methods.METRIC
  ranked = methods.with_rank_classification(recipe, [category], settings)
  assert ranked.class_labels and ranked.metric is None  # nothing left to decode
  assert methods.with_rank_classification(recipe, [total], settings) is recipe


def test_numbers_and_word_lists_are_composed_answers_not_classes():
  composed = [k for k, t in suite.TASKS.items() if not t.classes]
  assert composed == ["addition", "reverse", "length", "sum"]
  assert suite.TASKS["sum"].labels and suite.TASKS["category"].classes == suite.TASKS[
      "category"].labels


def test_the_learning_rate_flag_moves_the_peak_and_the_end_of_the_decay():
  from spot_jax.demo import __main__ as demo  # pylint: disable=g-import-not-at-top
  settings = demo._settings(demo._parser().parse_args(["--learning_rate=1"]))  # pylint: disable=protected-access
  assert (settings.learning_rate, settings.final_learning_rate) == (1.0, 0.1)
  assert demo._settings(demo._parser().parse_args([])) == methods.Settings()  # pylint: disable=protected-access


def test_the_backbone_flag_picks_the_embedded_decoder_and_keeps_t5_digests(tmp_path):
  from spot_jax.demo import __main__ as demo  # pylint: disable=g-import-not-at-top
  t5_settings = methods.Settings()
  decoder = demo._settings(demo._parser().parse_args(["--backbone=decoder"]))  # pylint: disable=protected-access
  assert decoder == dataclasses.replace(t5_settings, backbone="decoder")
  recipe = methods.recipe("pt", decoder, vocab_rows=100)
  assert recipe.model.kind == "decoder" and recipe.model.prompt_length == decoder.prompt_length
  assert recipe.initial_checkpoint_path == embedded.DECODER_CHECKPOINT_PATH
  t5_recipe = methods.recipe("pt", t5_settings, vocab_rows=100)
  assert t5_recipe.initial_checkpoint_path == embedded.CHECKPOINT_PATH
  # The toy T5's job folders keep the names they had before the flag; the decoder's differ.
  runs = [methods.request("category", 0, train_examples=32)]
  t5_dir = methods.job_dir(tmp_path, t5_settings, t5_recipe, runs)
  key = {"method": "pt", "settings": {k: v for k, v in dataclasses.asdict(t5_settings).items()
                                      if k != "backbone"},
         "runs": [["category", 0, "", None]]}
  assert t5_dir.name == "pt-" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()
                                               ).hexdigest()[:10]
  assert methods.job_dir(tmp_path, decoder, recipe, runs) != t5_dir
  with pytest.raises(ConfigError, match="--backbone='lstm' is unknown"):
    demo._settings(demo._parser().parse_args(["--backbone=lstm"]))  # pylint: disable=protected-access
  with pytest.raises(ConfigError, match="--backbone=decoder runs the default methods"):
    demo.main(["--backbone=decoder", "--methods=pt,mpt", f"--output_dir={tmp_path / 'out'}"])
  assert not (tmp_path / "out").exists()
