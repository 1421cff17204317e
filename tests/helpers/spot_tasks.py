"""Tiny local seqio tasks for the SPoT-layer tests (byte vocabulary, nothing to download).

Import registers them (MIXTURE_OR_TASK_MODULE='tests.helpers.spot_tasks'). Two families share their
inputs' structure: sentiment-like tasks (majority polarity of words) and parity-like tasks
(parity of a bit string); a third, "length", labels a word list short or long.

  spot_test_sentiment_v1   "sentiment: <words>" -> yes | no
  spot_test_review_v1      "review: <words>"    -> yes | no     (a sentiment relative)
  spot_test_parity_v1      "parity: <bits>"     -> even | odd
  spot_test_bits_v1        "bits: <bits>"       -> even | odd   (a parity relative)
  spot_test_length_v1      "length: <words>"    -> short | long
"""
from __future__ import annotations

import functools

import numpy as np
import seqio
import tensorflow as tf

POSITIVE = ("good", "great", "fine", "nice")
NEGATIVE = ("bad", "awful", "poor", "sad")
SPLIT_SIZES = {"train": 256, "validation": 32}
_SEEDS = {"train": 0, "validation": 1}
VOCABULARY = seqio.ByteVocabulary()
FEATURES = {"inputs": seqio.Feature(VOCABULARY, add_eos=True, required=True),
            "targets": seqio.Feature(VOCABULARY, add_eos=True)}


def accuracy(targets, predictions) -> dict[str, float]:
  """Exact match, and char_match: the share of target characters the prediction has in place
  (graded, so even barely trained test models get distinct, non-zero scores)."""
  def chars(t, p):
    return sum(a == b for a, b in zip(t, p)) / max(len(t), 1)
  return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions)])),
          "char_match": 100.0 * float(np.mean([chars(t, p) for t, p in zip(targets, predictions)]))}


def _sentiment(prefix: str, rng: np.random.RandomState) -> tuple[str, str]:
  n_pos = rng.randint(0, 4)
  words = list(rng.choice(POSITIVE, n_pos)) + list(rng.choice(NEGATIVE, 3 - n_pos))
  rng.shuffle(words)
  return f"{prefix}: {' '.join(words)}", "yes" if n_pos >= 2 else "no"


def _parity(prefix: str, rng: np.random.RandomState) -> tuple[str, str]:
  bits = rng.randint(0, 2, size=rng.randint(1, 7))
  return f"{prefix}: {''.join(map(str, bits))}", "odd" if bits.sum() % 2 else "even"


def _length(prefix: str, rng: np.random.RandomState) -> tuple[str, str]:
  n = rng.randint(1, 6)
  return f"{prefix}: {' '.join(rng.choice(POSITIVE + NEGATIVE, n))}", "long" if n >= 3 else "short"


TASKS = {
    "spot_test_sentiment_v1": (_sentiment, "sentiment", 0),
    "spot_test_review_v1": (_sentiment, "review", 10),
    "spot_test_parity_v1": (_parity, "parity", 20),
    "spot_test_bits_v1": (_parity, "bits", 30),
    "spot_test_length_v1": (_length, "length", 40),
}


def _dataset_fn(split, shuffle_files, seed=None, *, name):
  del shuffle_files, seed
  make, prefix, offset = TASKS[name]
  rng = np.random.RandomState(offset + _SEEDS[split])
  pairs = [make(prefix, rng) for _ in range(SPLIT_SIZES[split])]
  return tf.data.Dataset.from_tensor_slices({"inputs": [p[0] for p in pairs],
                                             "targets": [p[1] for p in pairs]})


for _name in TASKS:
  if _name not in seqio.TaskRegistry.names():
    seqio.TaskRegistry.add(
        _name,
        source=seqio.FunctionDataSource(functools.partial(_dataset_fn, name=_name),
                                        splits=tuple(SPLIT_SIZES),
                                        num_input_examples=dict(SPLIT_SIZES)),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
        output_features=FEATURES, metric_fns=[accuracy])
