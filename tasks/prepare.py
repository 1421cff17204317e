"""Write a TFDS dataset from examples you already have, without any download.

`write_tfds_dataset("glue/rte:2.0.0", data_dir, {"validation": [...]})` writes
the TFRecord shards and `dataset_info.json` that `tfds build` would have
written, using the installed TFDS builder's own feature specification, so the
result is read back by the TFDS-backed tasks exactly like a downloaded one.
Use it for hand-made test data or to convert a copy of a dataset you obtained
by other means.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import tensorflow as tf
import tensorflow_datasets as tfds

from tasks import sources


def write_tfds_dataset(tfds_name: str, data_dir: str,
                       splits: Mapping[str, Iterable[Mapping[str, Any]]]) -> str:
  """Prepares `tfds_name` under `data_dir` from in-memory examples.

  Args:
    tfds_name: "name/config:version", a builder of the installed TFDS.
    data_dir: the TFDS data_dir to write into.
    splits: split name -> examples, each a dict in the builder's feature layout
      (e.g. {"sentence1": "...", "sentence2": "...", "label": 0, "idx": 3}).

  Returns:
    The dataset directory, `<data_dir>/<name>/<config>/<version>`.
  """
  name, config, version = sources.parse_tfds_name(tfds_name)
  # The builder is only used for its feature spec and directory layout; building it
  # needs no network since its dataset_info.json is not looked up remotely (GCS off).
  builder = tfds.builder(f"{name}/{config}" if config else name, version=version, data_dir=data_dir)
  features = builder.info.features
  out_dir = builder.data_dir
  os.makedirs(out_dir, exist_ok=True)
  for split, examples in splits.items():
    path = os.path.join(out_dir, f"{name}-{split}.tfrecord-00000-of-00001")
    with tf.io.TFRecordWriter(path) as writer:
      for example in examples:
        writer.write(features.serialize_example(example))
  tfds.folder_dataset.write_metadata(data_dir=out_dir, features=features, check_data=False)
  return out_dir
