"""The evaluation features of a decoder-only model: seqio's encoder-decoder features plus the
validity of every position, recorded before padding (every id is a token: Llama 3's "!" is 0).

  encoder_input_tokens [T], decoder_target_tokens / decoder_input_tokens [S]  seqio's, padded
  encoder_input_valid [T], decoder_target_valid [S] int32                     1 at the tokens
  decoder_loss_weights [S]                                                    = the target's

Unpacked only (seqio's evaluator refuses packing). T5 keeps seqio's `EncDecFeatureConverter`:
its vocabularies reserve id 0 for padding.
"""
from __future__ import annotations

import functools
from typing import Any

VALID_FEATURES = ("encoder_input_valid", "decoder_target_valid")


@functools.lru_cache(maxsize=None)
def _converter_class() -> type:
  import seqio  # pylint: disable=g-import-not-at-top  (seqio imports TensorFlow)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  base = seqio.EncDecFeatureConverter
  spec = seqio.FeatureConverter.FeatureSpec(dtype=tf.int32)
  marks = {"inputs": "inputs_valid", "targets": "targets_valid"}

  class ValidityFeatureConverter(base):
    """`EncDecFeatureConverter` (pack=False) whose rows also carry their validity."""
    MODEL_FEATURES = {**base.MODEL_FEATURES, **{k: spec for k in VALID_FEATURES}}

    def _convert_features(self, ds, task_feature_lengths):
      ds = ds.map(lambda ex: {**ex, **{v: tf.ones_like(ex[k], tf.int32)
                                       for k, v in marks.items()}})
      lengths = {**task_feature_lengths,
                 **{v: task_feature_lengths[k] for k, v in marks.items()}}
      ds = self._pack_or_pad(ds, lengths)  # trims and pads the marks as the tokens

      def convert(ex):
        out = dict(self._convert_example(ex))
        out["encoder_input_valid"] = ex["inputs_valid"]
        out["decoder_target_valid"] = ex["targets_valid"]
        out["decoder_loss_weights"] = ex["targets_valid"]  # "!" (id 0) is scored too
        return out
      return ds.map(convert, num_parallel_calls=tf.data.experimental.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths):
      lengths = dict(super().get_model_feature_lengths(task_feature_lengths))
      lengths["encoder_input_valid"] = task_feature_lengths["inputs"]
      lengths["decoder_target_valid"] = task_feature_lengths["targets"]
      return lengths

  return ValidityFeatureConverter


def feature_converter(decoder_only: bool) -> Any:
  """seqio's evaluation feature converter for a model of that kind (unpacked)."""
  if decoder_only:
    return _converter_class()(pack=False)
  import seqio  # pylint: disable=g-import-not-at-top
  return seqio.EncDecFeatureConverter(pack=False)
