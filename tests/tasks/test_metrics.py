"""T5 metrics and postprocessors: hand-computed cases, edge cases, and parity with scikit-learn."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from tasks import metrics, postprocessors


def test_f1_with_invalid_counts_invalid_as_wrong():
  # invalid predictions become the opposite class: [1, 0, 1, 1] vs targets [1, 1, 0, 0]
  # -> tp 1, fp 2, fn 1 -> F1 2/5.
  assert metrics.f1_score_with_invalid([1, 1, 0, 0], [1, -1, -1, 1]) == {"f1": 40.0}
  assert metrics.f1_score_with_invalid([0, 0], [0, 0]) == {"f1": 0.0}  # no positives: 0, as sklearn


def test_matthews_hand_and_degenerate():
  # Binary: tp 2, tn 1, fp 1, fn 0 -> (2*1 - 1*0) / sqrt(3*2*1*2).
  assert metrics.matthews_corrcoef([1, 1, 0, 0],
                                   [1, 1, 1, 0])["matthews_corrcoef"] == pytest.approx(
                                       100 * 2 / math.sqrt(12), rel=1e-12)
  assert metrics.matthews_corrcoef([1, 1, 1], [1, 1, 1]) == {"matthews_corrcoef": 0.0}


def test_macro_f1_and_accuracy():
  out = metrics.mean_multiclass_f1(3)([0, 1, 2, 2], [0, 2, 2, -1])
  # class 0: 1; class 1: 0; class 2: tp 1, fp 1, fn 1 -> 1/2.
  assert out == {"mean_3class_f1": pytest.approx(100 * 1.5 / 3)}
  assert metrics.accuracy(["a", "b"], ["a", "c"]) == {"accuracy": 50.0}
  with pytest.raises(ValueError, match="must match"):
    metrics.accuracy([1], [1, 2])


def test_correlations():
  t, p = [0.0, 1.0, 2.0, 3.0], [0.0, 2.0, 1.0, 3.0]
  assert metrics.pearson_corrcoef(t, p)["pearson_corrcoef"] == pytest.approx(80.0, rel=1e-12)
  assert (metrics.spearman_corrcoef(t, [0.0, 9.0, 1.0, 10.0])["spearman_corrcoef"]
          == pytest.approx(80.0, rel=1e-12))


def test_squad_normalisation_and_scores():
  assert metrics.normalize_squad("The  Eiffel-Tower, an icon!") == "eiffeltower icon"
  out = metrics.squad([["Eiffel Tower", "the tower"], ["1984"]], ["tower", "in 1984"])
  # "tower" equals "the tower" once articles go: EM 1, F1 1. "in 1984" vs "1984": EM 0, F1 2/3.
  assert out == {"em": 50.0, "f1": pytest.approx(100 * (1 + 2 / 3) / 2)}


def test_multirc_and_record_grouping():
  targets = [{"value": 1, "group": (0, 0)}, {"value": 0, "group": (0, 0)},
             {"value": 1, "group": (0, 1)}]
  predictions = [{"value": 1}, {"value": -1}, {"value": 1}]
  assert metrics.multirc_exact_match(targets, predictions) == {"exact_match": 50.0}
  # invalid -1 against target 0 becomes 1: tp 2, fp 1 -> F1 4/5.
  assert metrics.multirc_f1_over_all_answers(targets, predictions) == {"f1": pytest.approx(80.0)}
  record_targets = [{"value": ["cat"], "group": (0, 0)}, {"value": ["cat"], "group": (0, 0)}]
  assert (metrics.record_metric(record_targets,
                                [{"value": "cat"}, {"value": "dog"}]) == {"em": 100.0, "f1": 100.0})


def test_postprocessors():
  assert (postprocessors.string_label_to_class_id(b"neutral",
                                                  label_classes=("entailment", "neutral")) == 1)
  assert (postprocessors.string_label_to_class_id("Neutral",
                                                  label_classes=("entailment", "neutral")) == -1)
  assert (postprocessors.string_to_float("3.8") == 3.8
          and postprocessors.string_to_float("x") == -1.0)
  example = {"targets_pretokenized": b"the pony", "label": 1, "answers": [b"a", b"b"],
             "idx/paragraph": 2, "idx/question": 5, "idx/passage": 1, "idx/query": 3}
  assert postprocessors.wsc_simple("Pony", example=example) == 1
  assert postprocessors.wsc_simple("the pony's tail", example=example) == 0  # possessive mismatch
  assert postprocessors.wsc_simple("the", example=example) == -1  # only a determiner: empty
  assert postprocessors.wsc_simple("x", example=example, is_target=True) == 1
  assert (postprocessors.multirc("True", example=example,
                                 is_target=True) == {"value": 1, "group": (2, 5)})
  assert (postprocessors.record("b", example=example, is_target=True) == {"value": ["a", "b"],
                                                                          "group": (1, 3)})
  assert postprocessors.qa("x", example=example, is_target=True) == ["a", "b"]


@pytest.mark.parametrize("seed", range(5))
def test_parity_with_scikit_learn(seed):
  sklearn_metrics = pytest.importorskip("sklearn.metrics",
                                        reason="scikit-learn is only a cross-check")
  rng = np.random.default_rng(seed)
  t2, p2 = rng.integers(0, 2, 40), rng.integers(-1, 2, 40)
  p_fixed = np.where((p2 != 0) & (p2 != 1), 1 - t2, p2)
  assert (metrics.f1_score_with_invalid(t2, p2)["f1"]
          == pytest.approx(100 * sklearn_metrics.f1_score(t2, p_fixed), abs=1e-9))
  t3, p3 = rng.integers(0, 3, 40), rng.integers(-1, 3, 40)
  assert metrics.matthews_corrcoef(t3.tolist(), p3.tolist())["matthews_corrcoef"] == pytest.approx(
      100 * sklearn_metrics.matthews_corrcoef(t3, p3), abs=1e-9)
  assert metrics.mean_multiclass_f1(3)(t3, p3)["mean_3class_f1"] == pytest.approx(
      100 * sklearn_metrics.fbeta_score(t3, p3, beta=1, labels=range(3), average="macro",
                                        zero_division=0), abs=1e-9)
  x, y = rng.normal(size=30), rng.normal(size=30)
  assert (metrics.pearson_corrcoef(x, y)["pearson_corrcoef"]
          == pytest.approx(100 * scipy.stats.pearsonr(x, y)[0], abs=1e-9))
