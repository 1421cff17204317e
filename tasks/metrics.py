"""T5's evaluation metrics, in seqio's form `metric(targets, predictions) -> dict`.

Every value is on T5's 0-100 scale and the dict keys are T5's ("accuracy", "f1",
"matthews_corrcoef", "pearson_corrcoef", "spearman_corrcoef", "mean_3class_f1",
"exact_match", "em"). Written with numpy/scipy only. Predictions that are not a
valid class arrive here as -1 (from the postprocessors) and count as wrong.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Any, Callable, Dict, Hashable, List, Sequence

import numpy as np
import scipy.stats

MetricFn = Callable[[Sequence[Any], Sequence[Any]], Dict[str, float]]


def _check_lengths(targets: Sequence[Any], predictions: Sequence[Any]) -> None:
  if len(targets) != len(predictions):
    raise ValueError(f"got {len(targets)} targets but {len(predictions)} predictions; they "
                     "must match")


def accuracy(targets: Sequence[Any], predictions: Sequence[Any]) -> Dict[str, float]:
  """Percentage of predictions equal to their target."""
  _check_lengths(targets, predictions)
  return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions)]))}


def _binary_f1(targets: np.ndarray, predictions: np.ndarray, positive: int = 1) -> float:
  tp = np.sum((predictions == positive) & (targets == positive))
  fp = np.sum((predictions == positive) & (targets != positive))
  fn = np.sum((predictions != positive) & (targets == positive))
  denominator = 2 * tp + fp + fn
  return float(2 * tp / denominator) if denominator else 0.0


def f1_score_with_invalid(targets: Sequence[int], predictions: Sequence[int]) -> Dict[str, float]:
  """Binary F1 of class 1; any prediction other than 0 or 1 counts as wrong."""
  _check_lengths(targets, predictions)
  targets = np.asarray(targets, dtype=np.int64)
  predictions = np.asarray(predictions, dtype=np.int64).copy()
  invalid = (predictions != 0) & (predictions != 1)
  predictions[invalid] = 1 - targets[invalid]
  return {"f1": 100.0 * _binary_f1(targets, predictions)}


def matthews_corrcoef(targets: Sequence[int], predictions: Sequence[int]) -> Dict[str, float]:
  """Matthews correlation (multiclass form, 0 when undefined), times 100."""
  _check_lengths(targets, predictions)
  labels = sorted(set(targets) | set(predictions))
  index = {label: i for i, label in enumerate(labels)}
  confusion = np.zeros((len(labels), len(labels)), dtype=np.float64)
  for t, p in zip(targets, predictions):
    confusion[index[t], index[p]] += 1
  true_counts, pred_counts = confusion.sum(axis=1), confusion.sum(axis=0)
  correct, total = np.trace(confusion), confusion.sum()
  covariance = correct * total - true_counts @ pred_counts
  denominator = np.sqrt((total ** 2 - pred_counts @ pred_counts)
                        * (total ** 2 - true_counts @ true_counts))
  return {"matthews_corrcoef": 100.0 * float(covariance / denominator) if denominator else 0.0}


def pearson_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> Dict[str, float]:
  _check_lengths(targets, predictions)
  return {"pearson_corrcoef": 100.0 * float(scipy.stats.pearsonr(targets, predictions)[0])}


def spearman_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> Dict[str, float]:
  _check_lengths(targets, predictions)
  return {"spearman_corrcoef": 100.0 * float(scipy.stats.spearmanr(targets, predictions)[0])}


def mean_multiclass_f1(num_classes: int) -> MetricFn:
  """Macro F1 over classes 0..num_classes-1 (invalid predictions match no class)."""

  def metric(targets: Sequence[int], predictions: Sequence[int]) -> Dict[str, float]:
    _check_lengths(targets, predictions)
    t, p = np.asarray(targets), np.asarray(predictions)
    f1s = [_binary_f1(t, p, positive=c) for c in range(num_classes)]
    return {f"mean_{num_classes}class_f1": 100.0 * float(np.mean(f1s))}

  metric.__name__ = f"mean_{num_classes}class_f1"
  return metric


def all_match(targets: Sequence[Any], predictions: Sequence[Any]) -> Dict[str, float]:
  """100 when every prediction equals its target, else 0."""
  return {"exact_match": 100.0 * float(list(targets) == list(predictions))}


def mean_group_metric(metric_fn: MetricFn, group_key: str = "group",
                      value_key: str = "value") -> MetricFn:
  """Averages `metric_fn` over groups of {group, value} targets (e.g. MultiRC questions)."""

  def metric(targets: Sequence[Dict[str, Any]],
             predictions: Sequence[Dict[str, Any]]) -> Dict[str, float]:
    _check_lengths(targets, predictions)
    groups: Dict[Hashable, tuple] = collections.OrderedDict()
    for t, p in zip(targets, predictions):
      group_targets, group_predictions = groups.setdefault(t[group_key], ([], []))
      group_targets.append(t[value_key])
      group_predictions.append(p[value_key])
    scores: Dict[str, List[float]] = collections.defaultdict(list)
    for group_targets, group_predictions in groups.values():
      for name, value in metric_fn(group_targets, group_predictions).items():
        scores[name].append(value)
    return {name: float(np.mean(values)) for name, values in scores.items()}

  return metric


def deduplicate_metric(metric_fn: MetricFn, group_key: str = "group",
                       value_key: str = "value") -> MetricFn:
  """Keeps the first {group, value} example of each group, then applies `metric_fn` (ReCoRD)."""

  def metric(targets: Sequence[Dict[str, Any]],
             predictions: Sequence[Dict[str, Any]]) -> Dict[str, float]:
    _check_lengths(targets, predictions)
    seen, kept_targets, kept_predictions = set(), [], []
    for t, p in zip(targets, predictions):
      if t[group_key] in seen:
        continue
      seen.add(t[group_key])
      kept_targets.append(t[value_key])
      kept_predictions.append(p[value_key])
    return metric_fn(kept_targets, kept_predictions)

  return metric


def multirc_f1_over_all_answers(targets: Sequence[Dict[str, Any]],
                                predictions: Sequence[Dict[str, Any]]) -> Dict[str, float]:
  """MultiRC F1a: F1 with invalid predictions over every answer option."""
  return f1_score_with_invalid([t["value"] for t in targets], [p["value"] for p in predictions])


multirc_exact_match = mean_group_metric(all_match)
multirc_exact_match.__name__ = "multirc_exact_match"


def normalize_squad(text: str) -> str:
  """SQuAD v1.1 normalisation: lower case, drop punctuation and articles, squeeze spaces."""
  text = text.lower()
  text = "".join(ch for ch in text if ch not in set(string.punctuation))
  text = re.sub(r"\b(a|an|the)\b", " ", text)
  return " ".join(text.split())


def _token_f1(target: str, prediction: str) -> float:
  prediction_tokens, target_tokens = prediction.split(), target.split()
  common = collections.Counter(prediction_tokens) & collections.Counter(target_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision, recall = num_same / len(prediction_tokens), num_same / len(target_tokens)
  return 2 * precision * recall / (precision + recall)


def squad(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> Dict[str, float]:
  """SQuAD exact match and token F1, each the max over a question's answers."""
  _check_lengths(targets, predictions)
  em, f1 = [], []
  for answers, prediction in zip(targets, predictions):
    answers = [normalize_squad(a) for a in answers]
    prediction = normalize_squad(prediction)
    em.append(max(float(a == prediction) for a in answers))
    f1.append(max(_token_f1(a, prediction) for a in answers))
  return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1))}


record_metric = deduplicate_metric(squad)
record_metric.__name__ = "record_squad"
