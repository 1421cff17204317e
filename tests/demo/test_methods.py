"""The demo's job recipes score a class-label target by rank classification and a composed answer
(a sum) by greedy decoding."""
from __future__ import annotations

from spot_jax.demo import methods
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
