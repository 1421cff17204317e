"""A seqio task built in tests from local TSV files (byte vocabulary: nothing to download)."""
from __future__ import annotations

import pathlib

import numpy as np
import seqio

WORDS_POS = ("good", "great", "fine", "nice")
WORDS_NEG = ("bad", "awful", "poor", "sad")


def write_tsv_task_files(folder: pathlib.Path, n_train: int = 512,
                         n_val: int = 32) -> dict[str, str]:
  """Writes train/validation TSVs of "words<TAB>label" and returns their paths by split."""
  folder.mkdir(parents=True, exist_ok=True)
  rng = np.random.RandomState(0)
  paths = {}
  for split, n in (("train", n_train), ("validation", n_val)):
    lines = []
    for _ in range(n):
      positive = bool(rng.randint(2))
      words = rng.choice(WORDS_POS if positive else WORDS_NEG, 4)
      lines.append(f"{' '.join(words)}\t{'yes' if positive else 'no'}")
    path = folder / f"{split}.tsv"
    path.write_text("\n".join(lines) + "\n")
    paths[split] = str(path)
  return paths


def register_tsv_task(name: str, paths: dict[str, str]) -> str:
  """Registers (once) a seqio task reading `paths`; returns its name."""
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  vocab = seqio.ByteVocabulary()

  def parse(line):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    fields = tf.strings.split(line, "\t")
    return {"inputs": tf.strings.join(["polarity: ", fields[0]]), "targets": fields[1]}

  def accuracy(targets, predictions):
    return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions)]))}

  seqio.TaskRegistry.add(
      name,
      source=seqio.TextLineDataSource(paths, num_input_examples={
          s: sum(1 for _ in open(p)) for s, p in paths.items()}),
      preprocessors=[seqio.map_over_dataset(parse), seqio.preprocessors.tokenize,
                     seqio.preprocessors.append_eos_after_trim],
      output_features={"inputs": seqio.Feature(vocab, add_eos=True),
                       "targets": seqio.Feature(vocab, add_eos=True)},
      metric_fns=[accuracy])
  return name
