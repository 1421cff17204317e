"""seqio's JSONLogger, writing the same files, with each example's input encoded once.

An evaluation writes `<task>-<step>.jsonl` in each run's eval/ folder: one line per example with
its input, target and the run's outputs. seqio's `JSONLogger` reads the cached dataset again and
encodes every input again for every run, which for the K runs of one task evaluated together is
K times the same work (about a quarter of a second per run of 200 examples on 2 CPU cores). This
subclass encodes a dataset's inputs once and keeps them while the dataset lives; the lines it
writes are seqio's, byte for byte (tests/train/test_eval_log.py compares both loggers' files).
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import weakref
from typing import Any, Mapping, Optional, Sequence

import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

# dataset -> (the encoder class, its examples' "input" objects encoded as JSON)
_ENCODED: "weakref.WeakKeyDictionary[Any, tuple[type, list[str]]]" = weakref.WeakKeyDictionary()


def _encoded_inputs(dataset, encoder: type[json.JSONEncoder]) -> list[str]:
  try:
    cached = _ENCODED.get(dataset)
  except TypeError:  # not weakly referable: encode every time
    cached = None
  if cached is not None and cached[0] is encoder:
    return cached[1]
  encoded = []
  for example in tfds.as_numpy(dataset):
    for key in example:  # tfds.as_numpy leaves ragged tensors as they are (as seqio does)
      if isinstance(example[key], tf.RaggedTensor):
        example[key] = example[key].numpy()
    encoded.append(json.dumps(example, cls=encoder))
  try:
    _ENCODED[dataset] = (encoder, encoded)
  except TypeError:
    pass
  return encoded


class JSONLogger(seqio.JSONLogger):
  """`seqio.JSONLogger` (metrics and per-example outputs, the same files) for many runs."""

  def __call__(self, task_name: str, step: Optional[int],
               metrics: Mapping[str, Any], dataset: Optional[tf.data.Dataset],
               inferences: Optional[Mapping[str, Sequence[Any]]],
               targets: Optional[Sequence[Any]]) -> None:
    # the metrics file as seqio writes it (its inference part is skipped without a dataset)
    super().__call__(task_name=task_name, step=step, metrics=metrics, dataset=None,
                     inferences=None, targets=None)
    if self._write_n_results == 0 or not inferences or not targets or not dataset:
      return
    step = -1 if step is None else step
    encoder = self._json_encoder_cls
    path = os.path.join(self.output_dir, f"{task_name}-{step:06}.jsonl")
    inference_types = [t for t in inferences if t != "aux_value"]
    aux = inferences.get("aux_value", {})
    rows = itertools.zip_longest(_encoded_inputs(dataset, encoder), targets,
                                 *[inferences.get(t) for t in inference_types])
    if self._write_n_results:
      rows = itertools.islice(rows, 0, self._write_n_results)
    fields = ["target"] + inference_types
    with tf.io.gfile.GFile(path, "w") as f:
      for index, (encoded_input, *results) in enumerate(rows):
        if encoded_input is None:
          continue
        parts = ['"input": ' + encoded_input]
        named = list(zip(fields, results))
        named += [(f"aux_{name}", aux[name][index]) for name in aux]
        for name, value in named:
          try:
            parts.append(json.dumps(name) + ": " + json.dumps(value, cls=encoder))
          except TypeError:
            logging.warning("`%s` is not JSON serializable", name, exc_info=True)
        f.write("{" + ", ".join(parts) + "}\n")
