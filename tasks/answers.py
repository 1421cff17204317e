"""Answers extracted from generated text, and exact match on them (evaluation by generation).

An extractor is a regular expression: the answer is its last match in the text (group 1 when
the pattern has a group, else the whole match), stripped; no match: no answer, counted wrong.
`GSM8K` is built in: the number after the last `#### ` (GSM8K's references) or `The answer is`
(MetaMathQA's), as PEFT's MetaMathQA benchmark reads them. A number is compared by value:
`1,000`, `1000.00` and `$1000` are the same answer; anything else as text.

  extractor = answers.extractor("gsm8k")           # or a pattern: r"Answer: (\\w+)"
  extractor("... so she has 18 eggs.\\n#### 18")   # -> "18"
  answers.exact_match(["18", "7"], ["18.0", None])  # -> {"exact_match": 50.0}
"""
from __future__ import annotations

import decimal
import re
from typing import Any, Callable, Dict, Optional, Sequence

from spot_jax.errors import ConfigError
from tasks import postprocessors

# The built-in extractors by name. GSM8K: PEFT's delimiters (utils.parse_answer), then a number.
BUILT_IN = {
    "gsm8k": r"(?:####|[Tt]he (?:final )?answer is:?)\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?"
             r"(?:\s*/\s*[0-9]+)?)",
}
_NUMBER = re.compile(r"^\$?(-?[0-9][0-9,]*(?:\.[0-9]+)?)(?:\s*/\s*([0-9]+))?%?$")


def compile_pattern(answer: str) -> re.Pattern:
  """The regular expression of `answer`: a built-in name or a pattern with at most one group."""
  if not isinstance(answer, str) or not answer:
    raise ConfigError(f"answer={answer!r}; give a built-in extractor ({', '.join(BUILT_IN)}) or "
                      "a regular expression whose group 1 is the answer")
  try:
    pattern = re.compile(BUILT_IN.get(answer, answer))
  except re.error as e:
    raise ConfigError(f"answer={answer!r} is not a regular expression ({e}); give a built-in "
                      f"extractor ({', '.join(BUILT_IN)}) or a valid pattern") from None
  if pattern.groups > 1:
    raise ConfigError(f"answer={answer!r} has {pattern.groups} groups; give one group around "
                      "the answer (use (?:...) for the others)")
  return pattern


def normalize(answer: Optional[str]) -> Optional[str]:
  """A number as its value's canonical text (`1,000.50` -> `1000.5`, `6/4` -> `1.5`), else the
  stripped text; None stays None."""
  if answer is None:
    return None
  text = answer.strip().rstrip(".")
  match = _NUMBER.match(text)
  if not match:
    return text
  try:
    value = decimal.Decimal(match.group(1).replace(",", ""))
    if match.group(2) is not None:
      value = value / decimal.Decimal(match.group(2))
  except (decimal.InvalidOperation, decimal.DivisionByZero):
    return text
  value = value.normalize()
  return format(value if value != 0 else decimal.Decimal(0), "f")


def extractor(answer: str) -> Callable[[str], Optional[str]]:
  """text -> the normalized answer (the pattern's last match), or None when nothing matches."""
  pattern = compile_pattern(answer)

  def extract(text: str) -> Optional[str]:
    found = None
    for found in pattern.finditer(text):
      pass
    if found is None:
      return None
    return normalize(found.group(1) if pattern.groups else found.group(0))
  return extract


def postprocessor(answer: str) -> Callable[..., Optional[str]]:
  """A seqio postprocess_fn: decoded text (or a target) -> its extracted answer."""
  extract = extractor(answer)

  def postprocess(output: Any, example=None, is_target: bool = False) -> Optional[str]:
    del example, is_target
    return extract(postprocessors.as_text(output))
  return postprocess


def exact_match(targets: Sequence[Optional[str]],
                predictions: Sequence[Optional[str]]) -> Dict[str, float]:
  """Percentage of examples whose extracted prediction equals the extracted target; an example
  without an answer on either side counts wrong."""
  if len(targets) != len(predictions):
    raise ValueError(f"got {len(targets)} targets but {len(predictions)} predictions")
  if not targets:
    return {"exact_match": 0.0}
  hits = sum(t is not None and t == p for t, p in zip(targets, predictions))
  return {"exact_match": 100.0 * hits / len(targets)}
