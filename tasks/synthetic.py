"""Synthetic tasks made locally (no downloads) for smoke runs and trainer tests.

They use seqio's ByteVocabulary (no vocabulary file needed) and a deterministic generator, so
any machine can train and evaluate on them. Import this module explicitly
(MIXTURE_OR_TASK_MODULE='tasks.synthetic').

  spot_synthetic_sentiment_v100  inputs "sentiment: <5 words>", targets "positive" | "negative"
                                 (the majority polarity of the words), metric accuracy.
  spot_synthetic_parity_v100     inputs "parity: <bits>", targets "even" | "odd", accuracy.
"""
from __future__ import annotations

import functools

import numpy as np
import seqio
import tensorflow as tf

POSITIVE = ("good", "great", "fine", "nice", "superb", "happy", "lovely", "bright")
NEGATIVE = ("bad", "awful", "poor", "sad", "grim", "ugly", "dull", "nasty")
SPLIT_SIZES = {"train": 4096, "validation": 128, "test": 128}
_SPLIT_SEEDS = {"train": 0, "validation": 1, "test": 2}

VOCABULARY = seqio.ByteVocabulary()
OUTPUT_FEATURES = {
    "inputs": seqio.Feature(VOCABULARY, add_eos=True, required=True),
    "targets": seqio.Feature(VOCABULARY, add_eos=True),
}


def accuracy(targets, predictions) -> dict[str, float]:
  """Exact-match accuracy in percent."""
  if len(targets) != len(predictions):
    raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
  return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions)]))}


def sentiment_examples(split: str) -> tuple[list[str], list[str]]:
  rng = np.random.RandomState(_SPLIT_SEEDS[split])
  inputs, targets = [], []
  for _ in range(SPLIT_SIZES[split]):
    n_pos = rng.randint(0, 6)
    words = list(rng.choice(POSITIVE, n_pos)) + list(rng.choice(NEGATIVE, 5 - n_pos))
    rng.shuffle(words)
    inputs.append("sentiment: " + " ".join(words))
    targets.append("positive" if n_pos >= 3 else "negative")
  return inputs, targets


def parity_examples(split: str) -> tuple[list[str], list[str]]:
  rng = np.random.RandomState(100 + _SPLIT_SEEDS[split])
  inputs, targets = [], []
  for _ in range(SPLIT_SIZES[split]):
    bits = rng.randint(0, 2, size=rng.randint(1, 9))
    inputs.append("parity: " + "".join(str(b) for b in bits))
    targets.append("odd" if bits.sum() % 2 else "even")
  return inputs, targets


def _dataset_fn(split: str, shuffle_files: bool, seed=None, *, generator) -> tf.data.Dataset:
  del shuffle_files, seed
  inputs, targets = generator(split)
  return tf.data.Dataset.from_tensor_slices({"inputs": inputs, "targets": targets})


def _register(name: str, generator) -> None:
  if name in seqio.TaskRegistry.names():
    return
  seqio.TaskRegistry.add(
      name,
      source=seqio.FunctionDataSource(functools.partial(_dataset_fn, generator=generator),
                                      splits=tuple(SPLIT_SIZES),
                                      num_input_examples=dict(SPLIT_SIZES)),
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
      output_features=OUTPUT_FEATURES,
      metric_fns=[accuracy])


_register("spot_synthetic_sentiment_v100", sentiment_examples)
_register("spot_synthetic_parity_v100", parity_examples)
if "spot_synthetic_mix_v100" not in seqio.MixtureRegistry.names():
  seqio.MixtureRegistry.add("spot_synthetic_mix_v100",
                            ["spot_synthetic_sentiment_v100", "spot_synthetic_parity_v100"],
                            default_rate=seqio.mixing_rate_num_examples)
