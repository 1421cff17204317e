"""Postprocessors turning decoded strings into metric inputs, as T5 does.

Each has seqio's signature `fn(output, example=None, is_target=False)`; on the
target side `example` is the task's preprocessed example (numpy values, bytes
for strings). Classification outputs map to class ids, -1 when the text is not
a label, so invalid predictions are counted wrong by the metrics.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

_WSC_DETERMINERS = frozenset({
    "a", "an", "few", "her", "his", "each", "every", "many", "much", "my", "our",
    "some", "that", "the", "their", "these", "this", "those", "which", "whose", "your"})


def as_text(value: Union[str, bytes]) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def string_to_float(output: Union[str, bytes], default: float = -1.0, **unused_kwargs) -> float:
  """Parses a float ("3.8"); text that is no number gives `default`."""
  try:
    return float(as_text(output))
  except ValueError:
    return default


def string_label_to_class_id(output: Union[str, bytes], label_classes: Sequence[str],
                             default: int = -1, **unused_kwargs) -> int:
  """Index of the label text in `label_classes`, or `default` when it is not a label."""
  text = as_text(output)
  return list(label_classes).index(text) if text in label_classes else default


def multirc(output: Union[str, bytes], example: Optional[Mapping[str, Any]] = None,
            is_target: bool = False) -> Dict[str, Any]:
  """{"value": class id of False/True}; targets also carry their question as "group"."""
  result: Dict[str, Any] = {"value": string_label_to_class_id(output, ("False", "True"))}
  if is_target:
    result["group"] = (int(example["idx/paragraph"]), int(example["idx/question"]))
  return result


def record(output: Union[str, bytes], example: Optional[Mapping[str, Any]] = None,
           is_target: bool = False) -> Dict[str, Any]:
  """Prediction: {"value": text}; target: every gold answer plus the (passage, query) group."""
  if is_target:
    return {"value": [as_text(a) for a in example["answers"]],
            "group": (int(example["idx/passage"]), int(example["idx/query"]))}
  return {"value": as_text(output)}


def qa(output: Union[str, bytes], example: Optional[Mapping[str, Any]] = None,
       is_target: bool = False) -> Union[str, List[str]]:
  """Prediction text, or for targets the list of every gold answer."""
  if is_target:
    return [as_text(a) for a in example["answers"]]
  return as_text(output)


def _wsc_clean(text: str) -> str:
  words = text.strip().lower().split(" ")
  return " ".join(w for w in words if w not in _WSC_DETERMINERS)


def wsc_simple(output: Union[str, bytes], example: Optional[Mapping[str, Any]] = None,
               is_target: bool = False) -> int:
  """1 if the predicted referent matches the candidate in the example, else 0.

  Targets are the example's True/False label. A prediction matches when, after
  lower-casing and dropping determiners, one word set contains the other and
  both or neither carry a possessive "'". An empty prediction gives -1.
  """
  if is_target:
    return int(example["label"])
  prediction = _wsc_clean(as_text(output))
  if not prediction:
    return -1
  referent = _wsc_clean(as_text(example["targets_pretokenized"]))
  if ("'" in prediction) != ("'" in referent):
    return 0
  prediction_words, referent_words = set(prediction.split(" ")), set(referent.split(" "))
  return int(prediction_words <= referent_words or referent_words <= prediction_words)
